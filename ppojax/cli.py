"""The command line: ``ppojax train [ENV_ID] [--seeds N] [--<any PPOConfig field> VALUE]``."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ppojax.config import PRESETS, PPOConfig


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _parse_int(text: str) -> int:
    """Integers, also written as 5e5 or 500_000."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}")
    return int(value)


def _parse_sizes(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected sizes like 64,64, got {text!r}") from None


def _parse_optional_float(text: str) -> float | None:
    if text.lower() in ("none", "off"):
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or none, got {text!r}") from None


def _field_parser(field: dataclasses.Field) -> Any:
    if field.name == "hidden_sizes":
        return _parse_sizes
    if field.name == "vf_clip_eps":
        return _parse_optional_float
    default = field.default
    if isinstance(default, bool):
        return _parse_bool
    if isinstance(default, int):
        return _parse_int
    return type(default)


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One ``--flag`` per PPOConfig field except env_id (the positional argument)."""
    group = parser.add_argument_group("PPOConfig fields (defaults: the env's preset)")
    for field in dataclasses.fields(PPOConfig):
        if field.name == "env_id":
            continue
        group.add_argument(
            f"--{field.name.replace('_', '-')}",
            dest=field.name,
            type=_field_parser(field),
            default=None,
            metavar=field.name.upper(),
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ppojax", description="Proximal Policy Optimization on gymnax environments."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train a PPO agent and print its learning curve")
    train.add_argument("env_id", nargs="?", default="CartPole-v1", help="a gymnax env id")
    train.add_argument("--seeds", type=int, default=1, help="seeds trained at once with vmap")
    train.add_argument("--seed", type=int, default=0, help="base PRNG seed")
    add_config_flags(train)
    commands.add_parser("envs", help="list the environment ids that can be trained")
    return parser


def run_train(args: argparse.Namespace) -> int:
    import jax

    from ppojax.train import train

    overrides = {
        field.name: getattr(args, field.name)
        for field in dataclasses.fields(PPOConfig)
        if field.name != "env_id" and getattr(args, field.name) is not None
    }
    config = PPOConfig.preset(args.env_id, **overrides)
    if args.seeds < 1:
        raise ValueError(f"--seeds must be at least 1, got {args.seeds}")
    keys = jax.random.split(jax.random.key(args.seed), args.seeds)
    train_seeds = jax.jit(jax.vmap(train, in_axes=(None, 0)))
    start = time.perf_counter()
    compiled = train_seeds.lower(config, keys).compile()
    compile_seconds = time.perf_counter() - start
    start = time.perf_counter()
    out = jax.block_until_ready(compiled(config, keys))
    run_seconds = time.perf_counter() - start
    print_report(
        config, args.seeds, np.asarray(out.metrics["episode_return"]), compile_seconds, run_seconds
    )
    return 0


def print_report(
    config: PPOConfig, seeds: int, returns: np.ndarray, compile_s: float, run_s: float
) -> None:
    """Learning curve (mean over seeds at ten points) and final return per seed."""
    steps = seeds * config.num_updates * config.batch_size
    print(
        f"ppojax PPO on {config.env_id}: {seeds} seed(s) x {config.num_updates} updates "
        f"x {config.batch_size} steps"
    )
    print(f"compile {compile_s:.1f} s, run {run_s:.1f} s, {steps / run_s:,.0f} env steps/s")
    print(f"{'env steps':>12}  {'mean return':>12}")
    for update in np.linspace(0, config.num_updates - 1, 10).astype(int):
        window = returns[:, max(0, update - 9) : update + 1]
        mean = np.nanmean(window) if np.isfinite(window).any() else float("nan")
        print(f"{(update + 1) * config.batch_size:>12,}  {mean:>12.1f}")
    final = [np.nanmean(row[-10:]) if np.isfinite(row[-10:]).any() else np.nan for row in returns]
    print(
        "final return (mean of the last 10 updates) per seed:",
        " ".join(f"{value:.1f}" for value in final),
    )
    print(f"final return, mean over seeds: {np.nanmean(final):.1f}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "envs":
            from ppojax.envs import list_envs

            for env_id in list_envs():
                print(env_id + ("  (tuned preset)" if env_id in PRESETS else ""))
            return 0
        return run_train(args)
    except ValueError as error:
        parser.exit(2, f"ppojax: error: {error}\n")
    return 1


if __name__ == "__main__":
    sys.exit(main())
