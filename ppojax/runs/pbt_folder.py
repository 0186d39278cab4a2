"""A population-based training run and its run folder: ``ppojax.pbt`` in pieces of
``checkpoint_every`` updates, each compiled once, a checkpoint after each piece, then

config.json        the base PPOConfig
pbt.json           the search, population, interval, fraction, explore mode and seed
metrics.csv        one row per member and update (the run column is the member)
pbt.csv            one row per member and interval: its hyperparameters during the
                   interval, its score, and the member whose state it holds after it
learning_curve.png every member's return
pbt.png            every searched hyperparameter's schedule, one line per member,
                   coloured by the member's final rank
summary.json       the best member (highest final return), its final return and
                   hyperparameters, every member's final return, timings, versions
checkpoints/<n>/   the whole population after n intervals (``resume_pbt`` continues it)

With several local devices the members are split over the most of them that divide the
population evenly (``runtime.sharding.runs_sharding``), as a sweep's runs are.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ppojax.checks import ConfigError
from ppojax.ppo.config import PPOConfig
from ppojax.ppo.pbt import (
    PBTCarry,
    PBTOutput,
    PBTSettings,
    carry_shardings,
    check_settings,
    parse_search,
    pbt_intervals,
    pbt_output,
    pbt_start,
)
from ppojax.ppo.summary import final_return
from ppojax.runs import checkpoints, folder
from ppojax.runs.loggers import (
    PBT_PREFIX,
    WandbLog,
    WandbOptions,
    options_from_settings,
    wandb_settings,
)
from ppojax.runs.loop import ProgressBar, chunk_plan, train_chunks
from ppojax.runs.options import RunOptions
from ppojax.runs.plots import plot_learning_curves, plot_schedules
from ppojax.runs.summary import write_summary
from ppojax.runtime.sharding import runs_sharding

PBT_FILE = "pbt.json"
PBT_TABLE = "pbt.csv"
PBT_PLOT = "pbt.png"


def run_pbt(
    config: PPOConfig,
    search: dict[str, tuple[Any, ...]],
    population: int,
    interval: int,
    run_dir: Path,
    *,
    seed: int = 0,
    fraction: float = 0.25,
    explore_mode: str = "perturb",
    options: RunOptions | None = None,
) -> tuple[PBTOutput, dict[str, Any]]:
    """Train the population into ``run_dir`` (new, or empty); the output and summary.json.
    ``options`` (default: no progress bar) says what to show and keep: with
    ``options.wandb``, every member is also one W&B run (see ppojax.runs.loggers).

    With ``options.checkpoint_every`` (updates, a multiple of ``interval``; None: the whole
    run) the population trains in pieces of that many updates; after each, metrics.csv and
    pbt.csv hold every interval so far and the whole population is checkpointed (the newest
    ``options.keep_checkpoints``; None keeps all), so ``resume_pbt`` continues a stopped run
    to exactly the same result.
    """
    options = options or RunOptions(progress=False)
    check_settings(config, PBTSettings(population, interval, search, fraction, explore_mode))
    parse_search(config, search)  # a bad search fails before the folder is made
    if options.tensorboard:  # said, not dropped: nothing here writes TensorBoard files
        raise ConfigError(
            "tensorboard", "RunOptions.tensorboard: a PBT run writes no TensorBoard files"
        )
    checkpoint_every, wandb = options.checkpoint_every, options.wandb
    every = config.num_updates if checkpoint_every is None else checkpoint_every
    if every < interval or every % interval:
        raise ValueError(
            f"pbt checkpoint_every={checkpoint_every} must be a multiple of interval={interval}"
        )
    run_dir = Path(run_dir)
    if (run_dir / folder.CONFIG_FILE).exists():
        raise ValueError(f"{run_dir} already holds a run: train into a new folder")
    run_dir.mkdir(parents=True, exist_ok=True)
    folder.write_json(run_dir / folder.CONFIG_FILE, folder.config_to_dict(config))
    settings = {
        "search": {name: list(spec) for name, spec in search.items()},
        "population": population,
        "interval": interval,
        "fraction": fraction,
        "explore_mode": explore_mode,
        "seed": seed,
        "checkpoint_every": every,
        "keep_checkpoints": options.keep_checkpoints,
        # pbt.json names the W&B runs, so a resume logs on into them
        "wandb": wandb_settings(None if wandb is None else wandb.with_run_ids(population)),
    }
    folder.write_json(run_dir / PBT_FILE, settings)
    return train_population(run_dir, config, settings, None, options.progress)


def read_pbt_folder(run_dir: Path) -> tuple[PPOConfig, dict[str, Any]]:
    """The base config and the PBT settings of a PBT run folder."""
    run_dir = Path(run_dir)
    if not (run_dir / PBT_FILE).exists():
        raise ValueError(f"{run_dir} holds no {PBT_FILE}: it is not a PBT run folder")
    config = folder.config_from_dict(
        folder.read_json_object(run_dir / folder.CONFIG_FILE, "PPOConfig fields")
    )
    return config, folder.read_json_object(run_dir / PBT_FILE, "PBT settings")


def resume_pbt(
    run_dir: Path, progress: bool = False, wandb: WandbOptions | None = None
) -> tuple[PBTOutput, dict[str, Any]]:
    """Continue the PBT run in ``run_dir`` from its newest checkpoint that reads back (from
    the start when there is none): the same result as a run never stopped. It logs on into
    the W&B runs pbt.json names; ``wandb`` (other than those) logs to new ones from here."""
    config, settings = read_pbt_folder(run_dir)
    saved = options_from_settings(Path(run_dir) / PBT_FILE, settings.get("wandb"))
    if wandb is not None and wandb != saved:
        settings["wandb"] = wandb_settings(wandb.with_run_ids(settings["population"]))
        folder.write_json(Path(run_dir) / PBT_FILE, settings)
    template = jax.eval_shape(functools.partial(start_program(config, settings), config))
    carry, _, unreadable = checkpoints.restore_newest(run_dir, template)
    if unreadable:
        checkpoints.set_aside(run_dir, unreadable)
    return train_population(Path(run_dir), config, settings, carry, progress)


def population_mesh(settings: dict[str, Any]) -> jax.sharding.Mesh | None:
    """The devices the members are split over: None (one device) where they do not divide."""
    sharding = runs_sharding(settings["population"])
    return None if sharding is None else sharding.mesh


def pbt_settings(settings: dict[str, Any]) -> PBTSettings:
    """The ``PBTSettings`` of pbt.json's settings."""
    search = {name: tuple(spec) for name, spec in settings["search"].items()}
    return PBTSettings(
        settings["population"],
        settings["interval"],
        search,
        settings["fraction"],
        settings["explore_mode"],
    )


