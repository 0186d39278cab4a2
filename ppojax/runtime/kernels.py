"""The one place where ppojax swaps a faster stand-in for a plain JAX call of its core.

The core calls ``scan_drawing`` by what it computes: a rollout's ``lax.scan`` whose steps each
get their randomness. The plain form draws each step's own inside the step; the stand-in
("noise") draws the randomness of all steps at once, one batched PRNG call per kind of
randomness instead of a handful of small PRNG kernels per step, which on CPU at small batch
sizes costs more than the env dynamics. Another draw of the same distribution.

A stand-in stays only while a paired benchmark shows it worth about 10% or more
(benchmarks/stand_ins.py, benchmarks/results/stand_ins.json). This one measured 12% and 8% at
1 seed of the classic CartPole config in two runs, 3% and 5% at 8 seeds: at the line. Others
measured below it (a single-operand sort permutation, flat PRNG draws, optimizer moments and
metrics packed one array per dtype: -4% to +8%) were removed for the plain calls.

``plain()`` (or the environment variable PPOJAX_PLAIN_KERNELS=1, or a comma-separated list of
names) turns the stand-ins off, all or by name (``STAND_INS``). The switch is read when a
program is traced: a program compiled under one setting keeps it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import jax

STAND_INS = ("noise",)


def _plain_from_environment() -> frozenset[str]:
    value = os.environ.get("PPOJAX_PLAIN_KERNELS", "").strip()
    if value in ("", "0"):
        return frozenset()
    if value == "1":
        return frozenset(STAND_INS)
    names = frozenset(name.strip() for name in value.split(","))
    unknown = names - set(STAND_INS)
    if unknown:
        raise ValueError(
            f"PPOJAX_PLAIN_KERNELS names {sorted(unknown)}: use 1 (all), or some of {STAND_INS}"
        )
    return names


_plain = _plain_from_environment()


def stand_in(name: str) -> bool:
    """Whether programs traced now use the stand-in ``name`` (one of STAND_INS)."""
    return name not in _plain


def stand_ins_on() -> bool:
    """Whether programs traced now use every stand-in (the default)."""
    return not _plain


@contextlib.contextmanager
def plain(*names: str) -> Iterator[None]:
    """Trace programs with the plain forms of ``names`` (default: all STAND_INS) inside this
    block."""
    global _plain
    unknown = set(names) - set(STAND_INS)
    if unknown:
        raise ValueError(f"no stand-in named {sorted(unknown)}; they are {STAND_INS}")
    before = _plain
    _plain = before | frozenset(names or STAND_INS)
    try:
        yield
    finally:
        _plain = before


def scan_drawing(
    step: Callable[[Any, Any], tuple[Any, Any]],
    carry: Any,
    key: jax.Array,
    draw: Callable[[jax.Array, int], Any],
    length: int,
) -> tuple[Any, Any]:
    """``length`` scan steps, each given its randomness: ``draw(key, n)`` is the randomness of
    ``n`` steps ([n, ...] leaves). The plain form draws each step's own inside the step; the
    stand-in draws all ``length`` at once before the scan, one batched PRNG call per kind of
    randomness instead of a handful of small PRNG kernels per step."""
    if not stand_in("noise"):

        def drawing_step(carry: Any, step_key: jax.Array):
            return step(carry, jax.tree.map(lambda x: x[0], draw(step_key, 1)))

        return jax.lax.scan(drawing_step, carry, jax.random.split(key, length))
    return jax.lax.scan(step, carry, draw(key, length))
