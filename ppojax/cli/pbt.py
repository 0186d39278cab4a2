"""``ppojax pbt``: population-based training from the command line, into a run folder."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ppojax.cli.flags import add_cpu_flags
from ppojax.cli.values import DEFAULT_OUT, parse_int
from ppojax.ppo.config import PPOConfig


def add_pbt_parser(commands: Any, add_shared_flags: Callable[[Any], None]) -> Any:
    """``ppojax pbt``'s parser (returned); ``add_shared_flags`` adds the train command's
    config, env module and cache flags."""
    pbt = commands.add_parser(
        "pbt",
        help="population-based training: exploit and explore inside one compiled program",
        description="Train a population together; every --interval updates the worst members "
        "copy the state of the best and perturb its hyperparameters. The run folder holds "
        "pbt.csv (every member's hyperparameters per interval, and whom it copied) and pbt.png.",
    )
    pbt.add_argument("env_id", nargs="?", default=None, help="an env id (default CartPole-v1)")
    pbt.add_argument("--population", type=parse_int, default=8, help="members (default 8)")
    pbt.add_argument("--interval", type=parse_int, help="updates between exploit steps (required)")
    pbt.add_argument(
        "--search",
        type=parse_search_flag,
        nargs="+",
        metavar="FIELD=LOW:HIGH[:log]",
        help="a traced field's range, e.g. learning_rate=1e-4:3e-3:log ent_coef=0:0.05",
    )
    pbt.add_argument("--fraction", type=float, default=0.25, help="share replaced each time (0.25)")
    pbt.add_argument(
        "--explore",
        choices=("perturb", "resample"),
        default="perturb",
        help="x0.8/x1.25 of the copied values (default), or fresh draws within the bounds",
    )
    pbt.add_argument("--seed", type=parse_int, default=0, help="PRNG seed (default 0)")
    pbt.add_argument("--config", type=Path, help="JSON or TOML file of PPOConfig fields")
    pbt.add_argument(
        "--out", type=Path, default=Path(DEFAULT_OUT), help="folder for run folders (runs/)"
    )
    pbt.add_argument(
        "--checkpoint-every",
        type=parse_int,
        metavar="N",
        help="checkpoint the population every N updates, a multiple of --interval",
    )
    pbt.add_argument(
        "--keep-checkpoints",
        type=parse_int,
        default=3,
        metavar="N",
        help="newest checkpoints to keep, 0 for all (default 3)",
    )
    pbt.add_argument(
        "--resume",
        type=Path,
        metavar="RUN_DIR",
        help="continue the PBT run RUN_DIR from its last checkpoint, to the same result",
    )
    pbt.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_cpu_flags(pbt, "members")
    add_shared_flags(pbt)
    return pbt


def parse_search_flag(text: str) -> tuple[str, tuple[Any, ...]]:
    """``learning_rate=1e-4:3e-3:log`` -> ("learning_rate", (1e-4, 3e-3, "log"))."""
    name, separator, spec = text.partition("=")
    parts = spec.split(":")
    scale = parts.pop() if parts and parts[-1] in ("log", "linear") else "linear"
    try:
        low, high = (float(part) for part in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected FIELD=LOW:HIGH or FIELD=LOW:HIGH:log, got {text!r}"
        ) from None
    if not separator or not name:
        raise argparse.ArgumentTypeError(f"expected FIELD=LOW:HIGH[:log], got {text!r}")
    return name.strip().replace("-", "_"), (low, high, scale)


def run_pbt_command(
    args: argparse.Namespace,
    build_config: Callable[[argparse.Namespace], PPOConfig],
    wandb_options: Callable[[argparse.Namespace, Any], Any],
) -> int:
    """``ppojax pbt``: train the population of the config ``build_config`` gives (preset,
    --config, flags) into a new run folder, or continue --resume; print the best member.
    ``wandb_options(args, saved)``: the W&B options of --wandb and its flags (one W&B run
    per member), on --resume over the run's saved ones."""
    from ppojax.ppo.pbt import parse_search
    from ppojax.runs import folder
    from ppojax.runs.experiment import check_env
    from ppojax.runs.loggers import options_from_settings
    from ppojax.runs.options import RunOptions
    from ppojax.runs.pbt_folder import PBT_FILE, read_pbt_folder, resume_pbt, run_pbt

    progress = not args.no_progress
    if args.resume is not None:
        given = [name for name in ("interval", "search", "env_id", "config") if getattr(args, name)]
        if given:
            raise ValueError(
                "--resume continues a PBT run with its saved settings; drop "
                + ", ".join(f"--{name.replace('_', '-')}" for name in given)
            )
        config, settings = read_pbt_folder(args.resume)
        run_dir = args.resume
        saved = options_from_settings(run_dir / PBT_FILE, settings.get("wandb"))
        wandb = wandb_options(args, saved)
        print(f"resuming {run_dir}", flush=True)
        _, summary = resume_pbt(run_dir, progress=progress, wandb=wandb)
    else:
        if args.interval is None or not args.search:
            raise ValueError("pbt needs --interval and --search (or --resume RUN_DIR)")
        config = build_config(args)
        parse_search(config, dict(args.search))  # a bad search leaves no empty folder
        wandb = wandb_options(args, None)
        folder.check_out_dir(args.out)
        check_env(config)
        run_dir = folder.new_run_dir(args.out, config.env_id)
        print(f"run folder: {run_dir}", flush=True)
        _, summary = run_pbt(
            config,
            dict(args.search),
            args.population,
            args.interval,
            run_dir,
            seed=args.seed,
            fraction=args.fraction,
            explore_mode=args.explore,
            options=RunOptions(
                progress=progress,
                checkpoint_every=args.checkpoint_every,
                keep_checkpoints=args.keep_checkpoints or None,  # 0: keep all
                wandb=wandb,
            ),
        )
    best = summary["best_member"]
    values = ", ".join(f"{k}={v:.3g}" for k, v in summary["best_hyperparams_last_interval"].items())
    print(
        f"ppojax PBT on {config.env_id}: {summary['population']} members, compile "
        f"{summary['compile_seconds']:.1f} s, run {summary['run_seconds']:.1f} s"
    )
    print(f"best member {best}: final return {summary['best_final_return']:.1f} ({values})")
    print(f"run folder: {run_dir}")
    return 0