def start_program(config: PPOConfig, settings: dict[str, Any]):
    """``config -> PBTCarry``: the population before its first interval."""
    key = jax.random.key(settings["seed"])
    return lambda config: pbt_start(config, key, pbt_settings(settings), population_mesh(settings))


def train_population(
    run_dir: Path,
    config: PPOConfig,
    settings: dict[str, Any],
    carry: PBTCarry | None,
    progress: bool,
) -> tuple[PBTOutput, dict[str, Any]]:
    """Train from ``carry`` (None: the start) to the end through ``ppojax.runs.loop``, a piece
    of ``checkpoint_every`` updates at a time (the loop's steps are intervals), writing the
    tables and a checkpoint after each; then the plots and summary.json."""
    interval = settings["interval"]
    generations = config.num_updates // interval
    piece = settings["checkpoint_every"] // interval
    began = time.perf_counter()
    if carry is None:
        carry = jax.jit(start_program(config, settings))(config)
    mesh = population_mesh(settings)
    if mesh is not None:  # a carry read back from a checkpoint sits on one device
        carry = jax.device_put(carry, carry_shardings(carry, mesh))
    programs: dict[int, Any] = {}

    def program(count: int) -> Any:
        """``count`` intervals (static: the last piece may be shorter), compiled once."""
        if count not in programs:
            step = functools.partial(
                pbt_intervals, count=count, settings=pbt_settings(settings), mesh=mesh
            )
            programs[count] = jax.jit(step).lower(config, carry).compile()
        return programs[count]

    def runner(config: PPOConfig, carry: PBTCarry, first: int, count: int) -> Any:
        # the metrics stay in the carry's records
        return program(count)(config, carry), {}

    done = started = int(carry.generation)
    plan = chunk_plan(done, generations, piece, piece)
    if plan:
        program(plan[0][1])  # compiled here, timed apart from the run
    compiled_at = time.perf_counter()
    store = checkpoints.open_checkpoints(
        run_dir, keep=settings.get("keep_checkpoints"), clean=True, record=settings
    )
    logger = wandb_log(run_dir, config, settings, carry)
    bar = ProgressBar(
        config.num_updates,
        done * interval,
        {"best": "best"},
        unit="update",
        description=f"PBT {config.env_id}",
    )

    def keep(first: int, carry: PBTCarry, metrics: dict[str, np.ndarray]) -> None:
        done = int(carry.generation)
        write_tables(run_dir, config, carry)
        if logger is not None:
            logger.log(first * interval, wandb_metrics(carry, first, done))
        checkpoints.save_checkpoint(store, done, carry)
        if progress:
            scores = np.asarray(carry.records.scores[done - 1])
            bar.report(done * interval, {"best": np.nanmax(np.nan_to_num(scores, nan=-np.inf))})

    try:
        if progress:
            bar.open()
        carry = jax.block_until_ready(train_chunks(runner, config, carry, plan, [keep]))
    except BaseException:
        if logger is not None:
            logger.abort()
        raise
    finally:
        bar.close()
        store.close()
    finished = time.perf_counter()
    out = jax.device_get(pbt_output(carry))
    metrics = {name: np.asarray(values) for name, values in out.metrics.items()}
    if not (run_dir / PBT_TABLE).exists():  # a resume of a run whose last piece had finished
        write_tables(run_dir, config, carry)
    write_plots(run_dir, config, out, metrics)
    seconds = {"compile_seconds": compiled_at - began, "run_seconds": finished - compiled_at}
    summary = write_pbt_summary(run_dir, config, out, metrics, started * interval, seconds)
    if logger is not None:
        logger.finish(metrics, [], wandb_summaries(out, metrics))
    return out, summary


