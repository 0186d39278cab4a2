"""What an experiment trains, and the settings its run folder keeps.

``Experiment`` is what to train (seeds, base seed, a grid of hyperparameters). A run folder
keeps it in config.json and run.json (``run_settings``, read back checked field by field by
``read_experiment``), and every checkpoint's manifest keeps the record a resume compares
them with (``run_record``, ``check_record``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ppojax.checks import ConfigError, check_positive_int, is_int, show
from ppojax.envs.registry import env_id_known, env_modules, import_env_modules
from ppojax.ppo.config import PPOConfig
from ppojax.ppo.summary import grid_points
from ppojax.ppo.sweeps import check_grid as check_sweep_grid
from ppojax.runs import checkpoints, folder
from ppojax.runs.loggers import options_from_settings, wandb_settings
from ppojax.runs.options import RunOptions


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
        return num_runs(self.seeds, self.grid)


def num_runs(seeds: int, grid: dict[str, Sequence[float]]) -> int:
    """Runs of ``seeds`` seeds at every point of ``grid``."""
    return seeds * math.prod(len(values) for values in grid.values())


MAX_SEED = 2**31 - 1


def check_seed(owner: str, name: str, seed: Any) -> None:
    """Raise ``ConfigError`` unless ``seed`` is an int in [0, MAX_SEED] (larger ones would
    collide: ``jax.random.key`` keeps 32 bits of them)."""
    if not is_int(seed) or not 0 <= seed <= MAX_SEED:
        raise ConfigError(
            name, f"{owner}.{name} must be an int in [0, {MAX_SEED}], got {show(seed, (int,))}."
        )


def check_grid(config: PPOConfig, grid: dict[str, Sequence[float]]) -> None:
    """Raise ``ValueError`` naming the problem for a grid that cannot be swept with vmap."""
    check_sweep_grid(config, grid)


def run_table(experiment: Experiment) -> list[dict[str, Any]]:
    """One dict per run, in run order: {"run": r, "seed": s, **grid point}."""
    rows = []
    for point in grid_points(experiment.grid):
        for seed in range(experiment.seeds):
            rows.append({"run": len(rows), "seed": seed, **point})
    return rows


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
        "wandb": wandb_settings(options.wandb),
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
    settings = folder.read_json_object(path, "run settings (seeds, seed, grid, checkpoints)")
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
        raise ValueError(f"{path}: field 'env_modules' must be a list of module names or paths")
    return tuple(modules)


def read_config(path: Path) -> PPOConfig:
    """config.json as a validated PPOConfig; errors name the file."""
    settings = folder.read_json_object(path, "PPOConfig fields")
    try:
        return folder.config_from_dict(settings)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{path}: {error}") from None


def read_experiment(run_dir: Path) -> tuple[Experiment, RunOptions]:
    """The experiment and options a run folder was started with; a ``ValueError`` naming the
    file and field when config.json or run.json is missing, empty or damaged. The env modules
    run.json records are imported first when the env id is not registered yet."""
    run_dir = Path(run_dir)
    if not (run_dir / folder.CONFIG_FILE).exists() and not (run_dir / folder.RUN_FILE).exists():
        raise ValueError(f"{run_dir} is not a ppojax run folder (no config.json / run.json)")
    path = run_dir / folder.RUN_FILE
    settings = read_run_settings(path)
    modules = env_modules_of(path, settings)
    saved = folder.read_json_object(run_dir / folder.CONFIG_FILE, "PPOConfig fields")
    if not env_id_known(saved.get("env_id", "CartPole-v1")):
        import_env_modules(modules, str(path))
    config = read_config(run_dir / folder.CONFIG_FILE)
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
        wandb=options_from_settings(path, settings.get("wandb")),  # absent before W&B resume
    )
    return experiment, options


class RunMismatchError(ValueError):
    """config.json or run.json no longer matches the checkpoints of its run folder."""


def run_record(experiment: Experiment) -> dict[str, Any]:
    """What fixes a run's state, as saved in each checkpoint's manifest: every config field
    and the seeds, base seed and grid of run.json."""
    return {
        "config": folder.config_to_dict(experiment.config),
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
        (folder.CONFIG_FILE, name, value, saved_config.get(name, value))
        for name, value in now["config"].items()
    ]
    pairs += [
        (folder.RUN_FILE, name, now[name], saved.get(name, now[name]))
        for name in ("seeds", "seed", "grid")
    ]
    return [pair for pair in pairs if pair[2] != pair[3]]


def check_record(run_dir: Path, experiment: Experiment) -> None:
    """Raise ``RunMismatchError`` naming the fields when config.json or run.json differ from
    what the checkpoints of ``run_dir`` were saved with (read-only)."""
    now = run_record(experiment)
    for step, saved in checkpoints.checkpoint_records(run_dir):
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
        f"start a new run with --config {run_dir / folder.CONFIG_FILE}"
    )
