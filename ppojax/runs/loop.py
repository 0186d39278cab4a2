"""The one host loop every run folder goes through: PPO runs and sweeps
(``ppojax.runs.experiment``), PBT (``ppojax.runs.pbt_folder``) and any other pure step
(``train_loop``: SFT, reward models, DPO, RLHF).

A run is a compiled ``runner(inputs, state, first, count) -> (state, metrics)``: ``inputs``
are frozen (a config, data, a reference model) and never checkpointed, ``state`` is carried
and checkpointed. ``chunk_plan`` cuts the steps into chunks that end on every multiple of
``checkpoint_every``; ``train_chunks`` runs them and hands each chunk to the hooks (metrics
rows, checkpoints, the progress bar, loggers) while the next chunk runs; ``resume_point``
reads a run folder back. ``scan_chunk`` is the one way a chunk is compiled: a fixed-length
``lax.scan`` whose steps past the chunk's count are skipped by ``lax.cond``, so every chunk,
the last partial one included, is the same program, and a resumed run computes bit for bit
what the uninterrupted one did. ``ProgressBar`` is the one bar.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import jaxpr_as_fun
from jax.sharding import NamedSharding, PartitionSpec

from ppojax.checks import ConfigError, check_bool, check_positive_int, show
from ppojax.ppo.summary import latest_finite
from ppojax.runs import checkpoints, folder
from ppojax.runs.options import RunOptions
from ppojax.runtime.compiling import compiler_options

# A hook: (first step of the chunk, state after it, host metrics [runs, count]).
Hook = Callable[[int, Any, dict[str, np.ndarray]], None]
# A numbered step: (inputs, state, step number) -> (state, metrics, each [runs]).
NumberedStep = Callable[[Any, Any, jax.Array], tuple[Any, dict[str, jax.Array]]]


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


def scan_chunk(
    step: NumberedStep,
    inputs: Any,
    state: Any,
    first: jax.Array,
    count: jax.Array,
    length: int,
    after: Callable[[Any, jax.Array, dict[str, jax.Array], jax.Array], None] | None = None,
) -> tuple[Any, dict[str, jax.Array]]:
    """Steps ``first .. first + count - 1`` of ``step(inputs, state, number)`` from
    ``state``, in a ``lax.scan`` of ``length`` (static) whose steps past ``count`` are
    skipped. ``after(inputs, number, metrics, ran)``, if given, is traced after every step
    (a host callback for progress). Metrics [runs, length], zeros past ``count``."""

    def body(state: Any, index: jax.Array) -> tuple[Any, dict[str, jax.Array]]:
        number = first + index
        # The step traced once, as a jaxpr that gives both the cond's branch and the metrics'
        # shapes for the skipped steps' zeros: tracing it twice (eval_shape, then the branch)
        # took 0.38 s each for the classic PPO config, 45% of the runner's tracing.
        jaxpr, shapes = jax.make_jaxpr(step, return_shape=True)(inputs, state, number)

        def run(state: Any) -> tuple[Any, dict[str, jax.Array]]:
            leaves = jaxpr_as_fun(jaxpr)(*jax.tree.leaves((inputs, state, number)))
            return jax.tree.unflatten(jax.tree.structure(shapes), leaves)

        def skip(state: Any) -> tuple[Any, dict[str, jax.Array]]:
            return state, jax.tree.map(lambda leaf: jnp.zeros(leaf.shape, leaf.dtype), shapes[1])

        ran = index < count
        state, metrics = jax.lax.cond(ran, run, skip, state)
        if after is not None:
            after(inputs, number, metrics, ran)
        return state, metrics

    state, metrics = jax.lax.scan(body, state, jnp.arange(length))
    return state, jax.tree.map(lambda leaf: jnp.moveaxis(leaf, 0, 1), metrics)


def train_chunks(
    runner: Callable[..., Any],
    inputs: Any,
    state: Any,
    plan: Sequence[tuple[int, int]],
    hooks: Sequence[Hook],
    order: Sequence[str] = (),
    overlap: bool = True,
) -> Any:
    """Run ``runner(inputs, state, first, count)`` for the chunks of ``plan`` and call every
    hook with ``(first, state, metrics)`` after each, host metrics [runs, count] (the names
    of ``order`` first, then the others sorted). With ``overlap`` the next chunk is
    dispatched before the hooks handle the last one, so the device never waits for the
    files; without it (a runner that donates its state, deleting the one the hooks would
    read) the hooks come first."""
    pending = None
    for first, count in plan:
        if pending is not None and not overlap:
            _deliver(hooks, order, *pending)
            pending = None
        try:
            state, metrics = runner(inputs, state, first, count)
        except BaseException:
            # A runner that fails at once (a host step raising) still leaves the chunk before
            # it kept: its rows and checkpoint are what --resume goes on from.
            if pending is not None:
                _deliver(hooks, order, *pending)
            raise
        if pending is not None:
            _deliver(hooks, order, *pending)
        pending = (first, count, state, metrics)
    if pending is not None:
        _deliver(hooks, order, *pending)
    return state


def _deliver(
    hooks: Sequence[Hook],
    order: Sequence[str],
    first: int,
    count: int,
    state: Any,
    metrics: dict[str, Any],
) -> None:
    metrics = jax.device_get(metrics)
    names = [name for name in order if name in metrics]
    names += sorted(set(metrics) - set(names))
    metrics = {name: np.asarray(metrics[name])[:, :count] for name in names}
    for hook in hooks:
        hook(first, state, metrics)


def write_rows(
    run_dir: Path, columns: Sequence[dict[str, Any]], first: int, metrics: dict[str, np.ndarray]
) -> None:
    """Append a chunk's metrics [runs, count] to metrics.csv, one row per run and step after
    ``first``, led by each run's ``columns`` ({"run", "seed", ...})."""
    header = folder.metrics_header(columns, list(metrics))
    rows = folder.metric_rows(columns, first, metrics)
    folder.append_metrics(Path(run_dir) / folder.METRICS_FILE, header, rows)


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