def wandb_log(
    run_dir: Path, config: PPOConfig, settings: dict[str, Any], carry: PBTCarry
) -> WandbLog | None:
    """One W&B run per member, named in pbt.json (None without W&B); each member's config
    holds its initial hyperparameters."""
    options = options_from_settings(run_dir / PBT_FILE, settings.get("wandb"))
    if options is None:
        return None
    initial = {
        name: np.asarray(values[0] if int(carry.generation) else carry.hyperparams[name])
        for name, values in carry.records.hyperparams.items()
    }
    members = [
        {"run": member, "seed": settings["seed"]}
        | {name: float(values[member]) for name, values in initial.items()}
        for member in range(len(next(iter(initial.values()))))
    ]
    return WandbLog(options, config, members, run_dir, job_type="pbt")


def wandb_metrics(carry: PBTCarry, first: int, last: int) -> dict[str, np.ndarray]:
    """The metrics [P, updates] of intervals ``first`` to ``last`` (exclusive), with each
    member's hyperparameters at every update (``pbt/<field>``) and, at each interval's last
    update, its score and the member it copied (``pbt/score``, ``pbt/copied_from``; NaN
    elsewhere)."""
    records = jax.device_get(carry.records)

    def per_update(values: np.ndarray) -> np.ndarray:  # [G, P, interval] -> [P, G * interval]
        values = np.moveaxis(np.asarray(values)[first:last], 0, 1)
        return values.reshape(values.shape[0], -1)

    metrics = {name: per_update(values) for name, values in records.metrics.items()}
    interval = next(iter(metrics.values())).shape[1] // (last - first)
    at_end = np.full((*records.lineage.shape, interval), np.nan)  # [G, P, interval]
    extra = {f"{PBT_PREFIX}{name}": values for name, values in records.hyperparams.items()}
    for name, values in extra.items():
        metrics[name] = per_update(np.repeat(np.asarray(values)[..., None], interval, axis=-1))
    for name, values in (("score", records.scores), ("copied_from", records.lineage)):
        ends = at_end.copy()
        ends[..., -1] = values
        metrics[f"{PBT_PREFIX}{name}"] = per_update(ends)
    return metrics


