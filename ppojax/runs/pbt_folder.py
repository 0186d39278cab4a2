"""A population-based training run and its run folder: ``ppojax.pbt`` compiled once, then

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
"""

from __future__ import annotations

import csv
import functools
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ppojax.ppo.config import PPOConfig
from ppojax.ppo.pbt import PBTOutput, parse_search, pbt
from ppojax.ppo.summary import final_return
from ppojax.runs import folder

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
) -> tuple[PBTOutput, dict[str, Any]]:
    """Train the population into ``run_dir`` (new, or empty); the output and summary.json."""
    parse_search(config, search)  # a bad search fails before the folder is made
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
    }
    folder.write_json(run_dir / PBT_FILE, settings)
    program = jax.jit(
        functools.partial(
            pbt,
            population=population,
            interval=interval,
            search=search,
            fraction=fraction,
            explore_mode=explore_mode,
        )
    )
    began = time.perf_counter()
    compiled = program.lower(config, jax.random.key(seed)).compile()
    compiled_at = time.perf_counter()
    out = jax.block_until_ready(compiled(config, jax.random.key(seed)))
    finished = time.perf_counter()
    metrics = {name: np.asarray(values) for name, values in jax.device_get(out.metrics).items()}
    write_files(run_dir, config, out, metrics)
    summary = summarize(config, out, metrics, compiled_at - began, finished - compiled_at)
    folder.write_json(run_dir / folder.SUMMARY_FILE, summary)
    return out, summary


def write_files(
    run_dir: Path, config: PPOConfig, out: PBTOutput, metrics: dict[str, np.ndarray]
) -> None:
    """metrics.csv, pbt.csv and the two plots."""
    members = [{"run": member} for member in range(out.lineage.shape[0])]
    header = folder.metrics_header(members, list(metrics))
    folder.append_metrics(
        run_dir / folder.METRICS_FILE, header, folder.metric_rows(members, 0, metrics)
    )
    write_table(run_dir / PBT_TABLE, out)
    returns = metrics["episode_return"]
    env_steps = (np.arange(returns.shape[1]) + 1) * config.batch_size
    curves = {f"member {member}": returns[member : member + 1] for member in range(len(members))}
    folder.plot_learning_curves(
        curves, env_steps, run_dir / folder.CURVE_FILE, f"ppojax PBT on {config.env_id}"
    )
    plot_schedules(run_dir / PBT_PLOT, out, final_return(returns))


def write_table(path: Path, out: PBTOutput) -> None:
    """pbt.csv: member, interval, each hyperparameter, score, source."""
    names = list(out.hyperparams)
    values = {name: np.asarray(column) for name, column in out.hyperparams.items()}
    lineage, scores = np.asarray(out.lineage), np.asarray(out.scores)
    with open(path, "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["member", "interval", *names, "score", "copied_from"])
        for member in range(lineage.shape[0]):
            for interval in range(lineage.shape[1]):
                row = [float(values[name][member, interval]) for name in names]
                writer.writerow(
                    [
                        member,
                        interval,
                        *row,
                        float(scores[member, interval]),
                        lineage[member, interval],
                    ]
                )


def plot_schedules(path: Path, out: PBTOutput, finals: np.ndarray) -> None:
    """One panel per searched field: each member's value per interval, coloured by its final
    rank (the best member darkest)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(out.hyperparams)
    rank = np.argsort(np.argsort(-np.nan_to_num(finals, nan=-np.inf)))  # 0: the best
    colours = plt.cm.viridis(rank / max(len(rank) - 1, 1))
    figure, axes = plt.subplots(1, len(names), figsize=(4.5 * len(names), 3.4), squeeze=False)
    for axis, name in zip(axes[0], names, strict=True):
        values = np.asarray(out.hyperparams[name])
        for member in range(values.shape[0]):
            axis.step(
                np.arange(values.shape[1]), values[member], where="post", color=colours[member]
            )
        axis.set_title(name, fontsize="small")
        axis.set_xlabel("interval")
        axis.grid(alpha=0.3)
    figure.suptitle("PBT schedules (dark: best final return)", fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def summarize(
    config: PPOConfig,
    out: PBTOutput,
    metrics: dict[str, np.ndarray],
    compile_seconds: float,
    run_seconds: float,
) -> dict[str, Any]:
    """summary.json: the best member by final return (mean of its last 10 updates)."""
    finals = final_return(metrics["episode_return"])
    best = int(np.nanargmax(np.nan_to_num(finals, nan=-np.inf)))
    population = finals.shape[0]
    return {
        "env_id": config.env_id,
        "population": population,
        "num_updates": config.num_updates,
        "best_member": best,
        "best_final_return": float(finals[best]),
        "best_hyperparams_last_interval": {
            name: float(np.asarray(values)[best, -1]) for name, values in out.hyperparams.items()
        },
        "final_return": [float(value) for value in finals],
        "compile_seconds": round(compile_seconds, 3),
        "run_seconds": round(run_seconds, 3),
        "env_steps_per_second": round(
            population * config.num_updates * config.batch_size / max(run_seconds, 1e-9)
        ),
        "versions": folder.versions(),
    }
