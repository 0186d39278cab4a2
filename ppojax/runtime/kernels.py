"""The one place where ppojax swaps faster stand-ins for plain JAX and optax calls.

The PPO core calls the functions here by what they compute: a random permutation, a key split,
a random draw, an optimizer step inside the update epochs, a scan that stacks its outputs. Each
has a plain form (the JAX or optax call a reader expects) and a stand-in that computes the same
values with fewer XLA kernels or a smaller program:

- ``permutation`` ("permutation"): sorts single uint32 words (random high bits, the index in
  the low bits) instead of jax's two-operand (key, value) sort; several times faster on CPU.
  A different draw, equally uniform (``sort_rounds``).
- ``split`` and ``draw`` ("draws"): one flat draw reshaped, bit for bit jax's values; XLA's
  CPU compiler takes seconds for a threefry whose last axis is short, a fraction of one for
  a long axis.
- ``epoch_optimizer`` ("optimizer"): the optimizer's parameter-shaped moments and the
  gradients travel as one array per dtype (``packing``), so Adam, clipping and the divergence
  guard take a few kernels per step instead of a few per parameter leaf. The same steps up to
  float32 rounding.
- ``scan`` ("scan"): a scan's stacked outputs (the per-step metrics) travel packed the same
  way.
- ``scan_drawing`` ("noise"): a rollout's randomness drawn for all its steps at once, not per
  step. Another draw of the same distribution.

On CPU at small batch sizes a training step is bound by kernel launches, not arithmetic;
benchmarks/stand_ins.py measures what the stand-ins are worth, paired against the plain forms
(benchmarks/results/stand_ins.json). The stand-ins are on by default; ``plain()`` (or the
environment variable PPOJAX_PLAIN_KERNELS=1, or a comma-separated list of names) turns them
off, all or by name (``STAND_INS``). The switch is read when a program is traced: a program
compiled under one setting keeps it.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from ppojax.runtime import packing

STAND_INS = ("draws", "permutation", "optimizer", "scan", "noise")


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


# --- randomness ---------------------------------------------------------------------------


def split(key: jax.Array, shape: Sequence[int]) -> jax.Array:
    """``jax.random.split(key, shape)``."""
    shape = tuple(shape)
    if not stand_in("draws"):
        return jax.random.split(key, shape)
    # With JAX's default counter-based threefry (jax_threefry_partitionable) element i of a
    # draw depends on the key and i alone, so the flat draw reshaped is bit for bit the same.
    return jax.random.split(key, math.prod(shape)).reshape(shape)


def draw(sampler: Callable[..., jax.Array], key: jax.Array, shape: Sequence[int], *args, **kwargs):
    """``sampler(key, shape, *args, **kwargs)`` (``jax.random.normal``, ``gumbel``, ``bits``...)."""
    shape = tuple(shape)
    if not stand_in("draws"):
        return sampler(key, shape, *args, **kwargs)
    return sampler(key, (math.prod(shape),), *args, **kwargs).reshape(shape)


def sort_rounds(size: int) -> int:
    """Rounds of the stand-in ``permutation`` for ``size`` items: enough random key bits per
    item that ties (which keep their order) are as rare as with 3 log2(size) random bits."""
    index_bits = max(size - 1, 1).bit_length()
    random_bits = 32 - index_bits
    if random_bits < 8:
        raise ValueError(f"cannot shuffle {size} samples: at most 2**24 samples per update")
    return -(-3 * index_bits // random_bits)


def permutation(key: jax.Array, size: int) -> jax.Array:
    """A uniformly random permutation of ``arange(size)``.

    The stand-in sorts, each round, one uint32 array whose high bits are random and whose low
    bits hold the item's index, and reads the indices back. Items whose random bits tie keep
    their order within a round; ``sort_rounds`` rounds, each applied on top of the last, leave
    the result as close to uniform as jax's own permutation.
    """
    if not stand_in("permutation"):
        return jax.random.permutation(key, size)
    index_bits = max(size - 1, 1).bit_length()
    mask = jnp.uint32((1 << index_bits) - 1)
    order = jnp.arange(size, dtype=jnp.int32)
    random_bits = draw(jax.random.bits, key, (sort_rounds(size), size), jnp.uint32)
    for bits in random_bits:
        packed = (bits << index_bits) | jnp.arange(size, dtype=jnp.uint32)
        order = order[(jnp.sort(packed) & mask).astype(jnp.int32)]
    return order


# --- the update epochs --------------------------------------------------------------------


class OptimizerStep(NamedTuple):
    updates: Any  # shaped like the parameters
    state: Any  # the optimizer state as the epochs carry it
    grad_norm: jax.Array  # global norm of the gradients
    update_norm: jax.Array  # global norm of the updates


class EpochOptimizer(NamedTuple):
    """An optax optimizer as the update epochs use it: ``enter`` the state before the epochs,
    ``step`` once per minibatch, ``leave`` after; the state between is the epochs' own."""

    enter: Callable[[Any], Any]
    step: Callable[[Any, Any, Any], OptimizerStep]  # (grads, state, params)
    leave: Callable[[Any], Any]


def epoch_optimizer(optimizer: optax.GradientTransformation, params: Any) -> EpochOptimizer:
    """``optimizer`` for epochs on parameters shaped like ``params``."""
    if not stand_in("optimizer"):

        def plain_step(grads: Any, state: Any, params: Any) -> OptimizerStep:
            updates, state = optimizer.update(grads, state, params)
            return OptimizerStep(updates, state, optax.tree.norm(grads), optax.tree.norm(updates))

        return EpochOptimizer(lambda state: state, plain_step, lambda state: state)

    def packed_step(grads: Any, state: Any, params: Any) -> OptimizerStep:
        grads, layout = packing.pack(grads)
        # the packed parameters are only built if the optimizer reads them (weight decay)
        updates, state = optimizer.update(grads, state, packing.pack(params)[0])
        norms = optax.tree.norm(grads), optax.tree.norm(updates)
        return OptimizerStep(packing.unpack(updates, layout), state, *norms)

    # the structure to unpack into: an optimizer state of these params (shapes only)
    template = jax.eval_shape(optimizer.init, params)
    return EpochOptimizer(
        enter=lambda state: packing.pack_subtrees(state, params),
        step=packed_step,
        leave=lambda state: packing.unpack_subtrees(state, template, params),
    )


def scan(step: Callable[[Any, Any], tuple[Any, Any]], carry: Any, xs: Any) -> tuple[Any, Any]:
    """``jax.lax.scan(step, carry, xs)``; the stand-in stacks the outputs packed."""
    if not stand_in("scan"):
        return jax.lax.scan(step, carry, xs)
    layouts: list[packing.Layout] = []  # filled when the step is traced

    def packed_step(carry: Any, x: Any):
        carry, out = step(carry, x)
        arrays, layout = packing.pack(out)
        layouts.append(layout)
        return carry, arrays

    carry, stacked = jax.lax.scan(packed_step, carry, xs)
    return carry, packing.unpack(stacked, layouts[0])


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
