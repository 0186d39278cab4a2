"""Run folders: config and run settings as JSON, metrics as CSV, learning-curve plots,
orbax checkpoints of the TrainState, and a summary.

A run folder holds::

    config.json          the PPOConfig, one key per field (``--config`` reads it back)
    run.json             how the runs were launched: seeds, base seed, sweep grid, checkpointing
    metrics.csv          one row per update per run (seed x grid point)
    learning_curve.png   episode return against env steps: mean and spread over seeds
    checkpoints/<step>/  orbax checkpoints of the batched TrainState, the last one final
    summary.json         final returns, steps/s, compile time, versions
    tensorboard/         event files, one folder per run (only with ``--tensorboard``)
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import sys
import tempfile
import typing
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ppojax.config import ConfigError, PPOConfig

CONFIG_FILE = "config.json"
RUN_FILE = "run.json"
METRICS_FILE = "metrics.csv"
CURVE_FILE = "learning_curve.png"
SUMMARY_FILE = "summary.json"
CHECKPOINT_DIR = "checkpoints"
TENSORBOARD_DIR = "tensorboard"


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON atomically (temp file in the same folder, then rename)."""
    path = Path(path)
    handle, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(handle, "w") as file:
        json.dump(data, file, indent=2, allow_nan=True)
        file.write("\n")
    os.replace(temp_name, path)


def read_json(path: Path) -> Any:
    """The JSON in ``path``; a ``ValueError`` naming the file when it is not valid JSON."""
    with open(path) as file:
        try:
            return json.load(file)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not valid JSON: {error}") from None


def _plain(value: Any) -> Any:
    """JSON-friendly form of a config value: tuples as lists, NumPy/JAX scalars as numbers."""
    if isinstance(value, (tuple, list)):
        return [_plain(item) for item in value]
    if isinstance(value, (np.ndarray, np.generic, jax.Array)):
        return np.asarray(value).item()
    return value


def config_to_dict(config: PPOConfig) -> dict[str, Any]:
    """Every PPOConfig field by name, as JSON-friendly values."""
    return {field.name: _plain(getattr(config, field.name)) for field in dataclasses.fields(config)}


def _optional_fields() -> set[str]:
    """PPOConfig fields that take None (the feature off)."""
    hints = typing.get_type_hints(PPOConfig)
    return {name for name, hint in hints.items() if type(None) in typing.get_args(hint)}


def config_from_dict(settings: dict[str, Any]) -> PPOConfig:
    """A validated PPOConfig from ``settings`` (a config.json or .toml): missing fields take the
    env's preset, unknown ones raise ``UnknownFieldError`` naming close matches, lists become
    tuples, and "none" / "off" switch an optional feature off (TOML has no null)."""
    settings = dict(settings)
    env_id = settings.pop("env_id", "CartPole-v1")
    defaults = {field.name: field.default for field in dataclasses.fields(PPOConfig)}
    optional = _optional_fields()
    for name, value in settings.items():
        # JSON has no tuples; static fields must stay hashable for jit.
        if isinstance(value, list) and isinstance(defaults.get(name), tuple):
            settings[name] = tuple(value)
        if name in optional and isinstance(value, str) and value.lower() in ("none", "off"):
            settings[name] = None
    return PPOConfig.preset(env_id, **settings)


CONFIG_SUFFIXES = (".json", ".toml")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    names = [name for name, _ in pairs]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"field {repeated[0]!r} is given more than once")
    return dict(pairs)


def _parse_config_text(path: Path, text: str) -> Any:
    """JSON or TOML by the file's suffix (never pickle or code: only data is read)."""
    if path.suffix.lower() == ".toml":
        if sys.version_info >= (3, 11):
            import tomllib
        else:
            import tomli as tomllib
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            raise ValueError(f"config file {path} is not valid TOML: {error}") from None
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as error:
        raise ValueError(f"config file {path} is not valid JSON: {error}") from None
    except ValueError as error:
        raise ValueError(f"config file {path}: {error}") from None


