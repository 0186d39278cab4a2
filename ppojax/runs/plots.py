"""Every picture a run folder holds, drawn one way: a bare matplotlib ``Figure`` (no pyplot,
so a notebook's backend is left as it was) of panels side by side, saved as a PNG.

``plot_learning_curves``: PPO runs, sweeps and PBT members (learning_curve.png);
``plot_schedules``: PBT's hyperparameters per interval (pbt.png); ``plot_metrics``: one
panel per metric against the step (curves.png of the LM commands).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def panels(count: int, width: float, height: float) -> tuple[Any, Any]:
    """A figure of ``count`` panels in a row, each ``width`` x ``height`` inches, and the row
    of axes."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width * count, height))
    return figure, figure.subplots(1, count, squeeze=False)[0]


def save(figure: Any, path: Path, dpi: int = 100) -> None:
    figure.tight_layout()
    figure.savefig(path, dpi=dpi)


def rolling_mean(values: np.ndarray, window: int = 10) -> np.ndarray:
    """Mean of the finite values among the last ``window`` updates, along the last axis
    ([..., U] -> [..., U]); NaN where that window holds none (no episode ended yet)."""
    finite = np.isfinite(values)
    sums = np.cumsum(np.where(finite, values, 0.0), axis=-1)
    counts = np.cumsum(finite, axis=-1)
    pad = [(0, 0)] * (values.ndim - 1) + [(window, 0)]
    sums = sums - np.pad(sums, pad)[..., : values.shape[-1]]
    counts = counts - np.pad(counts, pad)[..., : values.shape[-1]]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def plot_learning_curves(
    curves: dict[str, np.ndarray],
    env_steps: np.ndarray,
    path: Path,
    title: str,
    eval_curves: dict[str, np.ndarray] | None = None,
) -> None:
    """Episode return against env steps, one line per label: the mean over seeds of each
    seed's 10-update rolling mean, shaded between the lowest and highest seed. With
    ``eval_curves`` a second panel beside it shows the evaluation returns, one point per
    evaluation (mean over seeds, shaded between the lowest and highest seed).

    ``curves`` and ``eval_curves`` map a label to returns [seeds, updates] (NaN on updates
    without an evaluation); ``env_steps`` is [updates].
    """
    figure, axes = panels(1 if eval_curves is None else 2, 7, 4.2)
    smoothed = {label: rolling_mean(returns) for label, returns in curves.items()}
    draw_curves(axes[0], smoothed, env_steps)
    axes[0].set_ylabel("episode return (10-update mean)")
    axes[0].set_title(title)
    if eval_curves is not None:
        draw_curves(axes[1], eval_curves, env_steps, marker="o")
        axes[1].set_ylabel("evaluation return (fresh episodes)")
        axes[1].set_title("evaluation during training")
    save(figure, path, dpi=110)


def draw_curves(
    axes: Any, curves: dict[str, np.ndarray], env_steps: np.ndarray, marker: str | None = None
) -> None:
    """One line per label on ``axes``: the mean over seeds [seeds, updates] at the updates
    where some seed has a finite value, shaded between the lowest and highest seed."""
    for label, values in curves.items():
        kept = np.isfinite(values).any(axis=0)
        with warnings.catch_warnings():
            # A seed without a value yet (no episode ended) is left out silently.
            warnings.simplefilter("ignore", category=RuntimeWarning)
            mean = np.nanmean(values[:, kept], axis=0)
            low, high = np.nanmin(values[:, kept], axis=0), np.nanmax(values[:, kept], axis=0)
        seeds = values.shape[0]
        spread = f"{seeds} seeds, band: lowest to highest" if seeds > 1 else "1 seed"
        steps = env_steps[kept]
        (line,) = axes.plot(steps, mean, label=f"{label} ({spread})", marker=marker, ms=3)
        if seeds > 1:
            axes.fill_between(steps, low, high, color=line.get_color(), alpha=0.2, lw=0)
    axes.set_xlabel("env steps (per seed)")
    axes.grid(alpha=0.3)
    axes.legend(loc="best", fontsize="small")


def plot_metrics(path: Path, metrics: dict[str, np.ndarray], names: Sequence[str]) -> None:
    """One panel per metric name against the step (``metrics``: name -> [steps])."""
    names = [name for name in names if name in metrics]
    figure, axes = panels(len(names), 4, 3.2)
    for axis, name in zip(axes, names, strict=True):
        axis.plot(np.arange(1, len(metrics[name]) + 1), metrics[name])
        axis.set_title(name, fontsize="small")
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    save(figure, path)


def plot_schedules(path: Path, out: Any, finals: np.ndarray) -> None:
    """One panel per searched field: each member's value per interval (``out``: a PBT output,
    its ``hyperparams`` name -> [members, intervals]), coloured by its final rank from
    ``finals`` [members] (the best member darkest)."""
    from matplotlib import colormaps

    names = list(out.hyperparams)
    rank = np.argsort(np.argsort(-np.nan_to_num(finals, nan=-np.inf)))  # 0: the best
    colours = colormaps["viridis"](rank / max(len(rank) - 1, 1))
    figure, axes = panels(len(names), 4.5, 3.4)
    for axis, name in zip(axes, names, strict=True):
        values = np.asarray(out.hyperparams[name])
        for member in range(values.shape[0]):
            axis.step(
                np.arange(values.shape[1]), values[member], where="post", color=colours[member]
            )
        axis.set_title(name, fontsize="small")
        axis.set_xlabel("interval")
        axis.grid(alpha=0.3)
    figure.suptitle("PBT schedules (dark: best final return)", fontsize="small")
    save(figure, path)
