"""Weights & Biases logging of an experiment (``ppojax train | sweep | pbt --wandb``).

Every ppojax run (seed x grid point) is one W&B run. The runs of one experiment share a W&B
group (the run folder's name unless ``WandbOptions.name`` sets it), carry their seed and grid
point as config values, job type and tags, and log every metric of every update at W&B step =
update number (evaluation metrics only on the updates that evaluated). The config holds every
PPOConfig field with the run's own grid values; the summary, written when training ends, holds
the final return, the final evaluation return and whether the run diverged.

A PBT run (``ppojax pbt --wandb``) logs one W&B run per member, the same way: its config
holds the member's initial hyperparameters (its "grid point"); at every update it logs
``pbt/<field>``, the member's value of each searched field then, and at the last update of
each interval ``pbt/score`` (the return it was ranked by) and ``pbt/copied_from`` (the member
whose state it holds after the interval: itself unless it was replaced); the summary adds
``pbt_rank`` (0: the best final return), ``pbt_best`` and the last interval's values.

A run folder's run.json records the W&B settings and run ids (``wandb_settings``), so
``--resume`` logs on into the same W&B runs (``resume="allow"``); W&B keeps the steps it
already has, so the updates a resume repeats after its checkpoint are logged once.

wandb is imported only when a logger is made (``pip install "ppojax[wandb]"``); it works
offline with ``WANDB_MODE=offline`` and writes below ``WANDB_DIR`` (else the run folder).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ppojax.ppo.config import PPOConfig
from ppojax.ppo.evaluation import EVAL_METRIC_NAMES
from ppojax.ppo.summary import final_return, latest_finite, point_label
from ppojax.runs import folder

RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
PBT_PREFIX = "pbt/"  # a PBT member's schedule and records (ppojax.runs.pbt_folder)


@dataclasses.dataclass(frozen=True)
class WandbOptions:
    """Where the W&B runs go: ``project``, ``entity`` (None: the account's default), and
    ``name``, the group of the experiment's runs (None: the run folder's name). ``run_ids``:
    the W&B run id of each ppojax run, in run order (None: W&B draws new ones); a W&B run
    with one of these ids is continued, not replaced."""

    project: str = "ppojax"
    entity: str | None = None
    name: str | None = None
    run_ids: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for field in ("project", "entity", "name"):
            value = getattr(self, field)
            if field != "project" and value is None:
                continue
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"WandbOptions.{field} must be a non-empty string, got {value!r}")
        ids = self.run_ids
        if ids is not None and not (
            isinstance(ids, tuple) and all(isinstance(i, str) and RUN_ID.fullmatch(i) for i in ids)
        ):
            raise ValueError(
                "WandbOptions.run_ids must be None or a tuple of W&B run ids (letters, digits, "
                f"'_' and '-'), got {ids!r}"
            )

    def with_run_ids(self, runs: int) -> WandbOptions:
        """These options with a fresh W&B run id for each of ``runs`` runs, unless they
        have ids already."""
        if self.run_ids is not None:
            return self
        # A W&B id names a run within its project, and resume="allow" continues whatever run
        # holds it: 64 random bits keep a clash unlikely (about 1e-11 for 20,000 runs in one
        # project, where 32 bits would give 5%).
        return dataclasses.replace(self, run_ids=tuple(secrets.token_hex(8) for _ in range(runs)))


def wandb_settings(options: WandbOptions | None) -> dict[str, Any] | None:
    """run.json's ``wandb``: the options as JSON data (None without W&B)."""
    if options is None:
        return None
    settings = dataclasses.asdict(options)
    settings["run_ids"] = None if options.run_ids is None else list(options.run_ids)
    return settings


def options_from_settings(path: Path, settings: Any) -> WandbOptions | None:
    """``wandb_settings`` read back from run.json at ``path``; a ``ValueError`` naming the file
    and field when it is not what ``wandb_settings`` writes."""
    if settings is None:
        return None
    fields = {field.name for field in dataclasses.fields(WandbOptions)}
    if not isinstance(settings, dict) or not set(settings) <= fields:
        raise ValueError(
            f"{path}: field 'wandb' must be null or an object with keys {sorted(fields)}, "
            f"got {settings!r}"
        )
    ids = settings.get("run_ids")
    if ids is not None and not (
        isinstance(ids, list) and all(isinstance(i, str) and RUN_ID.fullmatch(i) for i in ids)
    ):
        raise ValueError(
            f"{path}: field 'wandb': run_ids must be null or a list of W&B run ids (letters, "
            f"digits, '_' and '-'), got {json.dumps(ids)}"
        )
    try:
        return WandbOptions(**{**settings, "run_ids": None if ids is None else tuple(ids)})
    except ValueError as error:
        raise ValueError(f"{path}: field 'wandb': {error}") from None


def import_wandb() -> Any:
    """The wandb module; a ``ValueError`` saying how to install it when it is missing."""
    try:
        import wandb
    except ImportError:
        raise ValueError("--wandb needs wandb: pip install 'ppojax[wandb]'") from None
    return wandb


def wandb_config(config: PPOConfig, run: dict[str, Any], group: str) -> dict[str, Any]:
    """A W&B run's config: every PPOConfig field (the run's grid values in place of the base
    config's), plus ``run``, ``seed``, ``grid_point`` (the grid values, {} without a grid)
    and ``experiment`` (the group)."""
    point = {name: value for name, value in run.items() if name not in ("run", "seed")}
    return {
        **folder.config_to_dict(config),
        **point,
        "run": run["run"],
        "seed": run["seed"],
        "grid_point": point,
        "experiment": group,
    }


