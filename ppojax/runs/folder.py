"""Run folders: config and run settings as JSON, metrics as CSV and a summary (the plots are
``ppojax.runs.plots``'s, the checkpoints ``ppojax.runs.checkpoints``'s).

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
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ppojax.ppo.config import ConfigError, PPOConfig
from ppojax.runs.plots import plot_learning_curves  # noqa: F401  (notebooks call it here)

CONFIG_FILE = "config.json"
RUN_FILE = "run.json"
METRICS_FILE = "metrics.csv"
CURVE_FILE = "learning_curve.png"
SUMMARY_FILE = "summary.json"
CHECKPOINT_DIR = "checkpoints"
TENSORBOARD_DIR = "tensorboard"


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON atomically (temp file in the same folder, flushed to
    disk, then renamed over ``path``): a crash leaves the old file or the new one."""
    path = Path(path)
    handle, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(handle, "w") as file:
        json.dump(data, file, indent=2, allow_nan=True)
        file.write("\n")
        file.flush()
        os.fsync(file.fileno())
    os.replace(temp_name, path)


def read_text(path: Path) -> str:
    """The text of a run-folder file; a ``ValueError`` naming the file when it is missing,
    unreadable, not UTF-8 or empty."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ValueError(f"{path} is missing") from None
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not text (UTF-8)") from None
    if not text.strip():
        raise ValueError(f"{path} is empty")
    return text


def require_run_folder(run_dir: str | Path) -> Path:
    """``run_dir`` for ``--resume``: a ``ValueError`` naming it when it has no config.json."""
    if not (Path(run_dir) / CONFIG_FILE).exists():
        raise ValueError(f"--resume {run_dir}: no {CONFIG_FILE} there (not a run folder)")
    return Path(run_dir)


def check_writable(run_dir: Path) -> None:
    """A ``ValueError`` naming the folder unless files can be made in ``run_dir`` and the
    folders in it that a resume writes: a probe file is made and removed in each (the file
    system's own answer, which read-only mounts and ACLs give too)."""
    for folder in (run_dir, run_dir / CHECKPOINT_DIR, run_dir / TENSORBOARD_DIR):
        if not folder.is_dir():
            continue
        try:
            handle, probe = tempfile.mkstemp(prefix=".ppojax-write-probe-", dir=folder)
        except OSError as error:
            raise ValueError(
                f"--resume {run_dir}: cannot write to the run folder ({folder}: "
                f"{error.strerror}); make it writable (chmod -R u+w {run_dir}) or copy it to a "
                "folder you can write to"
            ) from None
        os.close(handle)
        os.unlink(probe)


def read_json(path: Path) -> Any:
    """The JSON in ``path``; a ``ValueError`` naming the file when it is missing, empty or not
    valid JSON."""
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from None


def read_json_object(path: Path, holds: str) -> dict[str, Any]:
    """The JSON object in ``path``, which ``holds`` the named content (for the error)."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object of {holds}, got {json_kind(data)}")
    return data


def json_kind(value: Any) -> str:
    """What a JSON value is, in JSON's words (for errors)."""
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "true or false"}
    if value is None:
        return "null"
    return kinds.get(type(value), "a number")


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


# What a run folder's runs default to where PPOConfig's own default differs: long unattended
# runs keep the divergence guard (one NaN step would otherwise end a run hours long), while
# PPOConfig leaves it off for the Python path's small, fast seed sweeps.
RUN_FOLDER_DEFAULTS: dict[str, Any] = {"divergence_guard": True}


def config_from_dict(settings: dict[str, Any]) -> PPOConfig:
    """A validated PPOConfig from ``settings`` (a config.json or .toml): missing fields take
    ``RUN_FOLDER_DEFAULTS``, then the env's preset, unknown ones raise ``UnknownFieldError``
    naming close matches, lists become tuples, and "none" / "off" switch an optional feature
    off (TOML has no null)."""
    settings = {**RUN_FOLDER_DEFAULTS, **settings}
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