class ProgressBar:
    """A tqdm bar over ``total`` updates of ``scale`` units each (env steps of all runs
    together; 1: the updates themselves), with the latest mean of some metrics beside it
    (``metrics``: {name: label}). ``open`` shows it once compiling is done, so its rate counts
    training only. Fed by ``report`` (also from an XLA thread, inside the compiled loop) and,
    as a hook, after every chunk."""

    def __init__(
        self,
        total: int,
        start: int,
        metrics: dict[str, str] | None = None,
        *,
        scale: int = 1,
        unit: str = "step",
        description: str | None = None,
        digits: str = ".1f",
    ) -> None:
        self.total, self.update_number, self.scale = total, start, scale
        self.metrics, self.unit, self.description = metrics or {}, unit, description
        self.digits = digits
        # Reports arrive on an XLA thread while the main thread may be finishing a chunk.
        self.lock = threading.Lock()
        self.bar: Any = None
        self.shown: dict[str, float] = {}

    def open(self) -> None:
        # tqdm.auto warns in a notebook kernel without ipywidgets
        from tqdm import tqdm

        self.bar = tqdm(
            total=self.total * self.scale,
            initial=self.update_number * self.scale,
            desc=self.description,
            unit=self.unit,
            unit_scale=True,
            dynamic_ncols=True,
            mininterval=0.5,
        )

    def report(self, update: Any, values: dict[str, Any]) -> None:
        """Advance to ``update`` and show the mean of the finite values [runs] of each of the
        bar's metrics in ``values`` (the old value stays where none is finite)."""
        with self.lock:
            for name, label in self.metrics.items():
                row = np.asarray(values.get(name, np.nan), dtype=np.float64)
                if np.isfinite(row).any():
                    self.shown[label] = float(np.nanmean(row))
            text = ", ".join(
                f"{label} {value:{self.digits}}" for label, value in self.shown.items()
            )
            self.bar.set_postfix_str(text, refresh=False)
            update = int(update)
            if update > self.update_number:
                self.bar.update((update - self.update_number) * self.scale)
                self.update_number = update

    def __call__(self, first: int, state: Any, metrics: dict[str, np.ndarray]) -> None:
        """The hook: a chunk from ``first`` ended; each run's latest finite value shown."""
        count = next(iter(metrics.values())).shape[1]
        shown = {name: latest_finite(metrics[name]) for name in self.metrics if name in metrics}
        self.report(first + count, shown)

    def write(self, message: str) -> None:
        """A line on stderr above the bar."""
        from tqdm import tqdm

        with self.lock:
            tqdm.write(message, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


StepFn = Callable[[Any, Any, jax.Array], tuple[Any, dict[str, jax.Array]]]

# What to do about updates skipped for a NaN or inf, said by the LM commands' messages.
SKIP_FIX = "lower --learning-rate; in rlhf, check the rewards' scale (and the reward model)"


class SkipReport:
    """A hook: one line (to ``write``) for each chunk whose steps had updates skipped by the
    divergence guard (``nonfinite_steps`` > 0): the first such step, how many it skipped of
    how many, how many steps of the chunk skipped all theirs, and what to do."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self.write = write

    def __call__(self, first: int, state: Any, metrics: dict[str, np.ndarray]) -> None:
        if "nonfinite_steps" not in metrics or "gradient_steps" not in metrics:
            return
        skipped, taken = metrics["nonfinite_steps"][0], metrics["gradient_steps"][0]
        hit = np.flatnonzero(skipped > 0)
        if not hit.size:
            return
        index = hit[0]
        count, whole = int(skipped[index]), int(skipped[index] + taken[index])
        every = int(((skipped > 0) & (taken == 0)).sum())
        self.write(
            f"ppojax: step {first + index + 1} skipped {count} of its {whole} update(s) for a NaN "
            f"or inf in the loss, gradients or parameters; {every} of steps {first + 1}-"
            f"{first + len(skipped)} skipped all theirs (the parameters stay the last finite "
            f"ones). If it goes on: {SKIP_FIX}"
        )


def say(message: str) -> None:
    """A line on stderr."""
    sys.stderr.write(message + "\n")


class RunDiverged(Exception):
    """A run whose last step skipped all its updates (``never_recovered``): the text is the
    one line the command prints."""


def never_recovered(metrics: dict[str, np.ndarray]) -> str | None:
    """What to say of a run whose every metric is [num_steps] when its last step skipped all
    its updates for a NaN or inf (it diverged and never recovered); None otherwise (or when
    its step has no divergence guard)."""
    if "nonfinite_steps" not in metrics or "gradient_steps" not in metrics:
        return None
    skipped, taken = metrics["nonfinite_steps"], metrics["gradient_steps"]
    if not skipped.size or skipped[-1] == 0 or taken[-1] > 0:
        return None
    steps = len(skipped)
    first = int(np.flatnonzero(skipped > 0)[0]) + 1
    kept = "the model it started from" if not taken.any() else "its last finite parameters"
    return (
        f"the run diverged and never recovered: from step {first} on updates were skipped for "
        f"a NaN or inf, and its last step, {steps}, skipped all {int(skipped[-1])}; "
        f"{int((taken == 0).sum())} of its {steps} steps trained nothing. No final/ is "
        f"written: its newest checkpoint holds {kept}. {SKIP_FIX[0].upper()}{SKIP_FIX[1:]}, "
        "then train again"
    )


def host_chunk(
    step: NumberedStep, inputs: Any, state: Any, first: int, count: int
) -> tuple[Any, dict[str, jax.Array]]:
    """Steps ``first .. first + count - 1`` of ``step(inputs, state, number)`` called one by
    one from Python, for a step that cannot be compiled whole (a Python env played on the
    host inside it): the same numbers, so the same keys, as ``scan_chunk``; metrics [runs,
    count]."""
    rows = []
    for number in range(first, first + count):
        state, metrics = step(inputs, state, jnp.int32(number))
        rows.append(metrics)
    return state, jax.tree.map(lambda *steps: jnp.stack(steps, axis=1), *rows)


def keyed_step(step: StepFn) -> NumberedStep:
    """``step(frozen, state, key)`` as a numbered step of one run: step n on
    ``fold_in(key, n)`` with ``inputs = (key, frozen)``, each metric [1]."""

    def numbered(inputs: tuple[jax.Array, Any], state: Any, number: jax.Array) -> Any:
        key, frozen = inputs
        state, metrics = step(frozen, state, jax.random.fold_in(key, number))
        return state, {name: jnp.asarray(value)[None] for name, value in metrics.items()}

    return numbered


class LoopResult(NamedTuple):
    """The final state, every metric [num_steps] (those before a resume included), the step
    this call started from and the seconds it trained (compilation included)."""

    state: Any
    metrics: dict[str, np.ndarray]
    start: int
    seconds: float


def on_state_mesh(tree: Any, state: Any) -> Any:
    """``tree`` replicated over the mesh ``state`` is sharded on (an LM state over --devices),
    as it is; a jitted chunk refuses arguments on one device beside a state on several."""
    for leaf in jax.tree.leaves(state):
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, NamedSharding) and len(sharding.device_set) > 1:
            return jax.device_put(tree, NamedSharding(sharding.mesh, PartitionSpec()))
    return tree


def check_loop(options: RunOptions, num_steps: int, **flags: bool) -> None:
    """Raise naming the argument or option at fault: ``options`` a ``RunOptions`` without
    the env runs' loggers, ``num_steps`` a positive int, every flag a bool."""
    if not isinstance(options, RunOptions):
        raise TypeError(f"train_loop's options must be RunOptions, got {show(options)}")
    # train_loop writes no TensorBoard files and opens no W&B run: silently dropping what the
    # user asked for would be worse than saying where it goes (a hook)
    for name in ("tensorboard", "wandb"):
        if getattr(options, name) not in (False, None):
            raise ConfigError(
                name,
                f"RunOptions.{name} is for env runs: train_loop logs through its hooks, "
                f"got {name}={show(getattr(options, name))}",
            )
    check_positive_int("train_loop", "num_steps", num_steps)
    for name, value in flags.items():
        check_bool("train_loop", name, value)


def train_loop(
    run_dir: Path,
    step: StepFn,
    state: Any,
    frozen: Any,
    key: jax.Array,
    options: RunOptions,
    *,
    num_steps: int,
    resume: bool = False,
    seed: int = 0,
    bar_metrics: Sequence[str] = (),
    host_steps: bool = False,
    hooks: Sequence[Hook] = (),
    checks: Sequence[Hook] = (),
    donate: bool = False,
) -> LoopResult:
    """Train ``step(frozen, state, key)`` from ``state`` (step 0) to ``num_steps`` in chunks of
    ``options.checkpoint_every`` steps (None: one chunk), appending each chunk's rows to
    metrics.csv (columns run, ``seed``, update, then the metrics) and saving a checkpoint after
    it (the newest ``options.keep_checkpoints``); with ``resume``, from the newest checkpoint.
    ``frozen`` (data, a reference model, a reward model's params) goes into every chunk as an
    argument and is never checkpointed. With ``options.progress`` a bar shows the latest value
    of each of ``bar_metrics``.

    The rest is how this driver loops, not what the user chose to see: ``host_steps``, the
    step runs on the host (a Python env inside it) and is called step by step
    (``host_chunk``) instead of compiled into a chunk's scan; ``checks`` get ``(first step,
    state, metrics [1, count])`` before the chunk is kept (one that raises stops the run
    there, the folder as the chunk before left it, ``resume`` going on from its checkpoint),
    ``hooks`` after (samples, W&B); ``donate``, each chunk writes its state into the buffers
    of the state it was given, so the step's peak is the loop's (a language model's state held
    once, not twice), and the hooks handle a chunk before the next is dispatched, where
    otherwise the next runs while they write its files."""
    check_loop(options, num_steps, resume=resume, host_steps=host_steps, donate=donate)
    run_dir = Path(run_dir)
    start, history = 0, {}
    if resume:
        restored, start, history = resume_point(run_dir, state, 1)
        if restored is not None:
            # laid out as the fresh state is (a sharded LM state: over its mesh), not on the
            # one device a checkpoint reads back to
            layouts = jax.tree.map(lambda leaf: getattr(leaf, "sharding", None), state)
            state = jax.device_put(restored, layouts)
    key, frozen = on_state_mesh((key, frozen), state)
    every = options.checkpoint_every
    length = min(every or num_steps, num_steps)
    plan = chunk_plan(start, num_steps, length, every)
    columns = [{"run": 0, "seed": seed}]
    chunks: list[dict[str, np.ndarray]] = []
    bar = None
    if options.progress:
        bar = ProgressBar(num_steps, start, {name: name for name in bar_metrics}, digits=".3g")
    store = checkpoints.open_checkpoints(run_dir, options.keep_checkpoints, clean=True)

    def keep(first: int, state: Any, metrics: dict[str, np.ndarray]) -> None:
        count = next(iter(metrics.values())).shape[1]
        write_rows(run_dir, columns, first, metrics)
        checkpoints.save_checkpoint(store, first + count, state)
        chunks.append(metrics)

    began = time.perf_counter()
    try:
        runner = loop_runner(step, length, host_steps, donate)
        if bar is not None:
            bar.open()
        report = SkipReport(say if bar is None else bar.write)
        every_chunk = [*checks, report, keep, *hooks, *([bar] if bar is not None else [])]
        state = train_chunks(runner, (key, frozen), state, plan, every_chunk, overlap=not donate)
    finally:
        store.close()
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - began
    return LoopResult(state, joined_metrics(history, chunks), start, seconds)


def loop_runner(step: StepFn, length: int, host_steps: bool, donate: bool) -> Callable[..., Any]:
    """``runner(inputs, state, first, count)`` of ``train_chunks`` for a keyed step: step by
    step on the host, or jit, compiled on the first chunk (a program compiled ahead refuses
    inputs laid out otherwise than it was compiled for, and a sharded LM state may leave a
    chunk so)."""
    if host_steps:
        return functools.partial(host_chunk, keyed_step(step))
    return jax.jit(
        functools.partial(scan_chunk, keyed_step(step), length=length),
        donate_argnums=(1,) if donate else (),
        compiler_options=compiler_options(),
    )


def joined_metrics(
    history: dict[str, np.ndarray], chunks: list[dict[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    """Every metric [num_steps] of one run: the ``history`` [1, start] a resume read back,
    then the chunks [1, count] trained here."""
    trained: dict[str, np.ndarray] = {}
    if chunks:
        trained = {name: np.concatenate([c[name] for c in chunks], 1) for name in chunks[0]}
    metrics = {}
    for name in trained or history:
        parts = [part[name] for part in (history, trained) if name in part]
        metrics[name] = np.concatenate(parts, 1)[0]
    return metrics
