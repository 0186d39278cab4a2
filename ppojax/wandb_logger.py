"""Weights & Biases logging of an experiment (``ppojax train --wandb``).

Every ppojax run (seed x grid point) is one W&B run. The runs of one experiment share a W&B
group (the run folder's name unless ``WandbOptions.name`` sets it), carry their seed and grid
point as config values, job type and tags, and log every metric of every update at W&B step =
update number (evaluation metrics only on the updates that evaluated). The config holds every
PPOConfig field with the run's own grid values; the summary, written when training ends, holds
the final return, the final evaluation return and whether the run diverged.

wandb is imported only when a logger is made (``pip install "ppojax[wandb]"``); it works
offline with ``WANDB_MODE=offline`` and writes below ``WANDB_DIR`` (else the run folder).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ppojax import io
from ppojax.config import PPOConfig
from ppojax.evaluation import EVAL_METRIC_NAMES


@dataclasses.dataclass(frozen=True)
class WandbOptions:
    """Where the W&B runs go: ``project``, ``entity`` (None: the account's default), and
    ``name``, the group of the experiment's runs (None: the run folder's name)."""

    project: str = "ppojax"
    entity: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        for field in ("project", "entity", "name"):
            value = getattr(self, field)
            if field != "project" and value is None:
                continue
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"WandbOptions.{field} must be a non-empty string, got {value!r}")


def import_wandb() -> Any:
    """The wandb module; a ``ValueError`` saying how to install it when it is missing."""
    try:
        import wandb
    except ImportError:
        raise ValueError("--wandb needs wandb: pip install 'ppojax[wandb]'") from None
    return wandb


def run_config(config: PPOConfig, run: dict[str, Any], group: str) -> dict[str, Any]:
    """A W&B run's config: every PPOConfig field (the run's grid values in place of the base
    config's), plus ``run``, ``seed``, ``grid_point`` (the grid values, {} without a grid)
    and ``experiment`` (the group)."""
    point = {name: value for name, value in run.items() if name not in ("run", "seed")}
    return {
        **io.config_to_dict(config),
        **point,
        "run": run["run"],
        "seed": run["seed"],
        "grid_point": point,
        "experiment": group,
    }


def point_label(point: dict[str, Any]) -> str:
    return ",".join(f"{name}={value:g}" for name, value in point.items())


class WandbLog:
    """One W&B run per ppojax run of an experiment; ``log`` after every chunk, ``finish`` at
    the end with the final values (or ``abort`` after an error)."""

    def __init__(
        self,
        options: WandbOptions,
        config: PPOConfig,
        runs: Sequence[dict[str, Any]],
        run_dir: Path | None,
    ) -> None:
        wandb = import_wandb()
        group = options.name or (Path(run_dir).name if run_dir is not None else config.env_id)
        folder = os.environ.get("WANDB_DIR") or (str(run_dir) if run_dir is not None else None)
        self.runs = []
        for run in runs:
            settings = run_config(config, run, group)
            label = point_label(settings["grid_point"])
            self.runs.append(
                wandb.init(
                    project=options.project,
                    entity=options.entity,
                    group=group,
                    name=f"{group}-run{run['run']}",
                    job_type=label or "train",
                    tags=[f"seed={run['seed']}", *([label] if label else [])],
                    config=settings,
                    dir=folder,
                    reinit="create_new",
                )
            )

    def log(self, first: int, metrics: dict[str, np.ndarray]) -> None:
        """Metrics [runs, updates] of updates ``first + 1 ...``: one W&B step per update."""
        updates = next(iter(metrics.values())).shape[1]
        for index, run in enumerate(self.runs):
            for offset in range(updates):
                values = update_values(metrics, index, offset)
                run.log(values, step=first + offset + 1)

    def finish(self, metrics: dict[str, np.ndarray], diverged: Sequence[int]) -> None:
        """Write each run's summary from the whole run's metrics [runs, U] and close the runs."""
        for index, run in enumerate(self.runs):
            run.summary.update(run_summary(metrics, index, index in diverged))
            run.finish()
        self.runs = []

    def abort(self) -> None:
        """Close the runs of a failed or interrupted experiment, marked as failed."""
        for run in self.runs:
            run.finish(exit_code=1)
        self.runs = []


def update_values(metrics: dict[str, np.ndarray], run: int, offset: int) -> dict[str, float]:
    """One run's metrics at one update as floats; an evaluation metric only when measured."""
    values = {name: float(column[run, offset]) for name, column in metrics.items()}
    return {
        name: value
        for name, value in values.items()
        if name not in EVAL_METRIC_NAMES or np.isfinite(value)
    }


def run_summary(metrics: dict[str, np.ndarray], run: int, diverged: bool) -> dict[str, Any]:
    """``final_return`` (mean episode return of the last 10 updates), ``final_eval_return``
    (the last evaluation's return; only with evaluation) and ``diverged``."""
    summary: dict[str, Any] = {
        "final_return": float(io.final_returns(metrics["episode_return"][run : run + 1])[0]),
        "diverged": bool(diverged),
    }
    if "eval_return" in metrics:
        evaluations = metrics["eval_return"][run]
        finite = evaluations[np.isfinite(evaluations)]
        summary["final_eval_return"] = float(finite[-1]) if finite.size else float("nan")
    return summary
