"""The command line: ``ppojax train | sweep | eval | envs | rlhf``."""

from ppojax.cli.commands import main

__all__ = ["main"]
