"""PRNG draws of any shape through one flat draw, for compile time.

With JAX's default counter-based threefry (``jax_threefry_partitionable``), element i of a
draw is a function of the key and i alone, so a draw of shape (a, b) equals the draw of shape
(a * b,) reshaped: the values are bit for bit the same. XLA's CPU compiler, though, takes
seconds for a threefry whose last axis is short (a [128, 4] split or a [128, 4, 2] Gumbel
draw, more under ``vmap``) and a fraction of a second for one long axis (benchmarks/README.md at
54d94c6, "Compile time"). Every multi-axis draw in ppojax goes through here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import jax


def split(key: jax.Array, shape: Sequence[int]) -> jax.Array:
    """``jax.random.split(key, shape)``, drawn flat."""
    shape = tuple(shape)
    return jax.random.split(key, math.prod(shape)).reshape(shape)


def draw(sampler: Callable[..., jax.Array], key: jax.Array, shape: Sequence[int], *args, **kwargs):
    """``sampler(key, shape, *args, **kwargs)`` (``jax.random.normal``, ``gumbel``, ``bits``,
    ...), drawn flat."""
    shape = tuple(shape)
    return sampler(key, (math.prod(shape),), *args, **kwargs).reshape(shape)
