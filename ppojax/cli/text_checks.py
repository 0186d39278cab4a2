"""The checks of ``ppojax sft | rm | dpo | rlhf --model``'s input that run before a run folder
is made: the flags (named as flags, not config fields), each ``--reward`` imported and tried
on the first prompts, a ``--resume`` folder and the flags given beside it, the batch against
the data and --devices. Each failure is a ``ValueError`` whose text is the one line the command
prints. ``is_model_run`` tells ``ppojax rlhf`` whether its arguments (or the folder they
resume) are the model form's."""

from __future__ import annotations

import argparse
import importlib
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ppojax.checks import ConfigError, check_positive_int, check_range

# Flags that take an int > 0 (the optional ones when given).
POSITIVE_INT_FLAGS = ("steps", "batch_size", "checkpoint_every", "max_len", "max_response_len")
POSITIVE_INT_FLAGS += ("sample_every", "devices")


def as_flag(error: ConfigError, owner: str) -> ValueError:
    """``error`` with ``owner.field`` said as the flag that set it (``--field-name``)."""
    flag = "--" + str(error.field).replace("_", "-")
    return ValueError(str(error).replace(f"{owner}.{error.field}", flag))


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


def load_reward(spec: str) -> Callable[..., Any]:
    """The function named by ``MODULE:FUNCTION``, MODULE imported from the current folder or
    PYTHONPATH; a ``ValueError`` saying what is wrong."""
    module_name, colon, name = spec.partition(":")
    if not colon or not module_name or not name:
        raise ValueError(f"--reward {spec!r}: give MODULE:FUNCTION, e.g. my_rewards:correct")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # a missing module, or one that fails while importing
        raise ValueError(
            f"--reward {spec}: cannot import {module_name!r} from the current folder or "
            f"PYTHONPATH ({type(error).__name__}: {error})"
        ) from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"--reward {spec}: {module.__file__} has no function {name!r}")
    return fn


# How many of the first prompts a reward is tried on before the step compiles.
TRIED = 4


def try_reward(
    spec: str, fn: Callable[..., Any], tokenizer: Any, prompts: Any, path: Path, length: int
) -> None:
    """Call the text reward ``fn`` once on the first prompts of ``path`` with random responses
    of ``length`` tokens, so that its errors and wrong returns (wrong length, non-numbers, NaN,
    inf) stop the run now as one line naming it and its file:line, not after compiling the
    step inside a callback's traceback."""
    import numpy as np

    from ppojax.rlhf.text_rewards import call_text_reward, fn_location

    count = min(TRIED, len(prompts.prompts))
    ids = np.random.default_rng(0).integers(0, tokenizer.rust.get_vocab_size(), (count, length))
    responses = [tokenizer.decode(list(row), skip_special_tokens=True) for row in ids]
    columns = {name: values[:count] for name, values in prompts.host.columns.items()}
    tried = f"on the first {count} prompts of {path} with random responses"
    try:
        call_text_reward(fn, prompts.prompts[:count], responses, columns)
    except Exception as error:
        where = fn_location(fn, error)
        raise ValueError(
            f"--reward {spec}{f' ({where})' if where else ''}: {type(error).__name__}: "
            f"{error} ({tried}); {REWARD_FIX}"
        ) from None


REWARD_FIX = (
    "fix it: a reward takes (prompts, responses, **columns) and returns one finite float per "
    "response"
)


class RewardCheck:
    """A ``checks`` hook of ``train_loop`` for the text rewards ``specs`` (``--reward``
    values, in the job's order) whose errors inside the compiled step land in ``failures``
    (``text_reward``): at the chunk holding the failed step (its ``rewards/<name>/mean``,
    ``names[i]`` for reward i, is NaN), a ``ValueError`` naming the reward, its FILE:LINE,
    the step and the fix, before the chunk is kept. A failure seen while an earlier chunk
    is checked belongs to the next one: the earlier chunk is whole and kept."""

    def __init__(
        self, specs: list[str], fns: list[Any], names: list[str], failures: list, run_dir: Path
    ) -> None:
        self.specs, self.fns, self.names = specs, fns, names
        self.failures, self.run_dir = failures, run_dir

    def __call__(self, first: int, state: Any, metrics: dict[str, Any]) -> None:
        import numpy as np

        if not self.failures:
            return
        fn, error, where = self.failures[0]
        same = [i for i, candidate in enumerate(self.fns) if candidate is fn]
        index = same[0] if same else 0  # the job's own functions: always found
        values = np.asarray(metrics[self.names[index]])[0]
        failed = np.flatnonzero(~np.isfinite(values))
        if not failed.size:
            return
        step = first + int(failed[0]) + 1
        kept = f"checkpoints/{first}" if first else "no checkpoint yet (it starts again at 0)"
        raise ValueError(
            f"--reward {self.specs[index]}{f' ({where})' if where else ''}: "
            f"{type(error).__name__}: {error} (at step {step}, on responses sampled in "
            f"training); {REWARD_FIX}, then continue with --resume {self.run_dir}: the run "
            f"stopped before step {step}, {kept} kept"
        )


def read_settings(run_dir: Path, command: str) -> dict[str, Any]:
    """config.json of a run folder ``ppojax <command>`` made; ``ValueError`` naming it."""
    from ppojax.runs import folder

    path = folder.require_run_folder(run_dir) / folder.CONFIG_FILE
    settings = folder.read_json_object(path, "run settings")
    if "model_type" in settings:  # a Hugging Face config.json
        raise ValueError(
            f"--resume {run_dir}: that is a model folder, not a run folder; train it with "
            f"--model {run_dir}, or give --resume the run folder ppojax {command} made"
        )
    if settings.get("command") != command:
        made = settings.get("command", "ppojax train or rlhf --task")
        raise ValueError(f"--resume {run_dir}: that run folder is one of {made!r}, not {command}")
    return settings


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


def check_batch(path: Path, rows: int, batch_size: int) -> None:
    if batch_size > rows:
        raise ValueError(f"{path} has {rows} training rows, fewer than --batch-size {batch_size}")


def reward_check(specs: list[str], job: Any, failures: list, run_dir: Path) -> RewardCheck:
    """The check that stops an rlhf run at a step where one of the text rewards ``specs``
    failed; the job's curves name each reward's metric, the text rewards first."""
    fns = [load_reward(spec) for spec in specs]  # the job's own: a module is imported once
    return RewardCheck(list(specs), fns, list(job.curves[1 : 1 + len(specs)]), failures, run_dir)


def check_devices(settings: dict[str, Any], rows: int) -> None:
    """A ValueError naming both flags unless --batch-size's rows split evenly over --devices
    (each device works on its own rows)."""
    devices = settings.get("devices", 1)
    if rows % devices:
        raise ValueError(
            f"--batch-size {rows} (x --group-size) must be a multiple of --devices {devices}: "
            "each device takes its own rows"
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
