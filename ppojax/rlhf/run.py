"""RLHF run folders: train a ``Trainer`` in jitted chunks with checkpoints, a metrics CSV, a
plot and a summary, and resume a killed run bit-exactly.

A run folder holds::

    config.json        the RLHFConfig and the run's settings (what --resume reads back)
    metrics.csv        one row per step (the step's metrics, TRL's names)
    curves.png         scores, each reward function and the KL to the reference, per step
    checkpoints/<n>/   orbax checkpoints of the RLHFState (policy, critic, optimizer, beta)
    frozen/0/          orbax checkpoint of whatever the rewards need (a reward model's params)
    summary.json       final metrics, wall time, response tokens/s, versions

Step n draws its prompts and samples from ``fold_in(key, n)``, so a run's numbers do not
depend on where its chunks end, and a resumed run computes exactly what the uninterrupted
run would have.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ppojax.rlhf.config import RLHFConfig
from ppojax.rlhf.trainer import RLHFState, Trainer
from ppojax.runs import checkpoints, folder
from ppojax.runtime.compiling import compiler_options

PLOT_FILE = "curves.png"
FROZEN_DIR = "frozen"
PromptFn = Callable[[jax.Array], tuple[jax.Array, jax.Array]]


def run_chunk(
    trainer: Trainer,
    prompt_fn: PromptFn,
    count: int,
    state: RLHFState,
    key: jax.Array,
    first: jax.Array,
) -> tuple[RLHFState, dict[str, jax.Array]]:
    """Steps first .. first + count - 1 (``lax.scan``), step n on ``fold_in(key, n)``;
    metrics [count] each."""

    def body(state: RLHFState, index: jax.Array):
        prompt_key, step_key = jax.random.split(jax.random.fold_in(key, index))
        return trainer.step(state, *prompt_fn(prompt_key), step_key)

    return jax.lax.scan(body, state, first + jnp.arange(count))


def config_dict(config: Any) -> dict[str, Any]:
    """A dataclass config as JSON-ready values (tuples as lists)."""
    return {
        field.name: list(value) if isinstance(value, tuple) else value
        for field in dataclasses.fields(config)
        for value in [getattr(config, field.name)]
    }


def rlhf_config_from_dict(values: dict[str, Any]) -> RLHFConfig:
    """Undo ``config_dict`` for RLHFConfig (lists back to tuples)."""
    return RLHFConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


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


def plot_curves(path: Path, metrics: dict[str, np.ndarray], names: tuple[str, ...]) -> None:
    """One panel per metric name (scores, each reward, KL) against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3.2), squeeze=False)
    for axis, name in zip(axes[0], names, strict=True):
        axis.plot(np.arange(1, len(metrics[name]) + 1), metrics[name])
        axis.set_title(name, fontsize="small")
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def summarize(
    metrics: dict[str, np.ndarray], seconds: float, rows: int, timed_steps: int
) -> dict[str, Any]:
    """Means over the last 10% of steps; wall time and sampled response tokens per second of
    the ``timed_steps`` last steps (those this process ran, compilation included)."""
    steps = len(next(iter(metrics.values())))
    tail = max(1, steps // 10)
    final = {name: float(np.mean(values[-tail:])) for name, values in metrics.items()}
    lengths = metrics["completions/mean_length"][steps - timed_steps :]
    tokens = float(np.sum(lengths)) * rows
    return {
        "steps": steps,
        "final (mean of the last 10% of steps)": final,
        "timed_steps": timed_steps,
        "wall_s": round(seconds, 2),
        "response_tokens_per_s": round(tokens / seconds, 1) if seconds > 0 else math.nan,
        "versions": folder.versions(),
    }


def curve_names(metrics: dict[str, Any]) -> tuple[str, ...]:
    """The plotted metrics: the score, every reward function's mean, the KL."""
    rewards = tuple(sorted(name for name in metrics if name.startswith("rewards/")))
    return ("objective/scores", *rewards, "objective/kl")


def resume_point(run_dir: Path, template: RLHFState) -> tuple[RLHFState | None, int]:
    """The newest readable checkpoint and its step (None, 0 without one); checkpoints that do
    not read back are set aside and metrics rows after the step dropped."""
    state, step, unreadable = checkpoints.restore_newest(run_dir, template)
    if unreadable:
        checkpoints.set_aside(run_dir, unreadable)
    metrics_path = Path(run_dir) / folder.METRICS_FILE
    if metrics_path.exists():
        folder.truncate_metrics(metrics_path, step)
    return state, step


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
) -> tuple[RLHFState, dict[str, np.ndarray]]:
    """Train to ``num_steps`` in jitted chunks of ``chunk`` steps, appending to metrics.csv and
    saving a checkpoint after each; with ``resume``, from the newest checkpoint. Writes the
    plot and summary.json at the end; returns the state and every metric [num_steps]."""
    from tqdm.auto import tqdm

    run_dir = Path(run_dir)
    start = 0
    if resume:
        restored, start = resume_point(run_dir, state)
        state = state if restored is None else restored
    compiled: dict[int, Callable[..., Any]] = {}
    store = checkpoints.open_checkpoints(run_dir, clean=True)
    bar = tqdm(total=num_steps, initial=start, unit="step", disable=not progress)
    began, step = time.perf_counter(), start
    try:
        while step < num_steps:
            count = min(chunk, num_steps - step)
            if count not in compiled:
                compiled[count] = jax.jit(
                    functools.partial(run_chunk, trainer, prompt_fn, count),
                    compiler_options=compiler_options(),
                )
            state, metrics = compiled[count](state, key, jnp.int32(step))
            table = {name: np.asarray(values)[None] for name, values in sorted(metrics.items())}
            header = folder.metrics_header([{"run": 0}], list(table))
            rows = folder.metric_rows([{"run": 0}], step, table)
            folder.append_metrics(run_dir / folder.METRICS_FILE, header, rows)
            step += count
            checkpoints.save_checkpoint(store, step, state)
            bar.update(count)
            last = {
                name: float(table[name][0, -1]) for name in ("objective/scores", "objective/kl")
            }
            bar.set_postfix(
                score=f"{last['objective/scores']:.3f}", kl=f"{last['objective/kl']:.2f}"
            )
    finally:
        store.close()
        bar.close()
    seconds = time.perf_counter() - began
    _, table = folder.read_metrics(run_dir / folder.METRICS_FILE)
    metrics = {name: values[0] for name, values in table.items()}
    plot_curves(run_dir / PLOT_FILE, metrics, curve_names(metrics))
    rows = jax.eval_shape(prompt_fn, key)[0].shape[0] * trainer.config.group_size
    summary = summarize(metrics, seconds, rows, num_steps - start)
    folder.write_json(run_dir / folder.SUMMARY_FILE, summary)
    return state, metrics
