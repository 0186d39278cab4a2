"""Hyperparameter sweeps: every grid point x every seed in one compiled, vmapped program.

``sweep(config, keys, **grid)`` trains every point with every key through
``vmap(vmap(train))`` (compiled once per program structure); results have leading axes
``[num_points, num_seeds]``. With a mesh the runs are split across its devices (independent
runs, no communication).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ppojax.ppo.config import PPOConfig, unknown_field_message
from ppojax.ppo.summary import final_return, grid_points
from ppojax.ppo.train import train
from ppojax.ppo.types import Metrics, TrainState, check_key_batch
from ppojax.runtime.sharding import grid_mesh, put_global


class SweepOutput(NamedTuple):
    """Training results with leading axes [num_points, num_seeds]; ``grid`` maps each swept
    field to its value at every point [num_points]."""

    state: TrainState
    metrics: Metrics
    grid: dict[str, np.ndarray]


def sweepable_fields() -> list[str]:
    """PPOConfig fields that are pytree leaves, so one program sweeps them with vmap."""
    return [f.name for f in dataclasses.fields(PPOConfig) if f.metadata.get("pytree_node", True)]


def check_traced_field(name: str, refusal: str) -> None:
    """Raise ``ValueError`` unless ``name`` is a traced PPOConfig field, which one vmapped
    program can vary; ``refusal`` says what a static field cannot be."""
    if name not in {f.name for f in dataclasses.fields(PPOConfig)}:
        raise ValueError(unknown_field_message(name))
    if name not in sweepable_fields():
        raise ValueError(
            f"PPOConfig.{name} fixes the program's shapes or structure and cannot be {refusal}. "
            f"Sweepable: {', '.join(sweepable_fields())}."
        )


def check_grid(config: PPOConfig, grid: dict[str, Sequence[float]], zipped: bool = False) -> None:
    """Raise ``ValueError`` naming the problem for a grid that one vmapped program cannot
    sweep: an unknown or static field, an empty list, a None, or a point ``config`` refuses."""
    for name, values in grid.items():
        check_traced_field(name, "swept with vmap; sweep it with a loop")
        if len(values) == 0 or any(value is None for value in values):
            raise ValueError(f"sweep grid {name}: give one or more numbers (None cannot be swept)")
    for point in grid_points(grid, zipped):
        config.replace(**{name: float(value) for name, value in point.items()})


def grid_arrays(
    config: PPOConfig, grid: dict[str, Sequence[float]], *, zipped: bool = False
) -> dict[str, np.ndarray]:
    """The swept values at every point, {field: [num_points]} (float32), checked."""
    check_grid(config, grid, zipped)
    points = grid_points(grid, zipped)
    return {name: np.array([point[name] for point in points], np.float32) for name in grid}


def point_configs(config: PPOConfig, points: dict[str, np.ndarray]) -> PPOConfig:
    """A config whose every leaf is an array [num_points]: point p's values at index p."""
    num_points = len(next(iter(points.values()))) if points else 1
    base = jax.tree.map(lambda leaf: np.full((num_points,), leaf, np.float32), config)
    return base.replace(**points) if points else base


def _train_grid(configs: PPOConfig, keys: jax.Array) -> Any:
    """train at every point [P] (configs) with every key [S]: outputs [P, S, ...]."""
    over_seeds = jax.vmap(train, in_axes=(None, 0))
    return jax.vmap(over_seeds, in_axes=(0, None))(configs, keys)


train_grid = jax.jit(_train_grid)


def sweep(
    config: PPOConfig,
    keys: jax.Array,
    *,
    zipped: bool = False,
    mesh: Mesh | None = None,
    **grid: Sequence[float],
) -> SweepOutput:
    """Train every grid point with every key [num_seeds] in one compiled call.

    ``grid`` maps traced PPOConfig fields (learning_rate, clip_eps, ent_coef, gamma, ...) to
    value lists; points are their cartesian product, or the lists side by side when
    ``zipped``. With ``mesh`` the points x seeds runs are split across its devices.
    """
    check_key_batch(keys)
    points = grid_arrays(config, grid, zipped=zipped)
    configs = point_configs(config, points)
    if mesh is not None:
        layout = grid_mesh(mesh, jax.tree.leaves(configs)[0].shape[0], keys.shape[0])
        configs = put_global(configs, NamedSharding(layout, PartitionSpec("points")))
        keys = put_global(keys, NamedSharding(layout, PartitionSpec("seeds")))
    out = train_grid(configs, keys)
    return SweepOutput(out.state, out.metrics, points)


def sweep_table(out: SweepOutput, *, last: int = 10) -> list[dict[str, Any]]:
    """One row per point x seed: the swept values, ``final_return`` (mean episode return of
    the last ``last`` updates) and ``auc`` (mean episode return over all updates)."""
    returns = np.asarray(out.metrics["episode_return"])  # [P, S, U]
    rows = []
    for point in range(returns.shape[0]):
        values = {name: float(column[point]) for name, column in out.grid.items()}
        for seed in range(returns.shape[1]):
            curve = returns[point, seed]
            auc = float(np.nanmean(curve)) if np.isfinite(curve).any() else float("nan")
            rows.append(
                {
                    "point": point,
                    "seed": seed,
                    **values,
                    "final_return": float(final_return(curve, last)),
                    "auc": auc,
                }
            )
    return rows


def best_point(out: SweepOutput, *, metric: str = "final_return", last: int = 10) -> dict[str, Any]:
    """The point with the highest ``metric`` ("final_return" or "auc") averaged over seeds;
    ties go to the higher mean of the other one (final returns often tie at a task's cap)."""
    if metric not in ("final_return", "auc"):
        raise ValueError(f"best_point metric must be 'final_return' or 'auc', got {metric!r}")
    other = "auc" if metric == "final_return" else "final_return"
    rows = sweep_table(out, last=last)
    num_points = np.asarray(out.metrics["episode_return"]).shape[0]

    def mean_of(name: str, point: int) -> float:
        values = [row[name] for row in rows if row["point"] == point]
        return float(np.nanmean(values)) if np.isfinite(values).any() else -np.inf

    scores = [(mean_of(metric, p), mean_of(other, p)) for p in range(num_points)]
    best = max(range(num_points), key=lambda p: scores[p])
    values = {name: float(column[best]) for name, column in out.grid.items()}
    return {"point": best, **values, metric: scores[best][0], other: scores[best][1]}


def format_table(rows: list[dict[str, Any]]) -> str:
    """Rows as an aligned plain-text table (markdown-compatible)."""
    if not rows:
        return ""
    names = list(rows[0])
    cells = [
        [f"{row[n]:.4g}" if isinstance(row[n], float) else str(row[n]) for n in names]
        for row in rows
    ]
    widths = [max(len(n), *(len(c[i]) for c in cells)) for i, n in enumerate(names)]
    lines = ["| " + " | ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)) + " |"]
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for c in cells:
        lines.append("| " + " | ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)) + " |")
    return "\n".join(lines)