def wandb_summaries(out: PBTOutput, metrics: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """Per member: its rank by final return (0: the best), whether it is the best, and its
    hyperparameters in the last interval."""
    finals = np.nan_to_num(final_return(metrics["episode_return"]), nan=-np.inf)
    rank = np.argsort(np.argsort(-finals))
    return [
        {
            "pbt_rank": int(rank[member]),
            "pbt_best": bool(rank[member] == 0),
            **{
                f"{PBT_PREFIX}{name}": float(np.asarray(values)[member, -1])
                for name, values in out.hyperparams.items()
            },
        }
        for member in range(len(finals))
    ]


def write_tables(run_dir: Path, config: PPOConfig, carry: PBTCarry) -> None:
    """metrics.csv and pbt.csv with every interval done so far, each replaced atomically."""
    done = int(carry.generation)
    # the records alone: the members' training states stay on the device
    out = jax.device_get(pbt_output(carry._replace(states=None)))
    interval = config.num_updates // out.lineage.shape[1]
    metrics = {
        name: np.asarray(values)[:, : done * interval] for name, values in out.metrics.items()
    }
    members = [{"run": member} for member in range(out.lineage.shape[0])]
    header = folder.metrics_header(members, list(metrics))
    rows = folder.metric_rows(members, 0, metrics)
    folder.write_metrics(
        run_dir / folder.METRICS_FILE, header, ([row[name] for name in header] for row in rows)
    )
    write_table(run_dir / PBT_TABLE, out, done)


def write_plots(
    run_dir: Path, config: PPOConfig, out: PBTOutput, metrics: dict[str, np.ndarray]
) -> None:
    """learning_curve.png (every member's return) and pbt.png (the schedules)."""
    returns = metrics["episode_return"]
    env_steps = (np.arange(returns.shape[1]) + 1) * config.batch_size
    curves = {f"member {member}": returns[member : member + 1] for member in range(len(returns))}
    plot_learning_curves(
        curves, env_steps, run_dir / folder.CURVE_FILE, f"ppojax PBT on {config.env_id}"
    )
    plot_schedules(run_dir / PBT_PLOT, out, final_return(returns))


def write_table(path: Path, out: PBTOutput, done: int | None = None) -> None:
    """pbt.csv: member, interval, each hyperparameter, score, source; the first ``done``
    intervals (all when None). Replaced atomically."""
    names = list(out.hyperparams)
    values = {name: np.asarray(column) for name, column in out.hyperparams.items()}
    lineage, scores = np.asarray(out.lineage), np.asarray(out.scores)
    done = lineage.shape[1] if done is None else done
    rows = [
        [
            member,
            interval,
            *(float(values[name][member, interval]) for name in names),
            float(scores[member, interval]),
            int(lineage[member, interval]),
        ]
        for member in range(lineage.shape[0])
        for interval in range(done)
    ]
    folder.write_metrics(path, ["member", "interval", *names, "score", "copied_from"], rows)


def write_pbt_summary(
    run_dir: Path,
    config: PPOConfig,
    out: PBTOutput,
    metrics: dict[str, np.ndarray],
    start: int,
    seconds: dict[str, float],
) -> dict[str, Any]:
    """summary.json (``ppojax.runs.summary``): every member's final return (mean of its last 10
    updates), the best member by it and its hyperparameters, env steps per second of the
    updates this call trained from ``start``."""
    finals = final_return(metrics["episode_return"])
    best = int(np.nanargmax(np.nan_to_num(finals, nan=-np.inf)))
    population = finals.shape[0]
    env_steps = population * (config.num_updates - start) * config.batch_size
    extras = {
        "best_member": best,
        "best_final_return": float(finals[best]),
        "best_hyperparams_last_interval": {
            name: float(np.asarray(values)[best, -1]) for name, values in out.hyperparams.items()
        },
        "env_steps_per_second": round(env_steps / max(seconds["run_seconds"], 1e-9)),
    }
    return write_summary(
        run_dir,
        "update",
        config.num_updates,
        start,
        {"final_return": [float(value) for value in finals]},
        seconds,
        head={"env_id": config.env_id, "population": population},
        extras=extras,
    )
