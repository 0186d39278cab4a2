"""What a run's metrics come to, defined once for the Python API, the CLI, the run folder and
the loggers: each run's final return, its latest evaluation, a sweep grid's points and their
labels. Plain NumPy on host arrays, with the update axis last."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

FINAL_WINDOW = 10  # updates the final return averages over


def final_return(returns: np.ndarray, last: int = FINAL_WINDOW) -> np.ndarray:
    """Mean of the finite values among the last ``last`` updates: [..., U] -> [...]; NaN where
    none of them is finite (no episode ended in that window)."""
    tail = np.asarray(returns, np.float64)[..., -last:]
    finite = np.isfinite(tail)
    counts = finite.sum(-1)
    sums = np.where(finite, tail, 0.0).sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def latest_finite(values: np.ndarray) -> np.ndarray:
    """The last finite value along the last axis ([..., U] -> [...]), NaN where there is none:
    an evaluation return, which is NaN in the updates that did not evaluate."""
    values = np.asarray(values)
    finite = np.isfinite(values)
    last = values.shape[-1] - 1 - np.argmax(finite[..., ::-1], axis=-1)
    picked = np.take_along_axis(values, last[..., None], axis=-1)[..., 0]
    return np.where(finite.any(-1), picked, np.nan)


def grid_points(grid: dict[str, Sequence[float]], zipped: bool = False) -> list[dict[str, float]]:
    """A grid's points, in order, as {field: value}: the cartesian product of its value lists
    (the last field varying fastest), or the lists side by side when ``zipped``; [{}] for an
    empty grid."""
    names = list(grid)
    if zipped:
        sizes = {name: len(values) for name, values in grid.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"zipped sweep needs equally long value lists, got {sizes}")
        rows: Any = zip(*grid.values(), strict=True)
    else:
        rows = itertools.product(*grid.values())
    return [dict(zip(names, row, strict=True)) for row in rows]


def point_label(point: dict[str, Any]) -> str:
    """A grid point as ``name=value, ...`` ("" for no grid)."""
    return ", ".join(f"{name}={value:g}" for name, value in point.items())
