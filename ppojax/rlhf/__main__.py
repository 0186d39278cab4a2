"""``python -m ppojax.rlhf [--seed N] [--<field> VALUE ...]``: the whole RLHF pipeline.

Every ``RLHFConfig`` field is an option (``--ppo-steps 100``, ``--kl-coef 0.1``,
``--adaptive-kl true``); the run prints one line per stage and the table of PPO metrics.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence

import jax

from ppojax.rlhf.config import RLHFConfig
from ppojax.rlhf.pipeline import run_pipeline


def parse_bool(text: str) -> bool:
    """true/false, 1/0 or yes/no, any case."""
    lowered = text.lower()
    if lowered not in ("true", "false", "1", "0", "yes", "no"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return lowered in ("true", "1", "yes")


def build_parser() -> argparse.ArgumentParser:
    """--seed plus one option per RLHFConfig field (unset options keep the default)."""
    parser = argparse.ArgumentParser(
        prog="python -m ppojax.rlhf", description="SFT -> reward model -> PPO on a sorting task."
    )
    parser.add_argument("--seed", type=int, default=0)
    for field in dataclasses.fields(RLHFConfig):
        kind = type(field.default)
        parser.add_argument(
            "--" + field.name.replace("_", "-"),
            dest=field.name,
            type=parse_bool if kind is bool else kind,
            default=None,
            help=f"default {field.default!r}",
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, build the config (ValueError names a bad field) and run the pipeline."""
    args = vars(build_parser().parse_args(argv))
    seed = args.pop("seed")
    config = RLHFConfig(**{name: value for name, value in args.items() if value is not None})
    run_pipeline(config, jax.random.key(seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
