"""Experiments: seeds and a grid of hyperparameters trained as one vmapped, compiled program.

Progress reaches the host from inside the compiled loop: every few updates a
``jax.debug.callback`` hands the update number and the mean episode return to the progress
bar; with the compilation cache on (``ppojax.cache``), which does not store programs with host
callbacks, the updates run in chunks of one report interval instead. Checkpoints need the
state on the host, so with ``checkpoint_every`` the updates run in chunks of one compiled
program: a ``lax.scan`` of fixed length whose steps past ``count`` are skipped by
``lax.cond``, so every chunk, the last partial one included, reuses the same executable, and
chunked updates give the same numbers as one call.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import functools
import itertools
import math
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ppojax import cache, io
from ppojax.config import (
    ConfigError,
    PPOConfig,
    check_bool,
    check_positive_int,
    show,
)
from ppojax.envs.registry import env_id_known, env_modules, import_env_modules
from ppojax.evaluation import EVAL_METRIC_NAMES
from ppojax.sweeps import grid_points as sweep_grid_points
from ppojax.train import eval_due, init_state, make_agent, train_step
from ppojax.types import METRIC_NAMES, Metrics, TrainState
from ppojax.update import make_optimizer
from ppojax.wandb_logger import WandbLog, WandbOptions


@dataclasses.dataclass(frozen=True)
class Experiment:
    """What to train: ``seeds`` seeds (keys split from ``seed``) at every point of ``grid``.

    ``grid`` maps traced PPOConfig fields to the values to sweep; its points are the cartesian
    product. Run ``r`` is grid point ``r // seeds`` with seed ``r % seeds``; every grid point
    uses the same seed keys.
    """

    config: PPOConfig
    seeds: int = 1
    seed: int = 0
    grid: dict[str, tuple[float, ...]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.config, PPOConfig):
            raise TypeError(f"Experiment.config must be a PPOConfig, got {show(self.config)}.")
        check_positive_int("Experiment", "seeds", self.seeds)
        check_seed("Experiment", "seed", self.seed)
        check_grid(self.config, self.grid)

    @property
    def num_runs(self) -> int:
        return self.seeds * math.prod(len(values) for values in self.grid.values())


MAX_SEED = 2**31 - 1


def check_seed(owner: str, name: str, seed: Any) -> None:
    """Raise ``ConfigError`` unless ``seed`` is an int in [0, MAX_SEED] (larger ones would
    collide: ``jax.random.key`` keeps 32 bits of them)."""
    is_int = isinstance(seed, (int, np.integer)) and not isinstance(seed, (bool, np.bool_))
    if not is_int or not 0 <= seed <= MAX_SEED:
        raise ConfigError(
            name, f"{owner}.{name} must be an int in [0, {MAX_SEED}], got {show(seed, (int,))}."
        )


def check_grid(config: PPOConfig, grid: dict[str, Sequence[float]]) -> None:
    """Raise ``ValueError`` naming the problem for a grid that cannot be swept with vmap."""
    sweep_grid_points(config, grid)


def grid_points(grid: dict[str, Sequence[float]]) -> list[dict[str, float]]:
    """The cartesian product of the grid as a list of {field: value}; [{}] for no grid."""
    names = list(grid)
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*grid.values())]


def run_table(experiment: Experiment) -> list[dict[str, Any]]:
    """One dict per run, in run order: {"run": r, "seed": s, **grid point}."""
    rows = []
    for point in grid_points(experiment.grid):
        for seed in range(experiment.seeds):
            rows.append({"run": len(rows), "seed": seed, **point})
    return rows


def run_config(experiment: Experiment) -> tuple[PPOConfig, int | None]:
    """The config to vmap over runs and its ``in_axes``: the plain config (None) without a
    grid, else one whose leaves are arrays [runs] holding each run's value (axis 0)."""
    if not experiment.grid:
        return experiment.config, None
    configs = [
        experiment.config.replace(**{name: run[name] for name in experiment.grid})
        for run in run_table(experiment)
    ]
    return jax.tree.map(lambda *leaves: np.asarray(leaves), *configs), 0