def read_config_file(path: Path) -> dict[str, Any]:
    """The settings in a config file: a JSON object or a TOML table of PPOConfig fields."""
    path = Path(path)
    if path.suffix.lower() not in CONFIG_SUFFIXES:
        raise ValueError(
            f"config file {path} must be a .json or .toml file of PPOConfig fields, "
            f"got {path.suffix or 'no suffix'}"
        )
    try:
        text = path.read_text()
    except OSError as error:
        raise ValueError(f"cannot read config file {path}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"config file {path} is not text (UTF-8)") from None
    data = _parse_config_text(path, text)
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a JSON object of PPOConfig fields")
    return data


def config_from_file(path: Path, **overrides: Any) -> PPOConfig:
    """A validated PPOConfig from a JSON or TOML file of fields (the env's preset for the
    missing ones), with ``overrides`` on top. An error in a value the file set names the file."""
    settings = read_config_file(path)
    try:
        return config_from_dict({**settings, **overrides})
    except ConfigError as error:
        if error.field in settings and error.field not in overrides:
            error.args = (f"config file {path}: {error}",)
        raise


def new_run_dir(out: Path, env_id: str) -> Path:
    """A fresh folder ``out/<env_id>-<UTC time>`` (suffixed -2, -3, ... if taken)."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    base = Path(out) / f"{env_id}-{stamp}"
    candidate, number = base, 1
    while True:
        try:
            candidate.mkdir(parents=True)
            return candidate
        except FileExistsError:
            number += 1
            candidate = base.with_name(f"{base.name}-{number}")


def metric_rows(
    runs: Sequence[dict[str, Any]], first_update: int, metrics: dict[str, np.ndarray]
) -> Iterable[dict[str, Any]]:
    """CSV rows of a chunk, update by update and run by run within an update (so the file is
    the same however the updates were chunked): ``metrics`` maps name -> [runs, updates];
    ``runs[r]`` gives the run's leading columns (run, seed, grid values). Updates count from 1.
    """
    updates = next(iter(metrics.values())).shape[1]
    for offset in range(updates):
        for run_index, run in enumerate(runs):
            values = {name: values[run_index, offset].item() for name, values in metrics.items()}
            yield {**run, "update": first_update + offset + 1, **values}


def metrics_header(runs: Sequence[dict[str, Any]], metric_names: Sequence[str]) -> list[str]:
    """Column names: the run's columns, ``update``, then the metric names."""
    return [*runs[0].keys(), "update", *metric_names]


def append_metrics(path: Path, header: Sequence[str], rows: Iterable[dict[str, Any]]) -> None:
    """Append rows to the CSV at ``path``; a new file gets ``header``, an existing one keeps
    its own columns (a run folder from an older version lacks newer metrics: they are left
    out of it rather than failing its resume)."""
    path = Path(path)
    if path.exists():
        with open(path, newline="") as file:
            header = next(csv.reader(file))
    is_new = not path.exists()
    with open(path, "a", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(header), extrasaction="ignore")
        if is_new:
            writer.writeheader()
        writer.writerows(rows)


def truncate_metrics(path: Path, last_update: int) -> None:
    """Drop rows after ``last_update`` (written after the checkpoint a resumed run restarts
    from); atomically, so a crash leaves either the old or the new file."""
    with open(path, newline="") as file:
        rows = list(csv.reader(file))
    header, body = rows[0], rows[1:]
    column = header.index("update")
    kept = [row for row in body if int(row[column]) <= last_update]
    handle, temp_name = tempfile.mkstemp(dir=Path(path).parent, prefix=".metrics.")
    with os.fdopen(handle, "w", newline="") as file:
        csv.writer(file).writerows([header, *kept])
    os.replace(temp_name, path)


def read_metrics(path: Path) -> tuple[list[dict[str, str]], dict[str, np.ndarray]]:
    """Runs (their leading columns, in run order) and each metric as an array [runs, updates]."""
    with open(path, newline="") as file:
        reader = csv.reader(file)
        header = next(reader)
        body = list(reader)
    update_column = header.index("update")
    run_names, metric_names = header[:update_column], header[update_column + 1 :]
    runs: dict[int, dict[str, str]] = {}
    values: dict[int, dict[int, list[float]]] = {}
    for row in body:
        run = int(row[0])
        runs.setdefault(run, dict(zip(run_names, row[:update_column], strict=True)))
        values.setdefault(run, {})[int(row[update_column])] = [
            float(value) for value in row[update_column + 1 :]
        ]
    order = sorted(runs)
    table = np.array([[values[run][step] for step in sorted(values[run])] for run in order])
    table = table.reshape(len(order), -1, len(metric_names))
    metrics = {name: table[:, :, index] for index, name in enumerate(metric_names)}
    return [runs[run] for run in order], metrics


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
    curves: dict[str, np.ndarray], env_steps: np.ndarray, path: Path, title: str
) -> None:
    """Episode return against env steps, one line per label: the mean over seeds of each
    seed's 10-update rolling mean, shaded between the lowest and highest seed.

    ``curves`` maps a label to returns [seeds, updates]; ``env_steps`` is [updates].
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.2))
    for label, returns in curves.items():
        smooth = rolling_mean(returns)
        with warnings.catch_warnings():
            # An all-NaN column (no episode ended yet) should plot as a gap, silently.
            warnings.simplefilter("ignore", category=RuntimeWarning)
            mean = np.nanmean(smooth, axis=0)
            low, high = np.nanmin(smooth, axis=0), np.nanmax(smooth, axis=0)
        seeds = returns.shape[0]
        spread = f"{seeds} seeds, band: lowest to highest" if seeds > 1 else "1 seed"
        (line,) = axes.plot(env_steps, mean, label=f"{label} ({spread})")
        if seeds > 1:
            axes.fill_between(env_steps, low, high, color=line.get_color(), alpha=0.2, lw=0)
    axes.set_xlabel("env steps (per seed)")
    axes.set_ylabel("episode return (10-update mean)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(loc="best", fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _is_key(leaf: Any) -> bool:
    return jax.dtypes.issubdtype(getattr(leaf, "dtype", None), jax.dtypes.prng_key)


def to_savable(state: Any) -> Any:
    """The state with typed PRNG keys as their raw uint32 data, which orbax can write."""
    return jax.tree.map(lambda leaf: jax.random.key_data(leaf) if _is_key(leaf) else leaf, state)


def from_savable(saved: Any, template: Any) -> Any:
    """Undo ``to_savable``: wrap raw key data back into keys where ``template`` has keys."""
    return jax.tree.map(
        lambda leaf, like: jax.random.wrap_key_data(leaf) if _is_key(like) else leaf,
        saved,
        template,
    )


def open_checkpoints(run_dir: Path, keep: int | None = None) -> Any:
    """An orbax CheckpointManager over ``run_dir/checkpoints`` keeping the newest ``keep``
    (all when None). Orbax writes each step to a temporary folder and renames it when
    complete, so a crash never leaves a half-written checkpoint that looks finished."""
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=True, enable_async_checkpointing=False
    )
    return ocp.CheckpointManager(Path(run_dir).resolve() / CHECKPOINT_DIR, options=options)


def save_checkpoint(manager: Any, step: int, state: Any) -> None:
    """Save ``state`` (any pytree of arrays, keys included) as checkpoint ``step``."""
    import orbax.checkpoint as ocp

    manager.save(step, args=ocp.args.StandardSave(to_savable(state)), force=True)
    manager.wait_until_finished()


def restore_checkpoint(run_dir: Path, template: Any, step: int | None = None) -> tuple[Any, int]:
    """The state saved at ``step`` (the latest when None) and that step.

    ``template`` gives the pytree structure, shapes and dtypes (e.g. from ``jax.eval_shape``).
    """
    import orbax.checkpoint as ocp

    manager = open_checkpoints(run_dir)
    try:
        step = manager.latest_step() if step is None else step
        if step is None:
            raise ValueError(f"{Path(run_dir) / CHECKPOINT_DIR} holds no checkpoint")
        abstract = jax.eval_shape(to_savable, template)
        saved = manager.restore(step, args=ocp.args.StandardRestore(abstract))
    finally:
        manager.close()
    return from_savable(saved, template), int(step)


def versions() -> dict[str, str]:
    """Versions of Python, the packages ppojax runs on, and the JAX backend and devices."""
    packages = ("ppojax", "jax", "jaxlib", "flax", "optax", "distrax", "gymnax", "numpy")
    found = {"python": platform.python_version()}
    for name in (*packages, "orbax-checkpoint"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    found["backend"] = jax.default_backend()
    found["devices"] = ", ".join(str(device) for device in jax.devices())
    return found


def final_returns(returns: np.ndarray, window: int = 10) -> np.ndarray:
    """Each run's mean episode return over its last ``window`` updates: [runs, U] -> [runs]."""
    return rolling_mean(returns, window)[:, -1]
