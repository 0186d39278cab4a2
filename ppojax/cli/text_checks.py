"""The checks of ``ppojax sft | rm | dpo | rlhf --model``'s flags: each named as its flag, not
as a config field, a count that is not > 0 and flags given beside ``--resume``; each failure a
``ValueError`` whose text is the one line the command prints. The checks of what the flags
name (a reward, a folder, the data) are ``ppojax.runs.lm.text_checks``'. ``is_model_run``
tells ``ppojax rlhf`` whether its arguments (or the folder they resume) are the model form's."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path

from ppojax.checks import ConfigError, as_flag, check_positive_int, check_range

# Flags that take an int > 0 (the optional ones when given).
POSITIVE_INT_FLAGS = ("steps", "batch_size", "checkpoint_every", "max_len", "max_response_len")
POSITIVE_INT_FLAGS += ("sample_every", "devices")


def check_flags(args: argparse.Namespace) -> None:
    """``ValueError`` naming the flag for a count that is not > 0, a --learning-rate (sft,
    rm, dpo; rlhf's is RLHFConfig's) or dpo --beta that is not > 0, a negative --held-out."""
    try:
        for name in POSITIVE_INT_FLAGS:
            value = getattr(args, name, None)
            if value is not None or name in ("steps", "batch_size", "checkpoint_every"):
                check_positive_int("flag", name, value)
        for name in ("learning_rate", "beta"):
            if getattr(args, name, None) is not None:  # rlhf's unset: RLHFConfig's default
                check_range("flag", name, getattr(args, name), 0.0, math.inf, open_low=True)
        if hasattr(args, "held_out"):
            check_range("flag", "held_out", args.held_out, 0.0, math.inf, open_low=False)
    except ConfigError as error:
        raise as_flag(error, "flag") from None


# What --resume takes beside it: how to show the run, not what it trains.
RESUME_FLAGS = ("resume", "no_progress", "no_compile_cache")


def check_resume_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``ValueError`` for settings given with --resume, which trains with its saved ones."""
    given = [
        "--" + name.replace("_", "-")
        for name, value in vars(args).items()
        if name not in RESUME_FLAGS and value != parser.get_default(name)
    ]
    if given:
        raise ValueError(
            "--resume continues a run with the settings in its config.json; drop "
            + ", ".join(given)
        )


def is_model_run(argv: Sequence[str]) -> bool:
    """Whether ``ppojax rlhf`` ``argv`` trains a model folder (``--model``, or ``--resume`` of
    such a run) rather than one of ``python -m ppojax.rlhf``'s built-in tasks."""
    from ppojax.runs import folder

    if "--model" in argv or any(word.startswith("--model=") for word in argv):
        return True
    if "--resume" in argv[:-1]:
        config = Path(argv[argv.index("--resume") + 1]) / folder.CONFIG_FILE
        try:
            return folder.read_json(config).get("command") == "rlhf"
        except (ValueError, AttributeError):
            return False
    return False
