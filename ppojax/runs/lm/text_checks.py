"""The checks of ``ppojax sft | rm | dpo | rlhf --model``'s input that need more than its
flags, run before a run folder is made (``ppojax.runs.lm.text_job``): each ``--reward``
imported and tried on the first prompts, a ``--resume`` folder, the batch against the data and
--devices; and the check that stops a run at a step where a text reward failed. Each failure
is a ``ValueError`` whose text is the one line the command prints."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


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