def run_keys(experiment: Experiment) -> jax.Array:
    """PRNG keys [runs]: ``seeds`` keys split from ``seed``, repeated for each grid point."""
    keys = jax.random.split(jax.random.key(experiment.seed), experiment.seeds)
    return jnp.concatenate([keys] * (experiment.num_runs // experiment.seeds))


def init_states(experiment: Experiment) -> TrainState:
    """Fresh TrainStates for every run, batched along a leading axis [runs]."""
    config, axes = run_config(experiment)
    init = jax.jit(jax.vmap(init_state, in_axes=(axes, 0)))
    return init(config, run_keys(experiment))


def init_states_compiling(
    experiment: Experiment, compile_for: Callable[[Any], Any]
) -> tuple[TrainState, Any]:
    """``init_states(experiment)`` and ``compile_for(template)`` at once, ``template`` being
    the states' shapes and dtypes: the second runs in a thread while the init program compiles
    and runs. XLA compiles outside the GIL, so on a fresh run the chunk runner's compile hides
    the init program's."""
    config, axes = run_config(experiment)
    keys = run_keys(experiment)
    lowered = jax.jit(jax.vmap(init_state, in_axes=(axes, 0))).lower(config, keys)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ppojax-compile") as pool:
        compiling = pool.submit(compile_for, lowered.out_info)
        states = lowered.compile()(config, keys)
        return states, compiling.result()


def state_template(experiment: Experiment) -> TrainState:
    """Shapes and dtypes of ``init_states(experiment)``, without computing it."""
    return jax.eval_shape(functools.partial(init_states, experiment))


Reporter = Callable[..., None]


def update_one_run(
    config: PPOConfig, state: TrainState, eval_due: jax.Array | None
) -> tuple[TrainState, Metrics]:
    """One update of one run (the function vmapped over runs; ``eval_due`` is not batched, so
    that updates without an evaluation skip it)."""
    return train_step(make_agent(config), make_optimizer(config), config, state, eval_due)


def run_chunk(
    config: PPOConfig,
    state: TrainState,
    first: jax.Array,
    count: jax.Array,
    length: int,
    config_axes: int | None = None,
    report: Reporter | None = None,
    report_every: int = 1,
) -> tuple[TrainState, Metrics]:
    """Up to ``length`` updates (static) of every run from ``state`` [runs] (after ``first``
    updates), of which the first ``count`` run. ``config`` is batched along ``config_axes``.
    After every update whose number is a multiple of ``report_every``,
    ``report(update number, episode_return [runs])`` runs on the host; with evaluation, also
    after every evaluation, as ``report(update number, episode_return, eval_return)``.

    The scan is outside the vmap over runs so that a report is one callback, not one per run.
    Metrics are [runs, length]; entries past ``count`` are zeros to be dropped.
    """
    step = jax.vmap(update_one_run, in_axes=(config_axes, 0, None))
    _, metric_shapes = jax.eval_shape(step, config, state, jnp.bool_(False))

    def skip(carry: TrainState) -> tuple[TrainState, Metrics]:
        return carry, jax.tree.map(lambda leaf: jnp.zeros(leaf.shape, leaf.dtype), metric_shapes)

    def body(carry: TrainState, index: jax.Array) -> tuple[TrainState, Metrics]:
        update = first + index + 1
        evaluates = eval_due(config, update)
        carry, metrics = jax.lax.cond(
            index < count, lambda state: step(config, state, evaluates), skip, carry
        )
        if report is not None:
            due = update % report_every == 0
            due = (index < count) & (due if evaluates is None else due | evaluates)
            values = [
                metrics[name] for name in ("episode_return", "eval_return") if name in metrics
            ]
            jax.lax.cond(due, lambda: jax.debug.callback(report, update, *values), lambda: None)
        return carry, metrics

    state, metrics = jax.lax.scan(body, state, jnp.arange(length))
    return state, jax.tree.map(lambda leaf: jnp.moveaxis(leaf, 0, 1), metrics)


def chunk_runner(
    experiment: Experiment, length: int, report: Reporter | None = None, report_every: int = 1
) -> Callable[..., Any]:
    """``runner(config, state, first, count)`` over all runs: jit(run_chunk) for ``length``."""
    _, axes = run_config(experiment)
    return jax.jit(
        functools.partial(
            run_chunk,
            length=length,
            config_axes=axes,
            report=report,
            report_every=report_every,
        )
    )


def chunk_length(num_updates: int, checkpoint_every: int | None) -> int:
    """Updates per compiled chunk: ``checkpoint_every``, or all of them in one call."""
    return min(checkpoint_every or num_updates, num_updates)


def report_interval(num_updates: int, reports: int) -> int:
    """Updates between progress reports, for about ``reports`` reports over the run."""
    return max(1, math.ceil(num_updates / reports))


def chunk_plan(
    start: int, stop: int, length: int, checkpoint_every: int | None
) -> list[tuple[int, int]]:
    """(first update, count) for each chunk from ``start`` to ``stop``; chunks never cross a
    multiple of ``checkpoint_every``, so every checkpoint falls on a chunk's end."""
    plan, first = [], start
    while first < stop:
        end = min(first + length, stop)
        if checkpoint_every:
            end = min(end, (first // checkpoint_every + 1) * checkpoint_every)
        plan.append((first, end - first))
        first = end
    return plan


ChunkCallback = Callable[[int, TrainState, dict[str, np.ndarray]], None]


def train_chunks(
    runner: Callable[..., Any],
    config: PPOConfig,
    state: TrainState,
    plan: Sequence[tuple[int, int]],
    on_chunk: ChunkCallback,
) -> TrainState:
    """Run the chunks of ``plan`` and call ``on_chunk(first_update, state, metrics)`` after
    each, with host metrics [runs, count]. The next chunk is dispatched before the host handles
    the last one, so the device never waits for the progress bar or the files."""
    pending = None
    for first, count in plan:
        state, metrics = runner(config, state, first, count)
        if pending is not None:
            _deliver(on_chunk, *pending)
        pending = (first, count, state, metrics)
    if pending is not None:
        _deliver(on_chunk, *pending)
    return state


def _deliver(
    on_chunk: ChunkCallback, first: int, count: int, state: TrainState, metrics: Metrics
) -> None:
    metrics = jax.device_get(metrics)
    # Documented metrics first, in their documented order, then any others.
    names = [name for name in METRIC_NAMES + EVAL_METRIC_NAMES if name in metrics]
    names += sorted(set(metrics) - set(names))
    host = {name: np.asarray(metrics[name])[:, :count] for name in names}
    on_chunk(first, state, host)


class ProgressBar:
    """A tqdm bar over env steps (all runs together) with steps/s, the latest mean return and
    the latest mean evaluation return (with ``eval_every``), fed by ``report`` from inside the
    compiled loop and by ``chunk_done`` after each chunk. ``open`` shows it, once compiling is
    done, so that steps/s counts training only."""

    def __init__(
        self, num_updates: int, start: int, steps_per_update: int, description: str
    ) -> None:
        self.num_updates, self.description = num_updates, description
        self.steps_per_update = steps_per_update
        self.update_number = start
        # Reports arrive on an XLA thread while the main thread may be finishing a chunk.
        self.lock = threading.Lock()
        self.bar: Any = None
        self.shown: dict[str, float] = {}

    def open(self) -> None:
        from tqdm import tqdm

        self.bar = tqdm(
            total=self.num_updates * self.steps_per_update,
            initial=self.update_number * self.steps_per_update,
            desc=self.description,
            unit="step",
            unit_scale=True,
            dynamic_ncols=True,
            mininterval=0.5,
        )

    def report(
        self, update: jax.Array, episode_returns: jax.Array, eval_returns: Any = None
    ) -> None:
        """Every run's mean episode return [runs] at ``update`` (NaN where none ended), and
        its evaluation return [runs] (NaN without an evaluation at this update)."""
        with self.lock:
            self.show_return("return", np.asarray(episode_returns))
            if eval_returns is not None:
                self.show_return("eval", np.asarray(eval_returns))
            self.advance(int(update))

    def chunk_done(
        self, update: int, returns: np.ndarray, eval_returns: np.ndarray | None = None
    ) -> None:
        """A chunk ended at ``update``; ``returns`` [runs, updates] are its episode returns,
        ``eval_returns`` [runs, updates] its evaluation returns."""
        with self.lock:
            self.show_return("return", latest_finite(returns))
            if eval_returns is not None:
                self.show_return("eval", latest_finite(eval_returns))
            self.advance(update)

    def show_return(self, label: str, values: np.ndarray) -> None:
        """Show the mean of the finite ``values`` [runs] as ``label``; keep the old one if
        none is finite."""
        if not np.isfinite(values).any():
            return
        self.shown[label] = float(np.nanmean(values))
        text = ", ".join(f"{name} {value:.1f}" for name, value in self.shown.items())
        self.bar.set_postfix_str(text, refresh=False)

    def advance(self, update: int) -> None:
        if update > self.update_number:
            self.bar.update((update - self.update_number) * self.steps_per_update)
            self.update_number = update

    def write(self, message: str) -> None:
        """A line on stderr above the bar."""
        from tqdm import tqdm

        with self.lock:
            tqdm.write(message, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def latest_finite(returns: np.ndarray) -> np.ndarray:
    """Each run's last finite value along the update axis ([runs, U] -> [runs]); NaN if none."""
    finite = np.isfinite(returns)
    last = returns.shape[1] - 1 - np.argmax(finite[:, ::-1], axis=1)
    values = returns[np.arange(returns.shape[0]), last]
    return np.where(finite.any(axis=1), values, np.nan)


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How to run an experiment: progress bar (about ``progress_reports`` updates of it over the
    run), checkpoints every N updates (the final state is always saved when there is a run
    folder), how many to keep (None: all), TensorBoard, Weights & Biases (``wandb``: where to
    log, None: not at all; see ``ppojax.wandb_logger``), and the modules that register the env
    (``--env-module``; recorded in run.json, imported again by ``--resume`` and ``load``)."""

    progress: bool = True
    checkpoint_every: int | None = None
    keep_checkpoints: int | None = 3
    tensorboard: bool = False
    progress_reports: int = 50
    wandb: WandbOptions | None = None
    env_modules: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("progress", "tensorboard"):
            check_bool("RunOptions", name, getattr(self, name))
        for name in ("checkpoint_every", "keep_checkpoints"):
            if getattr(self, name) is not None:
                check_positive_int("RunOptions", name, getattr(self, name))
        check_positive_int("RunOptions", "progress_reports", self.progress_reports)
        if self.wandb is not None and not isinstance(self.wandb, WandbOptions):
            raise TypeError(
                f"RunOptions.wandb must be WandbOptions or None, got {show(self.wandb)}"
            )


@dataclasses.dataclass
class RunResult:
    """A finished experiment: final states [runs] and metrics [runs, updates] of the whole run
    (earlier sessions' included after a resume); timings and env steps of this session.
    ``compile_seconds`` runs until the first update can start: on a fresh run it includes the
    init program, which compiles and runs while the chunk runner compiles."""

    experiment: Experiment
    run_dir: Path | None
    runs: list[dict[str, Any]]
    state: TrainState
    metrics: dict[str, np.ndarray]
    compile_seconds: float
    run_seconds: float
    env_steps: int
    resumed_from: int | None = None

    @property
    def divergence(self) -> list[dict[str, Any]]:
        """Per run: the steps the divergence guard skipped, the first update that skipped any
        and whether the run recovered (see ``divergence_report``)."""
        return divergence_report(self.metrics.get("nonfinite_steps"))

    @property
    def diverged_runs(self) -> list[int]:
        """The runs that never recovered: their last update skipped steps."""
        return [row["run"] for row in self.divergence if not row["recovered"]]


def divergence_report(nonfinite: np.ndarray | None) -> list[dict[str, Any]]:
    """Per run, from ``nonfinite_steps`` [runs, U]: the minibatch steps the guard skipped in
    all, the first update (counted from 1) that skipped any (None if none did), the steps its
    last update skipped, and ``recovered``: whether that last update skipped none. A run
    whose last update still skipped steps has not recovered, whatever happened before."""
    if nonfinite is None:
        return []
    rows = []
    for run, counts in enumerate(np.asarray(nonfinite)):
        hits = np.flatnonzero(counts > 0)
        last = int(counts[-1]) if counts.size else 0
        rows.append(
            {
                "run": run,
                "nonfinite_steps": int(counts.sum()),
                "first_update": int(hits[0]) + 1 if hits.size else None,
                "last_update_skipped": last,
                "recovered": last == 0,
            }
        )
    return rows


class TensorBoardLog:
    """TensorBoard event files, one folder per run, every metric against env steps."""

    def __init__(self, run_dir: Path, runs: Sequence[dict[str, Any]]) -> None:
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            raise ValueError(
                "--tensorboard needs tensorboardX: pip install 'ppojax[tensorboard]'"
            ) from None
        folder = Path(run_dir) / io.TENSORBOARD_DIR
        self.writers = [SummaryWriter(str(folder / f"run-{run['run']}")) for run in runs]

    def write(self, first: int, metrics: dict[str, np.ndarray], batch_size: int) -> None:
        for run, writer in enumerate(self.writers):
            for offset in range(next(iter(metrics.values())).shape[1]):
                step = (first + offset + 1) * batch_size
                for name, values in metrics.items():
                    value = float(values[run, offset])
                    # NaN marks an update without an evaluation: no point to draw.
                    if name not in EVAL_METRIC_NAMES or np.isfinite(value):
                        writer.add_scalar(name, value, step)

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


class ChunkHandler:
    """What happens on the host after each chunk: keep the metrics, advance the progress bar,
    append to metrics.csv and TensorBoard, and checkpoint on multiples of checkpoint_every."""

    def __init__(
        self, experiment: Experiment, run_dir: Path | None, options: RunOptions, start: int
    ) -> None:
        self.experiment, self.run_dir, self.options = experiment, run_dir, options
        self.runs = run_table(experiment)
        # Grid values get a prefix: a swept field can share its name with a metric
        # (learning_rate is both).
        self.columns = [
            {
                name if name in ("run", "seed") else f"grid_{name}": value
                for name, value in run.items()
            }
            for run in self.runs
        ]
        self.chunks: list[dict[str, np.ndarray]] = []
        self.warned_divergence = False
        # A resumed run starts from a checkpoint that is already on disk.
        self.saved_step: int | None = start or None
        self.bar = self.checkpoints = self.tensorboard = self.wandb = None
        config = experiment.config
        if options.progress:
            steps_per_update = experiment.num_runs * config.batch_size
            description = f"{config.env_id} x{experiment.num_runs}"
            self.bar = ProgressBar(config.num_updates, start, steps_per_update, description)
        if run_dir is not None:
            self.checkpoints = io.open_checkpoints(
                run_dir, options.keep_checkpoints, clean=True, record=run_record(experiment)
            )
            if options.tensorboard:
                self.tensorboard = TensorBoardLog(run_dir, self.runs)
        if options.wandb is not None:
            self.wandb = WandbLog(options.wandb, config, self.runs, run_dir)

    def __call__(self, first: int, state: TrainState, metrics: dict[str, np.ndarray]) -> None:
        count = next(iter(metrics.values())).shape[1]
        config = self.experiment.config
        self.chunks.append(metrics)
        if self.run_dir is not None:
            header = io.metrics_header(self.columns, list(metrics))
            io.append_metrics(
                self.run_dir / io.METRICS_FILE, header, io.metric_rows(self.columns, first, metrics)
            )
        if self.tensorboard is not None:
            self.tensorboard.write(first, metrics, config.batch_size)
        if self.wandb is not None:
            self.wandb.log(first, metrics)
        every = self.options.checkpoint_every
        if self.checkpoints is not None and every and (first + count) % every == 0:
            self.save(first + count, state)
        if self.bar is not None:
            self.bar.chunk_done(
                first + count, metrics["episode_return"], metrics.get("eval_return")
            )
        self.note_divergence(first, metrics)

    def note_divergence(self, first: int, metrics: dict[str, np.ndarray]) -> None:
        """Say on stderr, once, that the guard skipped steps (an overnight run shows it long
        before its end): the first such update of the chunk and its run."""
        skipped = metrics.get("nonfinite_steps")
        if self.warned_divergence or skipped is None or not skipped.any():
            return
        self.warned_divergence = True
        offset, run = np.argwhere(skipped.T > 0)[0]
        message = (
            f"ppojax: at update {first + offset + 1} the divergence guard skipped "
            f"{int(skipped[run, offset])} minibatch step(s) of run {run} (a NaN or inf in the "
            "loss, gradients or parameters); training goes on from the last finite parameters"
        )
        if self.bar is not None:
            self.bar.write(message)
        else:
            print(message, file=sys.stderr, flush=True)

    def save(self, step: int, state: TrainState) -> None:
        io.save_checkpoint(self.checkpoints, step, state)
        self.saved_step = step

    def finish(self, state: TrainState) -> dict[str, np.ndarray]:
        """Save the final state and close; this session's metrics [runs, U]."""
        final = self.experiment.config.num_updates
        if self.checkpoints is not None and self.saved_step != final:
            self.save(final, state)
        self.close(failed=False)
        if not self.chunks:
            return {}
        return {name: np.concatenate([c[name] for c in self.chunks], 1) for name in self.chunks[0]}

    def close(self, failed: bool = True) -> None:
        """Close the checkpoint manager, TensorBoard files and the bar (also after an error);
        W&B runs only when ``failed`` (a finished experiment closes them in ``finish_wandb``,
        with its summary)."""
        if self.checkpoints is not None:
            self.checkpoints.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.bar is not None:
            self.bar.close()
        if self.wandb is not None and failed:
            self.wandb.abort()

    def finish_wandb(self, result: RunResult) -> None:
        """The W&B summaries of a finished experiment, then close its W&B runs."""
        if self.wandb is not None:
            self.wandb.finish(result.metrics, result.diverged_runs)


def run_experiment(
    experiment: Experiment, run_dir: Path | None = None, options: RunOptions | None = None
) -> RunResult:
    """Train every run of ``experiment`` from scratch; with ``run_dir``, fill that folder
    (config.json, run.json, metrics.csv, checkpoints, learning_curve.png, summary.json),
    which must not hold a run already."""
    options = options or RunOptions()
    if run_dir is not None:
        run_dir = Path(run_dir)
        if (run_dir / io.CONFIG_FILE).exists():
            raise ValueError(f"{run_dir} already holds a run: resume it or train into a new folder")
        io.check_out_dir(run_dir)
        check_env(experiment.config)
        run_dir.mkdir(parents=True, exist_ok=True)
        io.write_json(run_dir / io.CONFIG_FILE, io.config_to_dict(experiment.config))
        io.write_json(run_dir / io.RUN_FILE, run_settings(experiment, options))
    return continue_experiment(experiment, run_dir, options, None, 0, {})


def resume_experiment(run_dir: Path, options: RunOptions | None = None) -> RunResult:
    """Continue the run in ``run_dir`` from its newest complete checkpoint to the end. The
    result is the same as the uninterrupted run's: the chunks run the same compiled program.

    Nothing in the folder changes until every file it needs reads back: config.json and
    run.json that no longer match the checkpoints (an edited num_envs) raise
    ``RunMismatchError`` naming the fields; a damaged config.json, run.json or metrics.csv
    raises ``ValueError`` naming the file and field. A checkpoint that does not read back
    (truncated, changed, half deleted) is passed over for the one before it, with a
    ``CheckpointWarning``, and moved to ``checkpoints-unreadable/``; with no complete
    checkpoint the run starts again at update 0. Metric rows written after the checkpoint are
    dropped."""
    run_dir = Path(run_dir)
    experiment, saved_options = read_experiment(run_dir)
    options = options or saved_options
    check_record(run_dir, experiment)
    state, step, unreadable = io.restore_newest(run_dir, state_template(experiment))
    metrics_path = run_dir / io.METRICS_FILE
    history: dict[str, np.ndarray] = {}
    if step > 0:
        header, rows, history = io.metrics_until(metrics_path, step, experiment.num_runs)
    for path in io.set_aside(run_dir, unreadable):
        warnings.warn(f"moved the unreadable checkpoint to {path}", io.CheckpointWarning, 2)
    if state is None:
        warnings.warn(
            f"{run_dir} has no complete checkpoint: training again from update 0",
            io.CheckpointWarning,
            stacklevel=2,
        )
    if step > 0:
        io.write_metrics(metrics_path, header, rows)
    else:  # from update 0 the rows so far (perhaps one cut short) are all dropped
        metrics_path.unlink(missing_ok=True)
    return continue_experiment(experiment, run_dir, options, state, step, history)


def continue_experiment(
    experiment: Experiment,
    run_dir: Path | None,
    options: RunOptions,
    state: TrainState | None,
    start: int,
    history: dict[str, np.ndarray],
) -> RunResult:
    """Train from update ``start`` (``state`` batched over runs; None: fresh states, made
    while the chunk runner compiles) to the end; ``history`` holds the metrics [runs, start]
    of the updates before."""
    config, _ = run_config(experiment)
    num_updates = experiment.config.num_updates
    length = chunk_length(num_updates, options.checkpoint_every)
    handler = ChunkHandler(experiment, run_dir, options, start)
    report = handler.bar.report if handler.bar is not None else None
    every = report_interval(num_updates, options.progress_reports)
    if report is not None and cache.cache_enabled():
        # JAX's compilation cache does not store programs that call back to the host: feed
        # the bar between chunks of `every` updates instead (the same numbers, see run_chunk).
        length, report = min(length, every), None
    plan = chunk_plan(start, num_updates, length, options.checkpoint_every)
    try:
        begin = time.perf_counter()
        runner = chunk_runner(experiment, length, report, every)

        def compile_for(template: Any) -> Any:
            return runner.lower(config, template, 0, 0).compile()

        if state is None:
            state, compiled = init_states_compiling(experiment, compile_for)
        else:
            compiled = compile_for(state)
        compile_seconds = time.perf_counter() - begin
        if handler.bar is not None:
            handler.bar.open()
        begin = time.perf_counter()
        state = jax.block_until_ready(train_chunks(compiled, config, state, plan, handler))
        run_seconds = time.perf_counter() - begin
    except BaseException:
        # Interrupted or failed: keep the checkpoints saved so far, but never save the
        # unfinished state as the final one.
        handler.close()
        raise
    session = handler.finish(state)
    metrics = {
        name: np.concatenate([history[name], values], 1) if name in history else values
        for name, values in session.items()
    } or history
    result = RunResult(
        experiment=experiment,
        run_dir=run_dir,
        runs=run_table(experiment),
        state=state,
        metrics=metrics,
        compile_seconds=compile_seconds,
        run_seconds=run_seconds,
        env_steps=(num_updates - start) * experiment.num_runs * experiment.config.batch_size,
        resumed_from=start or None,
    )
    handler.finish_wandb(result)
    if run_dir is not None:
        write_report(result)
    return result


def run_settings(experiment: Experiment, options: RunOptions) -> dict[str, Any]:
    """run.json: what, besides the config, a resume needs to rebuild the experiment."""
    return {
        "seeds": experiment.seeds,
        "seed": experiment.seed,
        "grid": {name: list(values) for name, values in experiment.grid.items()},
        "checkpoint_every": options.checkpoint_every,
        "keep_checkpoints": options.keep_checkpoints,
        "tensorboard": options.tensorboard,
        "env_modules": list(env_modules(experiment.config.env_id, options.env_modules)),
    }


def _is_int(value: Any, low: int, high: float = math.inf) -> bool:
    return type(value) is int and low <= value <= high


def _is_grid(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(values, list) and values and all(type(item) in (int, float) for item in values)
        for values in value.values()
    )


# run.json's fields: (what each must be, its check).
RUN_FIELDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "seeds": ("a positive int", lambda value: _is_int(value, 1)),
    "seed": (f"an int in [0, {MAX_SEED}]", lambda value: _is_int(value, 0, MAX_SEED)),
    "grid": (
        "an object of PPOConfig fields to lists of numbers ({} for none)",
        _is_grid,
    ),
    "checkpoint_every": ("a positive int or null", lambda v: v is None or _is_int(v, 1)),
    "keep_checkpoints": ("a positive int or null (all)", lambda v: v is None or _is_int(v, 1)),
    "tensorboard": ("true or false", lambda value: type(value) is bool),
}


def read_run_settings(path: Path) -> dict[str, Any]:
    """run.json, every field checked; a ``ValueError`` naming the file and the field."""
    settings = io.read_json_object(path, "run settings (seeds, seed, grid, checkpoints)")
    for name, (kind, valid) in RUN_FIELDS.items():
        if name not in settings:
            raise ValueError(f"{path} has no field {name!r} ({kind})")
        if not valid(settings[name]):
            raise ValueError(f"{path}: field {name!r} must be {kind}, got {show(settings[name])}")
    return settings


def env_modules_of(path: Path, settings: dict[str, Any]) -> tuple[str, ...]:
    """run.json's ``env_modules`` (absent in run folders from before it existed: none)."""
    modules = settings.get("env_modules", [])
    if not isinstance(modules, list) or not all(isinstance(name, str) for name in modules):
        raise ValueError(f"{path}: field 'env_modules' must be a list of module names")
    return tuple(modules)


def read_config(path: Path) -> PPOConfig:
    """config.json as a validated PPOConfig; errors name the file."""
    settings = io.read_json_object(path, "PPOConfig fields")
    try:
        return io.config_from_dict(settings)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{path}: {error}") from None


def read_experiment(run_dir: Path) -> tuple[Experiment, RunOptions]:
    """The experiment and options a run folder was started with; a ``ValueError`` naming the
    file and field when config.json or run.json is missing, empty or damaged. The env modules
    run.json records are imported first when the env id is not registered yet."""
    run_dir = Path(run_dir)
    if not (run_dir / io.CONFIG_FILE).exists() and not (run_dir / io.RUN_FILE).exists():
        raise ValueError(f"{run_dir} is not a ppojax run folder (no config.json / run.json)")
    path = run_dir / io.RUN_FILE
    settings = read_run_settings(path)
    modules = env_modules_of(path, settings)
    saved = io.read_json_object(run_dir / io.CONFIG_FILE, "PPOConfig fields")
    if not env_id_known(saved.get("env_id", "CartPole-v1")):
        import_env_modules(modules, str(path))
    config = read_config(run_dir / io.CONFIG_FILE)
    grid = {name: tuple(values) for name, values in settings["grid"].items()}
    try:
        experiment = Experiment(config, settings["seeds"], settings["seed"], grid)
    except ValueError as error:
        raise ValueError(f"{path}: field 'grid': {error}") from None
    options = RunOptions(
        checkpoint_every=settings["checkpoint_every"],
        keep_checkpoints=settings["keep_checkpoints"],
        tensorboard=settings["tensorboard"],
        env_modules=modules,
    )
    return experiment, options


class RunMismatchError(ValueError):
    """config.json or run.json no longer matches the checkpoints of its run folder."""


def run_record(experiment: Experiment) -> dict[str, Any]:
    """What fixes a run's state, as saved in each checkpoint's manifest: every config field
    and the seeds, base seed and grid of run.json."""
    return {
        "config": io.config_to_dict(experiment.config),
        "seeds": experiment.seeds,
        "seed": experiment.seed,
        "grid": {name: list(values) for name, values in experiment.grid.items()},
    }


def record_differences(
    now: dict[str, Any], saved: dict[str, Any]
) -> list[tuple[str, str, Any, Any]]:
    """(file, field, value now, value saved) for each field of ``now`` that ``saved`` holds
    with another value (a field only one of them knows, from another ppojax version, is not
    compared)."""
    saved_config = saved.get("config") if isinstance(saved.get("config"), dict) else {}
    pairs = [
        (io.CONFIG_FILE, name, value, saved_config.get(name, value))
        for name, value in now["config"].items()
    ]
    pairs += [
        (io.RUN_FILE, name, now[name], saved.get(name, now[name]))
        for name in ("seeds", "seed", "grid")
    ]
    return [pair for pair in pairs if pair[2] != pair[3]]


def check_record(run_dir: Path, experiment: Experiment) -> None:
    """Raise ``RunMismatchError`` naming the fields when config.json or run.json differ from
    what the checkpoints of ``run_dir`` were saved with (read-only)."""
    now = run_record(experiment)
    for step, saved in io.checkpoint_records(run_dir):
        differences = record_differences(now, saved)
        if differences:
            raise RunMismatchError(mismatch_message(run_dir, step, differences))


def mismatch_message(run_dir: Path, step: int, differences: list[tuple[str, str, Any, Any]]) -> str:
    """What differs between the run folder's files and its checkpoint ``step``, and the fix."""
    files = " and ".join(sorted({file for file, *_ in differences}))
    changed = "; ".join(
        f"{name} is {now!r} in {file}, {saved!r} in checkpoint {step}"
        for file, name, now, saved in differences
    )
    restore = ", ".join(f"{name} {saved!r}" for _, name, _, saved in differences)
    verb = "match" if " and " in files else "matches"
    return (
        f"{run_dir}: {files} no longer {verb} the run's checkpoints: {changed}. Nothing was "
        f"changed. To resume, restore {files} ({restore}); to train with the new settings, "
        f"start a new run with --config {run_dir / io.CONFIG_FILE}"
    )


def check_env(config: PPOConfig) -> None:
    """Build ``config``'s env and networks, so that one that cannot be built (an env that
    downloads its data, offline) fails before a run folder is made."""
    make_agent(config)


def point_label(point: dict[str, float]) -> str:
    """A grid point as ``name=value, ...``."""
    return ", ".join(f"{name}={value:g}" for name, value in point.items())


def final_return_table(result: RunResult, metric: str = "episode_return") -> list[dict[str, Any]]:
    """Per grid point (one row without a grid): its values, each seed's final return (mean of
    its last 10 updates; for ``metric="eval_return"`` its last evaluation), and their mean and
    standard deviation over seeds."""
    values = result.metrics[metric]
    finals = latest_finite(values) if metric == "eval_return" else io.final_returns(values)
    seeds = result.experiment.seeds
    rows = []
    for index, point in enumerate(grid_points(result.experiment.grid)):
        per_seed = finals[index * seeds : (index + 1) * seeds]
        rows.append(
            {
                "point": point,
                "per_seed": [float(value) for value in per_seed],
                "mean": float(np.nanmean(per_seed)) if np.isfinite(per_seed).any() else None,
                "std": float(np.nanstd(per_seed)) if np.isfinite(per_seed).any() else None,
            }
        )
    return rows


def curves_by_point(experiment: Experiment, values: np.ndarray) -> dict[str, np.ndarray]:
    """A metric [runs, U] as {grid point label (the env id without a grid): [seeds, U]}."""
    curves = {}
    for index, point in enumerate(grid_points(experiment.grid)):
        rows = slice(index * experiment.seeds, (index + 1) * experiment.seeds)
        curves[point_label(point) or experiment.config.env_id] = values[rows]
    return curves


def write_report(result: RunResult) -> None:
    """learning_curve.png and summary.json in the run folder."""
    experiment, config = result.experiment, result.experiment.config
    returns = result.metrics["episode_return"]
    env_steps = (np.arange(returns.shape[1]) + 1) * config.batch_size
    evaluated = "eval_return" in result.metrics
    io.plot_learning_curves(
        curves_by_point(experiment, returns),
        env_steps,
        result.run_dir / io.CURVE_FILE,
        f"ppojax PPO on {config.env_id}",
        curves_by_point(experiment, result.metrics["eval_return"]) if evaluated else None,
    )
    summary = {
        "env_id": config.env_id,
        "runs": experiment.num_runs,
        "seeds": experiment.seeds,
        "grid": {name: list(values) for name, values in experiment.grid.items()},
        "num_updates": config.num_updates,
        "env_steps_per_run": config.num_updates * config.batch_size,
        "final_return": final_return_table(result),
        "final_eval_return": final_return_table(result, "eval_return") if evaluated else None,
        "compile_seconds": round(result.compile_seconds, 3),
        "run_seconds": round(result.run_seconds, 3),
        "env_steps_this_session": result.env_steps,
        "env_steps_per_second": round(result.env_steps / max(result.run_seconds, 1e-9)),
        "resumed_from_update": result.resumed_from,
        "divergence": result.divergence,
        "diverged_runs": result.diverged_runs,
        "finished_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": io.versions(),
    }
    io.write_json(result.run_dir / io.SUMMARY_FILE, summary)