def check_out_dir(out: Path) -> None:
    """Raise ``ValueError`` unless ``out`` is a folder or can be made one (no file in the way)."""
    for folder in (Path(out), *Path(out).parents):
        if folder.exists() and not folder.is_dir():
            where = f"--out {out}" if folder == Path(out) else f"--out {out}: {folder}"
            raise ValueError(
                f"{where} is a file, not a folder; give a folder for the run folders (runs/)"
            )


def new_run_dir(out: Path, env_id: str) -> Path:
    """A fresh folder ``out/<env_id>-<UTC time>`` (suffixed -2, -3, ... if taken)."""
    check_out_dir(out)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    base = Path(out) / f"{env_id.replace('/', '-')}-{stamp}"
    candidate, number = base, 1
    while True:
        try:
            candidate.mkdir(parents=True)
            return candidate
        except FileExistsError:
            number += 1
            candidate = base.with_name(f"{base.name}-{number}")
        except OSError as error:
            raise ValueError(f"--out {out}: cannot make the run folder: {error.strerror}") from None


def metric_rows(
    runs: Sequence[dict[str, Any]], first_update: int, metrics: dict[str, np.ndarray]
) -> Iterable[dict[str, Any]]:
    """CSV rows of a chunk, update by update and run by run within an update (so the file is
    the same however the updates were chunked): ``metrics`` maps name -> [runs, updates];
    ``runs[r]`` gives the run's leading columns (run, seed, grid values). Updates count from 1.
    """
    updates = next(iter(metrics.values())).shape[1]
    # One tolist() per metric gives the Python numbers item() would, value by value.
    columns = {name: np.asarray(values).tolist() for name, values in metrics.items()}
    for offset in range(updates):
        for run_index, run in enumerate(runs):
            values = {name: column[run_index][offset] for name, column in columns.items()}
            yield {**run, "update": first_update + offset + 1, **values}


def metrics_header(runs: Sequence[dict[str, Any]], metric_names: Sequence[str]) -> list[str]:
    """Column names: the run's columns, ``update``, then the metric names."""
    return [*runs[0].keys(), "update", *metric_names]


def append_metrics(path: Path, header: Sequence[str], rows: Iterable[dict[str, Any]]) -> None:
    """Append rows to the CSV at ``path``; a new file gets ``header``, an existing one keeps
    its own columns (a run folder from an older version lacks newer metrics: they are left
    out of it rather than failing its resume)."""
    path = Path(path)
    is_new = not path.exists()
    if not is_new:
        with open(path, newline="") as file:
            header = next(csv.reader(file))
    with open(path, "a", newline="") as file:
        writer = csv.writer(file)
        if is_new:
            writer.writerow(header)
        writer.writerows([row.get(name, "") for name in header] for row in rows)


MetricRow = tuple[int, int, list[str]]  # run, update, the row as written


def _metric_rows(path: Path) -> tuple[list[str], list[MetricRow]]:
    """The header and whole rows of a metrics.csv; a ``ValueError`` naming the file, line and
    column of anything that is not what ppojax writes. A last line without its line end was
    cut short by a kill while appending and is left out."""
    text = read_text(path)
    lines = text.splitlines(keepends=True)
    if len(lines) > 1 and not lines[-1].endswith("\n"):
        lines = lines[:-1]
    rows = list(csv.reader(lines))
    header = rows[0] if rows else []
    if header[:1] != ["run"] or "update" not in header:
        raise ValueError(
            f"{path}: line 1 must be the header ppojax writes (run, seed, ..., update, "
            f"metrics), got {','.join(header)[:80]!r}"
        )
    column = header.index("update")
    parsed = []
    for number, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise ValueError(
                f"{path}: line {number} has {len(row)} values, the header {len(header)}"
            )
        for name, value in zip(header[column + 1 :], row[column + 1 :], strict=True):
            try:
                float(value)
            except ValueError:
                raise ValueError(
                    f"{path}: line {number}, column {name!r}: {value!r} is not a number"
                ) from None
        run, update = row[0], row[column]
        if not (run.isdigit() and update.isdigit() and int(update) > 0):
            raise ValueError(
                f"{path}: line {number}: run {run!r} and update {update!r} must be "
                "whole numbers, the update from 1"
            )
        parsed.append((int(run), int(update), row))
    return header, parsed


