"""Experiments: seeds and a grid of hyperparameters trained as one vmapped, compiled program.

Progress reaches the host from inside the compiled loop: every few updates a
``jax.debug.callback`` hands the update number and the mean episode return to the progress
bar; with the compilation cache on (``ppojax.runtime.cache``), which does not store programs
with host callbacks, the updates run in chunks of one report interval instead. Checkpoints need the
state on the host, so with ``checkpoint_every`` the updates run in chunks of one compiled
program (``ppojax.runs.loop.scan_chunk``), so every chunk, the last partial one included,
reuses the same executable, and chunked updates give the same numbers as one call.

Where the process has several devices (GPUs, or CPU devices from
``compiling.use_cpu_devices``), the runs are split along their axis over as many of them as
divide the runs evenly (``sharding.runs_sharding``); each device trains its share, compiled once.
"""

from __future__ import annotations

import concurrent.futures
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

from ppojax.ppo.config import PPOConfig
from ppojax.ppo.evaluation import EVAL_METRIC_NAMES
from ppojax.ppo.summary import final_return, grid_points, latest_finite, point_label
from ppojax.ppo.train import eval_due, init_state, make_agent, train_step
from ppojax.ppo.types import METRIC_NAMES, Metrics, TrainState
from ppojax.ppo.update import make_optimizer
from ppojax.runs import folder
from ppojax.runs.loop import chunk_plan, resume_point, scan_chunk, train_chunks
from ppojax.runs.options import RunOptions
from ppojax.runs.plots import plot_learning_curves
from ppojax.runs.progress import BAR_METRICS, ChunkHandler, divergence_report
from ppojax.runs.settings import (  # noqa: F401  (MAX_SEED, RunMismatchError: re-exported)
    MAX_SEED,
    Experiment,
    RunMismatchError,
    check_record,
    read_experiment,
    run_record,
    run_settings,
    run_table,
)
from ppojax.runs.summary import write_summary
from ppojax.runtime import cache, sharding
from ppojax.runtime.compiling import compiler_options


def batched_config(experiment: Experiment) -> tuple[PPOConfig, int | None]:
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


def init_program(experiment: Experiment) -> tuple[Any, tuple[PPOConfig, jax.Array]]:
    """The jitted function that makes every run's fresh TrainState, and its arguments."""
    config, axes = batched_config(experiment)
    init = sharding.jit_over_runs(jax.vmap(init_state, in_axes=(axes, 0)), experiment.num_runs)
    return init, (config, run_keys(experiment))


def init_states(experiment: Experiment) -> TrainState:
    """Fresh TrainStates for every run, batched along a leading axis [runs]."""
    init, args = init_program(experiment)
    return init(*args)


def init_states_compiling(
    experiment: Experiment, compile_for: Callable[[Any], Any]
) -> tuple[TrainState, Any]:
    """``init_states(experiment)`` and ``compile_for(template)`` at once, ``template`` being
    the states' shapes and dtypes: the second runs in a thread while the init program compiles
    and runs. XLA compiles outside the GIL, so on a fresh run the chunk runner's compile hides
    the init program's."""
    init, args = init_program(experiment)
    lowered = init.lower(*args)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ppojax-compile") as pool:
        compiling = pool.submit(compile_for, lowered.out_info)
        states = lowered.compile()(*args)
        return states, compiling.result()


