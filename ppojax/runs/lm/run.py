"""RLHF run folders: train a ``Trainer`` in jitted chunks with checkpoints, a metrics CSV, a
plot and a summary, and resume a killed run bit-exactly.

Every run folder of ``ppojax rlhf`` (both forms), ``sft``, ``rm`` and ``dpo`` holds::

    config.json        the settings (what --resume reads back; ``ppojax.runs.lm.settings``)
    metrics.csv        one row per step (the step's metrics, TRL's names)
    curves.png         the run's curves per step (scores, each reward function, the KL)
    checkpoints/<n>/   orbax checkpoints of the trained state (policy, critic, optimizer, beta)
    summary.json       final metrics, the step resumed from, steps timed, wall time, versions
    lock               the PID and host of the process training there (``ppojax.runs.lock``)

and one kind adds ``frozen/0/`` (the task form: an orbax checkpoint of what it trained before
RL, the SFT params and a reward model's; ``save_frozen``) or ``final/`` and ``samples.jsonl``
(a model folder's run: ``ppojax.runs.lm.text_run``). docs/guide.md's Run folders has the
table of every kind's files.

Step n draws its prompts and samples from ``fold_in(key, n)``, so a run's numbers do not
depend on where its chunks end, and a resumed run computes exactly what the uninterrupted
run would have.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ppojax.rlhf.core.trainer import RLHFState, Trainer
from ppojax.rlhf.models import transformer
from ppojax.runs import checkpoints
from ppojax.runs.loop import LoopResult, RunDiverged, StepFn, never_recovered, train_loop
from ppojax.runs.options import RunOptions
from ppojax.runs.plots import plot_metrics
from ppojax.runs.summary import write_summary

# run folders of the built-in transformer from before it was a DecoderConfig still resume
checkpoints.register_layout(transformer.to_legacy, transformer.from_legacy)

PLOT_FILE = "curves.png"
FROZEN_DIR = "frozen"
BAR_METRICS = ("objective/scores", "objective/kl")
# summary.json's key of the final means
FINAL_MEANS = "final (mean of the last 10% of steps)"
PromptFn = Callable[[jax.Array], tuple[jax.Array, jax.Array]]


def trainer_step(trainer: Trainer, prompt_fn: PromptFn) -> StepFn:
    """``step(frozen, state, key)`` of ``train_loop``: prompts from ``prompt_fn``, then one
    trainer step (``frozen`` unused: the trainer closes over what it needs)."""

    def step(frozen: Any, state: RLHFState, key: jax.Array):
        prompt_key, step_key = jax.random.split(key)
        return trainer.step(state, *prompt_fn(prompt_key), step_key)

    return step


def save_frozen(run_dir: Path, tree: Any) -> None:
    """Write the rewards' frozen arrays once, as an orbax checkpoint ``frozen/0``."""
    store = checkpoints.open_checkpoints(Path(run_dir) / FROZEN_DIR)
    try:
        checkpoints.save_checkpoint(store, 0, tree)
    finally:
        store.close()


def load_frozen(run_dir: Path, template: Any) -> Any:
    """The arrays ``save_frozen`` wrote (``template`` gives their structure and shapes)."""
    return checkpoints.restore_checkpoint(Path(run_dir) / FROZEN_DIR, template, 0)[0]


def write_loop_summary(run_dir: Path, result: LoopResult, **extra: Any) -> dict[str, Any]:
    """Write the summary.json of a run ``train_loop`` trained (``ppojax.runs.summary``): the
    means of its last 10% of steps (``FINAL_MEANS``), ``extra``, and what every summary holds
    (the steps resumed from and timed, their wall time with compilation, the versions)."""
    metrics = result.metrics
    steps = len(next(iter(metrics.values()))) if metrics else 0
    tail = max(1, steps // 10)
    means = {name: float(np.mean(values[-tail:])) for name, values in metrics.items()}
    seconds = {"wall_s": result.seconds}
    return write_summary(
        run_dir, "step", steps, result.start, {FINAL_MEANS: means}, seconds, extras=extra
    )


def response_tokens_per_s(result: LoopResult, rows: int) -> float:
    """Sampled response tokens per second of the steps this call trained, ``rows`` responses a
    step."""
    lengths = result.metrics["completions/mean_length"][result.start :]
    tokens = float(np.sum(lengths)) * rows
    return round(tokens / result.seconds, 1) if result.seconds > 0 else math.nan


def curve_names(metrics: dict[str, Any]) -> tuple[str, ...]:
    """The plotted metrics: the score, every reward function's mean, the KL."""
    rewards = tuple(sorted(name for name in metrics if name.startswith("rewards/")))
    return ("objective/scores", *rewards, "objective/kl")


def train_run(
    run_dir: Path,
    trainer: Trainer,
    state: RLHFState,
    prompt_fn: PromptFn,
    key: jax.Array,
    *,
    num_steps: int,
    chunk: int,
    resume: bool = False,
    progress: bool = True,
    seed: int = 0,
) -> tuple[RLHFState, dict[str, np.ndarray]]:
    """Train to ``num_steps`` through ``ppojax.runs.loop.train_loop`` (chunks of ``chunk``
    steps, metrics.csv, a checkpoint after each chunk; with ``resume``, from the newest
    checkpoint). Writes the plot and summary.json at the end; returns the state and every
    metric [num_steps]. ``RunDiverged`` (after the plot, before the summary) when its last
    step skipped all its updates for a NaN or inf."""
    run_dir = Path(run_dir)
    options = RunOptions(progress=progress, checkpoint_every=chunk, keep_checkpoints=None)
    step = trainer_step(trainer, prompt_fn)
    result = train_loop(
        run_dir,
        step,
        state,
        None,
        key,
        options,
        num_steps=num_steps,
        resume=resume,
        seed=seed,
        bar_metrics=BAR_METRICS,
    )
    plot_metrics(run_dir / PLOT_FILE, result.metrics, curve_names(result.metrics))
    diverged = never_recovered(result.metrics)
    if diverged is not None:  # no summary: the folder says it did not train
        raise RunDiverged(diverged)
    rows = jax.eval_shape(prompt_fn, key)[0].shape[0] * trainer.config.group_size
    write_loop_summary(run_dir, result, response_tokens_per_s=response_tokens_per_s(result, rows))
    return result.state, result.metrics