def check_metric_rows(path: Path, rows: Sequence[MetricRow], runs: int, last_update: int) -> None:
    """Raise ``ValueError`` naming ``path`` unless ``rows`` hold exactly one row for each of
    ``runs`` runs at every update 1..``last_update``."""
    seen: dict[tuple[int, int], int] = {}
    for run, update, _ in rows:
        seen[run, update] = seen.get((run, update), 0) + 1
    extra = sorted(run for run, _ in seen if run >= runs)
    if extra:
        raise ValueError(f"{path} has rows of run {extra[0]}, but the run folder has {runs} runs")
    for update in range(1, last_update + 1):
        for run in range(runs):
            count = seen.get((run, update), 0)
            if count != 1:
                problem = "no row" if count == 0 else f"{count} rows"
                raise ValueError(
                    f"{path} has {problem} for update {update} of run {run}, which the "
                    f"checkpoint at update {last_update} needs: restore the file or start a new run"
                )


def metrics_until(
    path: Path, last_update: int, runs: int
) -> tuple[list[str], list[list[str]], dict[str, np.ndarray]]:
    """Read-only: the header of a metrics.csv, its rows up to ``last_update`` (those after it
    were written after the checkpoint a resumed run restarts from) and their metrics
    [runs, last_update]; a ``ValueError`` naming the file if they are not whole."""
    return _metrics_table(path, *_metric_rows(path), last_update, runs)


def _metrics_table(
    path: Path, header: list[str], rows: list[MetricRow], last_update: int, runs: int
) -> tuple[list[str], list[list[str]], dict[str, np.ndarray]]:
    kept = [row for row in rows if row[1] <= last_update]
    check_metric_rows(path, kept, runs, last_update)
    kept.sort(key=lambda row: (row[1], row[0]))
    column = header.index("update")
    table = np.array([[float(value) for value in row[column + 1 :]] for _, _, row in kept])
    table = table.reshape(last_update, runs, len(header) - column - 1).transpose(1, 0, 2)
    metrics = {name: table[:, :, index] for index, name in enumerate(header[column + 1 :])}
    return header, [row for _, _, row in kept], metrics


def write_metrics(path: Path, header: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """Replace the CSV at ``path`` atomically, so a crash leaves the old or the new file."""
    handle, temp_name = tempfile.mkstemp(dir=Path(path).parent, prefix=".metrics.")
    with os.fdopen(handle, "w", newline="") as file:
        csv.writer(file).writerows([header, *rows])
        file.flush()
        os.fsync(file.fileno())
    os.replace(temp_name, path)


def truncate_metrics(path: Path, last_update: int) -> None:
    """Drop rows after ``last_update`` (written after the checkpoint a resumed run restarts
    from), and a row cut short by a kill; atomically."""
    header, rows = _metric_rows(path)
    write_metrics(path, header, [row for _, update, row in rows if update <= last_update])


def read_metrics(path: Path) -> tuple[list[dict[str, str]], dict[str, np.ndarray]]:
    """Runs (their leading columns, in run order) and each metric as an array [runs, updates];
    a ``ValueError`` naming the file unless every run has a row at every update 1..U."""
    header, rows = _metric_rows(path)
    runs = 1 + max((run for run, _, _ in rows), default=-1)
    last = max((update for _, update, _ in rows), default=0)
    _, kept, metrics = _metrics_table(path, header, rows, last, runs)
    column = header.index("update")
    leading = {int(row[0]): dict(zip(header[:column], row[:column], strict=True)) for row in kept}
    return [leading[run] for run in range(runs)], metrics


def versions() -> dict[str, str]:
    """Versions of Python, the packages ppojax runs on, and the JAX backend and devices."""
    packages = ("ppojax", "jax", "jaxlib", "flax", "optax", "gymnax", "numpy")
    found = {"python": platform.python_version()}
    for name in (*packages, "orbax-checkpoint"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    found["backend"] = jax.default_backend()
    found["devices"] = ", ".join(str(device) for device in jax.devices())
    return found
