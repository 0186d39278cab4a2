"""The flags the commands share: the PPOConfig fields, a run's seeds, folder, checkpoints and
output, W&B, env modules and the compilation cache."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from pathlib import Path

from ppojax.cli.values import (
    DEFAULT_OUT,
    annotation_parser,
    parse_cpu_devices,
    parse_cpu_threads,
    parse_int,
)
from ppojax.ppo.config import PPOConfig


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One ``--flag`` per PPOConfig field except env_id (the positional argument)."""
    from ppojax.runs.folder import RUN_FOLDER_DEFAULTS

    group = parser.add_argument_group(
        "PPOConfig fields (default: the env's preset, then the default shown here: "
        "PPOConfig's, or a run folder's where it differs)"
    )
    hints = typing.get_type_hints(PPOConfig)
    for field in dataclasses.fields(PPOConfig):
        if field.name == "env_id":
            continue
        default = RUN_FOLDER_DEFAULTS.get(field.name, field.default)
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        group.add_argument(
            f"--{field.name.replace('_', '-')}",
            dest=field.name,
            type=annotation_parser(hints[field.name]),
            default=None,
            metavar="VALUE",
            help=f"default {shown}",
        )


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    """Flags shared by train and sweep: seeds, config file, run folder, checkpoints, output."""
    parser.add_argument(
        "env_id",
        nargs="?",
        default=None,
        help="a gymnax id, an id registered by --env-module, or suite/name (default CartPole-v1)",
    )
    parser.add_argument("--seeds", type=parse_int, default=1, help="seeds trained at once (vmap)")
    parser.add_argument("--seed", type=parse_int, default=0, help="base PRNG seed (default 0)")
    parser.add_argument(
        "--config",
        type=Path,
        help="JSON or TOML file of PPOConfig fields, e.g. a run's config.json",
    )
    parser.add_argument(
        "--out", type=Path, default=Path(DEFAULT_OUT), help="folder for run folders (runs/)"
    )
    parser.add_argument(
        "--checkpoint-every", type=parse_int, metavar="N", help="checkpoint every N updates"
    )
    parser.add_argument(
        "--keep-checkpoints",
        type=parse_int,
        default=3,
        metavar="N",
        help="newest checkpoints to keep, 0 for all (default 3)",
    )
    parser.add_argument(
        "--resume",
        type=Path,
        metavar="RUN_DIR",
        help="continue RUN_DIR (a train or sweep run) from its last checkpoint",
    )
    add_env_module_flag(parser)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_cache_flag(parser)
    add_cpu_flags(parser, "runs (seeds x grid points)")
    parser.add_argument(
        "--tensorboard", action="store_true", help="also write TensorBoard event files"
    )
    add_wandb_flags(parser)
    add_config_flags(parser)


def add_cpu_flags(parser: argparse.ArgumentParser, runs: str) -> None:
    """--cpu-threads and --cpu-devices; ``runs`` names what is split over the devices."""
    parser.add_argument(
        "--cpu-threads",
        type=parse_cpu_threads,
        default="auto",
        metavar="N",
        help="threads XLA runs the program on, on CPU: a number, all (one per core), or auto "
        "(default: all where the runs are split over several CPU devices; else 1 for small "
        "MLP configs, which run fastest so, and all for the rest)",
    )
    parser.add_argument(
        "--cpu-devices",
        type=parse_cpu_devices,
        default="auto",
        metavar="N",
        help=f"CPU devices to split the {runs} over, each training its share: a number that "
        "divides them, or auto (default: the most, up to one per core, that divide them; one "
        "device where an accelerator is installed)",
    )


def add_shared_flags(parser: argparse.ArgumentParser) -> None:
    """The env-module, compile-cache and config flags, for commands beside train and sweep."""
    add_env_module_flag(parser)
    add_cache_flag(parser)
    add_config_flags(parser)


def add_wandb_flags(parser: argparse.ArgumentParser) -> None:
    """--wandb and where its runs go (see ppojax.runs.loggers)."""
    parser.add_argument(
        "--wandb", action="store_true", help="also log to Weights & Biases (one W&B run per run)"
    )
    parser.add_argument("--wandb-project", metavar="NAME", help="W&B project (default ppojax)")
    parser.add_argument("--wandb-entity", metavar="NAME", help="W&B entity (default: yours)")
    parser.add_argument(
        "--wandb-name", metavar="NAME", help="W&B group of the runs (default: the run folder's)"
    )


def add_repeatable(parser: argparse.ArgumentParser, flag: str, metavar: str, help: str) -> None:
    """A flag that may be given several times: the list of its values, [] when it is absent."""
    parser.add_argument(flag, action="append", default=[], metavar=metavar, help=help)


def add_env_module_flag(parser: argparse.ArgumentParser) -> None:
    add_repeatable(
        parser,
        "--env-module",
        metavar="MODULE",
        help="import MODULE (a module name such as mypackage.envs, or the path of a .py file) "
        "first, which registers envs with ppojax.register_env; repeatable; the run folder "
        "remembers where it is, so eval and --resume find it from any folder",
    )


def add_cache_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-compile-cache",
        action="store_true",
        help="compile every program afresh instead of loading it from the compilation cache "
        "($XDG_CACHE_HOME/ppojax; PPOJAX_NO_COMPILE_CACHE=1 does the same)",
    )


def use_compile_cache(args: argparse.Namespace) -> None:
    """Turn on JAX's persistent compilation cache unless the flag or variable says no."""
    from ppojax.runtime import cache

    if not getattr(args, "no_compile_cache", True) and not cache.disabled_by_environment():
        cache.enable_compile_cache()