class WandbLog:
    """One W&B run per ppojax run of an experiment; ``log`` after every chunk, ``finish`` at
    the end with the final values (or ``abort`` after an error)."""

    def __init__(
        self,
        options: WandbOptions,
        config: PPOConfig,
        runs: Sequence[dict[str, Any]],
        run_dir: Path | None,
        job_type: str | None = None,
    ) -> None:
        """``job_type`` (None: each run's grid point, or "train") also tags every run in
        place of the grid point (a PBT member's initial values are too long for a tag)."""
        wandb = import_wandb()
        if options.run_ids is not None and len(options.run_ids) != len(runs):
            raise ValueError(
                f"WandbOptions.run_ids has {len(options.run_ids)} ids for {len(runs)} runs"
            )
        group = options.name or (Path(run_dir).name if run_dir is not None else config.env_id)
        wandb_dir = os.environ.get("WANDB_DIR") or (str(run_dir) if run_dir is not None else None)
        self.runs = []
        for index, run in enumerate(runs):
            settings = wandb_config(config, run, group)
            run_id = None if options.run_ids is None else options.run_ids[index]
            label = job_type or point_label(settings["grid_point"])
            self.runs.append(
                wandb.init(
                    project=options.project,
                    entity=options.entity,
                    group=group,
                    name=f"{group}-run{run['run']}",
                    job_type=label or "train",
                    tags=[f"seed={run['seed']}", *([label] if label else [])],
                    config=settings,
                    dir=wandb_dir,
                    reinit="create_new",
                    id=run_id,
                    resume=None if run_id is None else "allow",
                )
            )

    def log(self, first: int, metrics: dict[str, np.ndarray]) -> None:
        """Metrics [runs, updates] of updates ``first + 1 ...``: one W&B step per update."""
        updates = next(iter(metrics.values())).shape[1]
        for index, run in enumerate(self.runs):
            for offset in range(updates):
                values = update_values(metrics, index, offset)
                run.log(values, step=first + offset + 1)

    def finish(
        self,
        metrics: dict[str, np.ndarray],
        diverged: Sequence[int],
        extra: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        """Write each run's summary from the whole run's metrics [runs, U] (and its entry of
        ``extra``, more summary values per run) and close the runs."""
        for index, run in enumerate(self.runs):
            run.summary.update(run_summary(metrics, index, index in diverged))
            if extra is not None:
                run.summary.update(extra[index])
            run.finish()
        self.runs = []

    def abort(self) -> None:
        """Close the runs of a failed or interrupted experiment, marked as failed."""
        for run in self.runs:
            run.finish(exit_code=1)
        self.runs = []


def update_values(metrics: dict[str, np.ndarray], run: int, offset: int) -> dict[str, float]:
    """One run's metrics at one update as floats; a metric measured only on some updates (an
    evaluation's, PBT's ``pbt/`` records) only where measured."""
    values = {name: float(column[run, offset]) for name, column in metrics.items()}
    return {
        name: value for name, value in values.items() if not is_sparse(name) or np.isfinite(value)
    }


def is_sparse(name: str) -> bool:
    """A metric that is NaN on the updates that did not measure it."""
    return name in EVAL_METRIC_NAMES or name.startswith(PBT_PREFIX)


def run_summary(metrics: dict[str, np.ndarray], run: int, diverged: bool) -> dict[str, Any]:
    """``final_return`` (mean episode return of the last 10 updates), ``final_eval_return``
    (the last evaluation's return; only with evaluation) and ``diverged``."""
    summary: dict[str, Any] = {
        "final_return": float(final_return(metrics["episode_return"][run])),
        "diverged": bool(diverged),
    }
    if "eval_return" in metrics:
        summary["final_eval_return"] = float(latest_finite(metrics["eval_return"][run]))
    return summary


class WandbRun:
    """The one W&B run of a run folder that trains one model (``ppojax sft | rm | dpo``,
    ``ppojax rlhf --model``): every metric at W&B step = step number, tables of sampled
    responses, the summary at the end. ``options.run_ids`` (one id) continues that run."""

    def __init__(self, options: WandbOptions, config: dict[str, Any], run_dir: Path) -> None:
        self.wandb = import_wandb()
        run_id = options.run_ids[0] if options.run_ids else None
        name = options.name or Path(run_dir).name
        self.run = self.wandb.init(
            project=options.project,
            entity=options.entity,
            group=name,
            name=name,
            config=config,
            dir=os.environ.get("WANDB_DIR") or str(run_dir),
            reinit="create_new",
            id=run_id,
            resume=None if run_id is None else "allow",
        )

    def log(self, first: int, state: Any, metrics: dict[str, np.ndarray]) -> None:
        """Metrics [1, steps] of steps ``first + 1 ...``: one W&B step each."""
        for offset in range(next(iter(metrics.values())).shape[1]):
            values = {name: float(column[0, offset]) for name, column in metrics.items()}
            self.run.log(values, step=first + offset + 1)

    def log_samples(self, step: int, rows: Sequence[dict[str, Any]]) -> None:
        """Sampled responses, {"step", "prompt", "response"} each, as a W&B table."""
        columns = ["step", "prompt", "response"]
        table = self.wandb.Table(columns=columns, data=[[r[c] for c in columns] for r in rows])
        self.run.log({"samples": table}, step=step)

    def finish(self, summary: dict[str, Any]) -> None:
        self.run.summary.update(summary)
        self.run.finish()

    def abort(self) -> None:
        """Close the run of a failed or interrupted training, marked as failed."""
        self.run.finish(exit_code=1)
