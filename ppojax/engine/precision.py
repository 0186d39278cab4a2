"""Mixed precision: float32 master weights under bf16 compute.

A bf16 weight of 0.02 has a spacing of about 1.2e-4, so an Adam step at a post-training
learning rate (1e-6) rounds away on most bf16 entries. The trained params and Adam's moments
therefore stay in float32 (``widened``), and each step casts them once to the compute dtype
(``cast``) for its forward, backward and sampling; the cast sits inside the differentiated
function, so gradients arrive in float32. The compute dtype is the one the model's params
came in (``compute_dtype`` of a frozen copy such as the reference): a model loaded in bf16
computes in bf16 and trains float32 masters.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def floating(leaf: Any) -> bool:
    """Whether ``leaf`` is an array of floats (not ints, bools or PRNG keys)."""
    return hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.floating)


def widened(tree: Any) -> Any:
    """``tree`` with every floating leaf narrower than float32 in float32 (the masters)."""

    def widen(leaf: Any) -> Any:
        if floating(leaf) and jnp.finfo(leaf.dtype).bits < 32:
            return leaf.astype(jnp.float32)
        return leaf

    return jax.tree.map(widen, tree)


def cast(tree: Any, dtype: Any) -> Any:
    """``tree`` with its floating leaves in ``dtype`` (None: as they are)."""
    if dtype is None:
        return tree
    dtype = jnp.dtype(dtype)
    return jax.tree.map(lambda leaf: leaf.astype(dtype) if floating(leaf) else leaf, tree)


def compute_dtype(tree: Any) -> Any:
    """The one floating dtype of ``tree``'s leaves (the dtype a model was loaded in), or None
    when they mix dtypes or hold no floats."""
    dtypes = {jnp.dtype(leaf.dtype) for leaf in jax.tree.leaves(tree) if floating(leaf)}
    return dtypes.pop() if len(dtypes) == 1 else None
