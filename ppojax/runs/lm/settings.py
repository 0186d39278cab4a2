"""An LM command's settings as the config it trains with. ``rlhf_config`` is the one place
that builds a command's ``RLHFConfig``: from the flags of a fresh run (every form of ``ppojax
rlhf``) and from a run folder's config.json on ``--resume``; ``config_dict`` is what
config.json keeps of it."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ppojax.rlhf.core.config import RLHFConfig, stored_names


def add_folder_flags(parser: argparse.ArgumentParser) -> None:
    """The run folder's flags of the task and episode forms: where, how often a checkpoint, resume,
    the progress bar and the compilation cache."""
    parser.add_argument("--out", type=Path, default=Path("runs"), help="parent of run folders")
    parser.add_argument("--checkpoint-every", type=int, default=50, help="steps per chunk (50)")
    parser.add_argument("--resume", type=Path, metavar="RUN_DIR", help="continue a run folder")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--no-compile-cache",
        action="store_true",
        help="compile every program afresh instead of loading it from the compilation cache "
        "(PPOJAX_NO_COMPILE_CACHE=1 does the same)",
    )


def given_fields(args: argparse.Namespace, skip: Sequence[str]) -> dict[str, Any]:
    """The RLHFConfig fields given on the command line (``add_config_flags``' options; unset
    ones are None), but the ``skip`` fields, which the command fixes itself."""
    return {
        field.name: getattr(args, field.name)
        for field in dataclasses.fields(RLHFConfig)
        if field.name not in skip and getattr(args, field.name) is not None
    }


def rlhf_config(values: Mapping[str, Any], **fixed: Any) -> RLHFConfig:
    """The RLHFConfig of ``values`` (a command's chosen fields, or config.json's ``rlhf``:
    lists read back as tuples, a field stored under its old name by an older run folder,
    ``ppo_epochs`` or ``target_kl``, read as its field) with the ``fixed`` fields that the
    command sets itself (the tokenizer's or env's ids, a task's response length). A bad value
    is a ``ConfigError`` naming its field."""
    stored = stored_names(values)
    chosen = {k: tuple(v) if isinstance(v, list) else v for k, v in stored.items()}
    return RLHFConfig(**chosen, **fixed)


def config_dict(config: Any) -> dict[str, Any]:
    """A dataclass config as JSON-ready values (tuples as lists)."""
    return {
        field.name: list(value) if isinstance(value, tuple) else value
        for field in dataclasses.fields(config)
        for value in [getattr(config, field.name)]
    }