def state_template(experiment: Experiment) -> TrainState:
    """Shapes and dtypes of ``init_states(experiment)``, without computing it."""
    init, args = init_program(experiment)
    return jax.eval_shape(init, *args)


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
    updates), of which the first ``count`` run (``loop.scan_chunk``). ``config`` is batched
    along ``config_axes``. After every update whose number is a multiple of ``report_every``,
    ``report(update number, {metric: [runs]})`` runs on the host with the progress bar's
    metrics (``BAR_METRICS``); with evaluation also after every evaluation.

    The scan is outside the vmap over runs so that a report is one callback, not one per run.
    Metrics are [runs, length]; entries past ``count`` are zeros to be dropped.
    """
    step = jax.vmap(update_one_run, in_axes=(config_axes, 0, None))

    def ppo_update(config: PPOConfig, state: TrainState, number: jax.Array) -> Any:
        return step(config, state, eval_due(config, number + 1))

    def report_due(config: PPOConfig, number: jax.Array, metrics: Metrics, ran: jax.Array) -> None:
        update = number + 1
        evaluates = eval_due(config, update)
        due = update % report_every == 0
        due = ran & (due if evaluates is None else due | evaluates)
        values = {name: metrics[name] for name in BAR_METRICS if name in metrics}
        jax.lax.cond(due, lambda: jax.debug.callback(report, update, values), lambda: None)

    after = None if report is None else report_due
    return scan_chunk(ppo_update, config, state, first, count, length, after)


def chunk_runner(
    experiment: Experiment, length: int, report: Reporter | None = None, report_every: int = 1
) -> Callable[..., Any]:
    """``runner(config, state, first, count)`` over all runs: jit(run_chunk) for ``length``."""
    _, axes = batched_config(experiment)
    return sharding.jit_over_runs(
        functools.partial(
            run_chunk,
            length=length,
            config_axes=axes,
            report=report,
            report_every=report_every,
        ),
        experiment.num_runs,
    )


def chunk_length(num_updates: int, checkpoint_every: int | None) -> int:
    """Updates per compiled chunk: ``checkpoint_every``, or all of them in one call."""
    return min(checkpoint_every or num_updates, num_updates)


def report_interval(num_updates: int, reports: int) -> int:
    """Updates between progress reports, for about ``reports`` reports over the run."""
    return max(1, math.ceil(num_updates / reports))


@dataclasses.dataclass
class RunResult:
    """A finished experiment: final states [runs] and metrics [runs, updates] of the whole run
    (those before a resume included); timings and env steps of the updates this call trained.
    ``compile_seconds`` runs until the first update can start: on a fresh run it includes the
    init program, which compiles and runs while the chunk runner compiles."""

    experiment: Experiment
    run_dir: Path | None
    runs: list[dict[str, Any]]
    state: TrainState
    metrics: dict[str, np.ndarray]
    compile_seconds: float
    run_seconds: float
    resumed_from: int | None = None

    @property
    def env_steps(self) -> int:
        """Env steps of the updates this call trained, over all runs."""
        config = self.experiment.config
        updates = config.num_updates - (self.resumed_from or 0)
        return updates * self.experiment.num_runs * config.batch_size

    @property
    def divergence(self) -> list[dict[str, Any]]:
        """Per run: the steps the divergence guard skipped, the first update that skipped any
        and whether the run recovered (see ``divergence_report``)."""
        return divergence_report(self.metrics.get("nonfinite_steps"))

    @property
    def diverged_runs(self) -> list[int]:
        """The runs that never recovered: their last update skipped steps."""
        return [row["run"] for row in self.divergence if not row["recovered"]]


def run_experiment(
    experiment: Experiment, run_dir: Path | None = None, options: RunOptions | None = None
) -> RunResult:
    """Train every run of ``experiment`` from scratch; with ``run_dir``, fill that folder
    (config.json, run.json, metrics.csv, checkpoints, learning_curve.png, summary.json),
    which must not hold a run already."""
    options = options or RunOptions()
    if run_dir is not None:
        run_dir = Path(run_dir)
        if (run_dir / folder.CONFIG_FILE).exists():
            raise ValueError(f"{run_dir} already holds a run: resume it or train into a new folder")
        folder.check_out_dir(run_dir)
        check_env(experiment.config)
        if options.wandb is not None:  # run.json names the W&B runs, so a resume continues them
            options = dataclasses.replace(
                options, wandb=options.wandb.with_run_ids(experiment.num_runs)
            )
        run_dir.mkdir(parents=True, exist_ok=True)
        folder.write_json(run_dir / folder.CONFIG_FILE, folder.config_to_dict(experiment.config))
        folder.write_json(run_dir / folder.RUN_FILE, run_settings(experiment, options))
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
    state, step, history = resume_point(run_dir, state_template(experiment), experiment.num_runs)
    if options.wandb is not None and options.wandb != saved_options.wandb:
        # W&B logging added or moved on resume: run.json names the runs it now logs to
        options = dataclasses.replace(
            options, wandb=options.wandb.with_run_ids(experiment.num_runs)
        )
        folder.write_json(run_dir / folder.RUN_FILE, run_settings(experiment, options))
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
    config, _ = batched_config(experiment)
    num_updates = experiment.config.num_updates
    length = chunk_length(num_updates, options.checkpoint_every)
    runs = run_table(experiment)
    record = run_record(experiment)
    handler = ChunkHandler(experiment.config, runs, run_dir, options, start, record)
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
            lowered = runner.lower(config, template, 0, 0)
            return lowered.compile(compiler_options=compiler_options())

        if state is None:
            state, compiled = init_states_compiling(experiment, compile_for)
        else:
            state = sharding.place_runs(state, experiment.num_runs)
            compiled = compile_for(state)
        compile_seconds = time.perf_counter() - begin
        if handler.bar is not None:
            handler.bar.open()
        begin = time.perf_counter()
        order = METRIC_NAMES + EVAL_METRIC_NAMES
        state = jax.block_until_ready(train_chunks(compiled, config, state, plan, [handler], order))
        run_seconds = time.perf_counter() - begin
    except BaseException:
        # Interrupted or failed: keep the checkpoints saved so far, but never save the
        # unfinished state as the final one.
        handler.close()
        raise
    trained = handler.finish(state)
    metrics = {
        name: np.concatenate([history[name], values], 1) if name in history else values
        for name, values in trained.items()
    } or history
    result = RunResult(  # each local is named as the field it fills
        experiment, run_dir, runs, state, metrics, compile_seconds, run_seconds, start or None
    )
    handler.finish_wandb(result.metrics, result.diverged_runs)
    if run_dir is not None:
        write_report(result)
    return result


def check_env(config: PPOConfig) -> None:
    """Build ``config``'s env and networks, so that one that cannot be built (an env that
    downloads its data, offline) fails before a run folder is made."""
    make_agent(config)


def final_return_table(result: RunResult, metric: str = "episode_return") -> list[dict[str, Any]]:
    """Per grid point (one row without a grid): its values, each seed's final return (mean of
    its last 10 updates; for ``metric="eval_return"`` its last evaluation), and their mean and
    standard deviation over seeds."""
    values = result.metrics[metric]
    finals = latest_finite(values) if metric == "eval_return" else final_return(values)
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
    plot_learning_curves(
        curves_by_point(experiment, returns),
        env_steps,
        result.run_dir / folder.CURVE_FILE,
        f"ppojax PPO on {config.env_id}",
        curves_by_point(experiment, result.metrics["eval_return"]) if evaluated else None,
    )
    finals = {
        "final_return": final_return_table(result),
        "final_eval_return": final_return_table(result, "eval_return") if evaluated else None,
    }
    write_summary(
        result.run_dir,
        "update",
        config.num_updates,
        result.resumed_from or 0,
        finals,
        {"compile_seconds": result.compile_seconds, "run_seconds": result.run_seconds},
        head={
            "env_id": config.env_id,
            "runs": experiment.num_runs,
            "seeds": experiment.seeds,
            "grid": {name: list(values) for name, values in experiment.grid.items()},
        },
        extras={
            "env_steps_per_run": config.num_updates * config.batch_size,
            "env_steps_this_call": result.env_steps,
            "env_steps_per_second": round(result.env_steps / max(result.run_seconds, 1e-9)),
            "divergence": result.divergence,
            "diverged_runs": result.diverged_runs,
        },
    )
