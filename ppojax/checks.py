"""What the settings of ppojax share: ``ConfigError``, which names the field at fault, the
``EnvKwargs`` dict, and the checks of ints, bools, choices and number ranges (``PPOConfig``,
``RLHFConfig`` and ``Experiment`` build their validation from them)."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
from typing import Any

import jax
import numpy as np


def static(default: Any) -> Any:
    """A dataclass field that fixes the compiled program (shapes or structure): part of the
    pytree's structure, not a leaf, so ``vmap`` cannot sweep it and a new value recompiles.
    The metadata key is flax.struct's, so flax and plain dataclasses read it alike."""
    return dataclasses.field(default=default, metadata={"pytree_node": False})


def is_static(field: dataclasses.Field) -> bool:
    return not field.metadata.get("pytree_node", True)


def register_config(cls: type) -> type:
    """Register a frozen dataclass as a pytree: ``static`` fields in its structure, every other
    field a leaf (so ``jax.vmap`` sweeps it without recompiling)."""
    fields = dataclasses.fields(cls)
    return jax.tree_util.register_dataclass(
        cls,
        data_fields=[f.name for f in fields if not is_static(f)],
        meta_fields=[f.name for f in fields if is_static(f)],
    )


def _plain_kwarg(value: Any) -> Any:
    """A list (JSON's tuple) as a tuple, NumPy scalars as Python ones."""
    if isinstance(value, (list, tuple)):
        return tuple(_plain_kwarg(item) for item in value)
    return value.item() if isinstance(value, np.generic) else value


class EnvKwargs(dict):
    """``PPOConfig.env_kwargs``: a read-only dict that hashes, as static config fields must
    (jit caches programs by them), and writes to JSON as an object. Lists become tuples."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        items = {key: _plain_kwarg(value) for key, value in dict(*args, **kwargs).items()}
        super().__init__(items)

    def __hash__(self) -> int:  # type: ignore[override]
        # keys are checked to be str by validate; sorting by str keeps a bad key hashable
        # until then
        return hash(tuple(sorted(self.items(), key=lambda item: str(item[0]))))

    def _read_only(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("PPOConfig.env_kwargs is read-only; use config.replace(env_kwargs=...)")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _read_only
    __ior__ = _read_only  # type: ignore[assignment]


class ConfigError(ValueError):
    """An invalid setting. ``field`` names the field at fault (None when unknown), so that a
    caller can say where the value came from (a flag, a config file)."""

    def __init__(self, field: str | None, message: str) -> None:
        super().__init__(message)
        self.field = field


def as_flag(error: ConfigError, owner: str) -> ValueError:
    """``error`` with ``owner.field`` said as the flag that set it (``--field-name``)."""
    flag = "--" + str(error.field).replace("_", "-")
    return ValueError(str(error).replace(f"{owner}.{error.field}", flag))


def show(value: Any, plain: tuple[type, ...] = (int, float)) -> str:
    """``value`` for an error message: its repr, with its type unless that is one of
    ``plain`` (the expected ones)."""
    if value is None or type(value) in plain:
        return repr(value)
    return f"{value!r} ({type(value).__name__})"


def _concrete_numbers(value: Any) -> np.ndarray | None:
    """The numbers in ``value`` (a scalar or an array of them) as float64, or None when they
    are not known here: tracers under jit/vmap, abstract shapes, pytree placeholders."""
    if isinstance(value, (int, float, np.integer, np.floating)):
        return np.asarray([float(value)])
    if isinstance(value, jax.core.Tracer):
        return None
    if isinstance(value, (np.ndarray, jax.Array)) and np.dtype(value.dtype).kind in "iuf":
        return np.asarray(value, np.float64)
    return None


def is_int(value: Any) -> bool:
    """Whether ``value`` is a Python or NumPy int (bools excluded)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_positive_int(owner: str, name: str, value: Any) -> None:
    """Raise ``ConfigError`` naming ``owner.name`` unless ``value`` is an int > 0."""
    if is_int(value) and value > 0:
        return
    hint = ""
    if isinstance(value, float) and value.is_integer() and value > 0:
        hint = f"; write {int(value)}"
    elif isinstance(value, str) and value.strip().isdigit() and int(value) > 0:
        hint = f"; write {value.strip()} without quotes"
    message = f"{owner}.{name} must be a positive int, got {show(value, (int,))}{hint}."
    raise ConfigError(name, message)


def check_bool(owner: str, name: str, value: Any) -> None:
    """Raise ``ConfigError`` naming ``owner.name`` unless ``value`` is True or False."""
    if isinstance(value, (bool, np.bool_)):
        return
    raise ConfigError(name, f"{owner}.{name} must be True or False (a bool), got {show(value)}.")


def check_choice(owner: str, name: str, value: Any, choices: tuple[str, ...]) -> None:
    """Raise ``ConfigError`` naming ``owner.name`` unless ``value`` is one of ``choices``."""
    if isinstance(value, str) and value in choices:
        return
    close = difflib.get_close_matches(value, choices, n=1) if isinstance(value, str) else []
    hint = f" Did you mean {close[0]!r}?" if close else ""
    options = ", ".join(repr(choice) for choice in choices)
    message = f"{owner}.{name} {show(value, (str,))} is unknown; use one of {options}.{hint}"
    raise ConfigError(name, message)


def check_range(
    owner: str,
    name: str,
    value: Any,
    low: float,
    high: float,
    *,
    open_low: bool,
    optional: bool = False,
) -> None:
    """Raise ``ConfigError`` naming ``owner.name`` unless ``value`` is a finite number in
    [low, high] (or (low, high] with ``open_low``), or an array of such numbers. Traced and
    abstract values pass: they are checked where they are made (per grid point for sweeps).
    ``optional``: the field also takes None (checked by the caller), which the message says."""
    if math.isinf(high):
        wanted = f"a finite number {'>' if open_low else '>='} {low:g}"
    else:
        wanted = f"a number in {'(' if open_low else '['}{low:g}, {high:g}]"
    if optional:
        wanted += " or None (off)"
    if value is None or isinstance(value, (str, bool, np.bool_, list, tuple, dict)):
        raise ConfigError(name, f"{owner}.{name} must be {wanted}, got {show(value)}.")
    numbers = _concrete_numbers(value)
    if numbers is None:
        return
    for number in numbers.ravel():
        below = number <= low if open_low else number < low
        if not math.isfinite(number) or below or number > high:
            raise ConfigError(name, f"{owner}.{name} must be {wanted}, got {value!r}.")


def parse_bool(text: str) -> bool:
    """A bool flag's text: 1/true/yes/on or 0/false/no/off, any case."""
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
