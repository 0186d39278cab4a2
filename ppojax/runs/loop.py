"""The chunked host loop every run folder goes through: a compiled program runs a chunk of
steps, the host writes its metrics rows and a checkpoint, and a resume starts again from the
newest checkpoint that reads back, with the rows after it dropped.

``chunk_plan`` cuts the steps into chunks that end on every multiple of ``checkpoint_every``;
``train_chunks`` runs them, handing each chunk's metrics to the host while the next chunk
runs; ``resume_point`` reads a run folder back. ``ppojax.runs.experiment`` drives PPO runs
through these; ``train_loop`` drives any other pure step through them (SFT, reward models,
DPO, RLHF): ``step(frozen, state, key) -> (state, metrics)``, step n on ``fold_in(key, n)``,
so a run's numbers do not depend on where its chunks end, and each chunk is the same
compiled program (a fixed-length ``lax.scan`` whose steps past the chunk's count are skipped
by ``lax.cond``), so a resumed run computes bit for bit what the uninterrupted one did.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ppojax.checks import check_bool, check_positive_int
from ppojax.runs import checkpoints, folder
from ppojax.runtime.compiling import compiler_options

ChunkCallback = Callable[[int, Any, dict[str, np.ndarray]], None]


def chunk_plan(
    start: int, stop: int, length: int, checkpoint_every: int | None
) -> list[tuple[int, int]]:
    """(first step, count) for each chunk from ``start`` to ``stop``; chunks never cross a
    multiple of ``checkpoint_every``, so every checkpoint falls on a chunk's end."""
    plan, first = [], start
    while first < stop:
        end = min(first + length, stop)
        if checkpoint_every:
            end = min(end, (first // checkpoint_every + 1) * checkpoint_every)
        plan.append((first, end - first))
        first = end
    return plan


def train_chunks(
    runner: Callable[..., Any],
    inputs: Any,
    state: Any,
    plan: Sequence[tuple[int, int]],
    on_chunk: ChunkCallback,
    order: Sequence[str] = (),
) -> Any:
    """Run ``runner(inputs, state, first, count)`` for the chunks of ``plan`` and call
    ``on_chunk(first, state, metrics)`` after each, with host metrics [runs, count] (the
    names of ``order`` first, then the others sorted). The next chunk is dispatched before
    the host handles the last one, so the device never waits for the files."""
    pending = None
    for first, count in plan:
        state, metrics = runner(inputs, state, first, count)
        if pending is not None:
            _deliver(on_chunk, order, *pending)
        pending = (first, count, state, metrics)
    if pending is not None:
        _deliver(on_chunk, order, *pending)
    return state


def _deliver(
    on_chunk: ChunkCallback,
    order: Sequence[str],
    first: int,
    count: int,
    state: Any,
    metrics: dict[str, Any],
) -> None:
    metrics = jax.device_get(metrics)
    names = [name for name in order if name in metrics]
    names += sorted(set(metrics) - set(names))
    on_chunk(first, state, {name: np.asarray(metrics[name])[:, :count] for name in names})


def resume_point(
    run_dir: Path, template: Any, runs: int
) -> tuple[Any | None, int, dict[str, np.ndarray]]:
    """The newest checkpoint of ``run_dir`` that reads back whole, its step, and the metrics
    [runs, step] of metrics.csv up to it. Nothing changes until metrics.csv has been read
    back whole; then unreadable checkpoints are moved aside (a ``CheckpointWarning`` each) and
    the rows after the step dropped. (None, 0, {}) with no complete checkpoint: the run
    starts again at step 0, its rows all dropped."""
    run_dir = Path(run_dir)
    state, step, unreadable = checkpoints.restore_newest(run_dir, template)
    metrics_path = run_dir / folder.METRICS_FILE
    history: dict[str, np.ndarray] = {}
    if step > 0:
        header, rows, history = folder.metrics_until(metrics_path, step, runs)
    for path in checkpoints.set_aside(run_dir, unreadable):
        warnings.warn(
            f"moved the unreadable checkpoint to {path}", checkpoints.CheckpointWarning, 3
        )
    if state is None:
        warnings.warn(
            f"{run_dir} has no complete checkpoint: training again from update 0",
            checkpoints.CheckpointWarning,
            stacklevel=3,
        )
    if step > 0:
        folder.write_metrics(metrics_path, header, rows)
    else:
        metrics_path.unlink(missing_ok=True)
    return state, step, history


StepFn = Callable[[Any, Any, jax.Array], tuple[Any, dict[str, jax.Array]]]


def scan_steps(
    step: StepFn, length: int, inputs: tuple[jax.Array, Any], state: Any, first: Any, count: Any
) -> tuple[Any, dict[str, jax.Array]]:
    """Steps ``first .. first + count - 1`` of ``step(frozen, state, key)`` from ``state``,
    step n on ``fold_in(key, n)``, where ``inputs = (key, frozen)``, in a ``lax.scan`` of
    ``length`` (static) whose steps past ``count`` are skipped. Metrics [1, length] (one
    run), zeros past ``count``."""
    key, frozen = inputs

    def one(state: Any, number: jax.Array) -> tuple[Any, dict[str, jax.Array]]:
        return step(frozen, state, jax.random.fold_in(key, number))

    shapes = jax.eval_shape(one, state, jnp.int32(0))[1]

    def skip(state: Any, number: jax.Array) -> tuple[Any, dict[str, jax.Array]]:
        return state, jax.tree.map(lambda leaf: jnp.zeros(leaf.shape, leaf.dtype), shapes)

    def body(state: Any, index: jax.Array) -> tuple[Any, dict[str, jax.Array]]:
        return jax.lax.cond(index < count, one, skip, state, first + index)

    state, metrics = jax.lax.scan(body, state, jnp.arange(length))
    return state, {name: values[None] for name, values in metrics.items()}


@dataclasses.dataclass(frozen=True)
class LoopOptions:
    """``num_steps`` in chunks of ``checkpoint_every`` steps, a checkpoint after each (the
    newest ``keep_checkpoints`` kept; None: all); a progress bar with the latest value of
    each of ``bar_metrics``; with ``resume``, from the run folder's newest checkpoint;
    ``seed`` for the metrics rows' column; ``hooks`` called after each chunk."""

    num_steps: int
    checkpoint_every: int
    keep_checkpoints: int | None = 3
    progress: bool = True
    bar_metrics: tuple[str, ...] = ()
    resume: bool = False
    seed: int = 0
    hooks: Sequence[ChunkCallback] = ()

    def __post_init__(self) -> None:
        check_positive_int("LoopOptions", "num_steps", self.num_steps)
        check_positive_int("LoopOptions", "checkpoint_every", self.checkpoint_every)
        if self.keep_checkpoints is not None:
            check_positive_int("LoopOptions", "keep_checkpoints", self.keep_checkpoints)
        check_bool("LoopOptions", "progress", self.progress)
        check_bool("LoopOptions", "resume", self.resume)


class LoopResult(NamedTuple):
    """The final state, every metric [num_steps] (those before a resume included), the step
    this call started from and the seconds it trained (compilation included)."""

    state: Any
    metrics: dict[str, np.ndarray]
    start: int
    seconds: float


class StepBar:
    """A tqdm bar over steps showing the latest value of some metrics."""

    def __init__(self, total: int, start: int, names: Sequence[str]) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, initial=start, unit="step", dynamic_ncols=True)
        self.names = names

    def __call__(self, first: int, state: Any, metrics: dict[str, np.ndarray]) -> None:
        count = next(iter(metrics.values())).shape[1]
        shown = {name: f"{metrics[name][0, -1]:.3g}" for name in self.names if name in metrics}
        self.bar.set_postfix(shown, refresh=False)
        self.bar.update(count)

    def close(self) -> None:
        self.bar.close()


def train_loop(
    run_dir: Path,
    step: StepFn,
    state: Any,
    frozen: Any,
    key: jax.Array,
    options: LoopOptions,
) -> LoopResult:
    """Train ``step(frozen, state, key)`` from ``state`` (step 0) to ``options.num_steps`` in
    chunks, appending each chunk's rows to metrics.csv (columns run, seed, update, then the
    metrics) and saving a checkpoint after it; with ``options.resume``, from the newest
    checkpoint. ``frozen`` (data, a reference model, a reward model's params) goes into every
    chunk as an argument and is never checkpointed. After each chunk every hook gets ``(first
    step, state, metrics [1, count])`` (samples, W&B)."""
    run_dir = Path(run_dir)
    start, history = 0, {}
    if options.resume:
        restored, start, history = resume_point(run_dir, state, 1)
        state = state if restored is None else restored
    length = min(options.checkpoint_every, options.num_steps)
    runner = jax.jit(
        functools.partial(scan_steps, step, length), compiler_options=compiler_options()
    )
    columns = [{"run": 0, "seed": options.seed}]
    store = checkpoints.open_checkpoints(run_dir, options.keep_checkpoints, clean=True)
    bar = StepBar(options.num_steps, start, options.bar_metrics) if options.progress else None
    chunks: list[dict[str, np.ndarray]] = []

    def on_chunk(first: int, state: Any, metrics: dict[str, np.ndarray]) -> None:
        count = next(iter(metrics.values())).shape[1]
        header = folder.metrics_header(columns, list(metrics))
        rows = folder.metric_rows(columns, first, metrics)
        folder.append_metrics(run_dir / folder.METRICS_FILE, header, rows)
        checkpoints.save_checkpoint(store, first + count, state)
        chunks.append(metrics)
        for hook in (*options.hooks, *([bar] if bar is not None else [])):
            hook(first, state, metrics)

    plan = chunk_plan(start, options.num_steps, length, options.checkpoint_every)
    began = time.perf_counter()
    try:
        state = train_chunks(runner, (key, frozen), state, plan, on_chunk)
    finally:
        store.close()
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - began
    trained: dict[str, np.ndarray] = {}
    if chunks:
        trained = {name: np.concatenate([c[name] for c in chunks], 1) for name in chunks[0]}
    metrics = {}
    for name in trained or history:
        parts = [part[name] for part in (history, trained) if name in part]
        metrics[name] = np.concatenate(parts, 1)[0]
    return LoopResult(state, metrics, start, seconds)


def plot_metrics(path: Path, metrics: dict[str, np.ndarray], names: Sequence[str]) -> None:
    """One panel per metric name against the step (``metrics``: name -> [steps])."""
    from matplotlib.figure import Figure

    names = [name for name in names if name in metrics]
    figure = Figure(figsize=(4 * len(names), 3.2))
    axes = figure.subplots(1, len(names), squeeze=False)
    for axis, name in zip(axes[0], names, strict=True):
        axis.plot(np.arange(1, len(metrics[name]) + 1), metrics[name])
        axis.set_title(name, fontsize="small")
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
