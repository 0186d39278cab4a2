"""A pytree as one array per dtype, for fewer kernels on small batches.

On CPU at small batch sizes (the classic 4-env config) a training step is bound by kernel
launches, not arithmetic: XLA runs one kernel per leaf for an optimizer's update, a ``where``
or a scan's stacked output, each ~1.5 us whatever its size. Packing the leaves of a pytree into
one array per dtype turns a dozen such kernels into one or two; the update epochs pack the
optimizer's moments, the gradients and the per-step metrics this way (benchmarks/README.md at
54d94c6, "Kernel launches").

``pack(tree, batch_ndim)`` keeps each leaf's first ``batch_ndim`` axes and flattens the rest
into the last axis; the leaves of one dtype are concatenated there, in tree order. ``unpack``
reads them back and accepts any number of extra leading axes (a scan's stacked output). Values
round-trip bit for bit: nothing is cast.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class LeafSlot(NamedTuple):
    group: int  # index into the packed tuple
    start: int
    stop: int
    shape: tuple[int, ...]  # the leaf's shape after its batch axes


class Layout(NamedTuple):
    """Where each leaf of a packed tree lives; static (hashable)."""

    treedef: Any
    dtypes: tuple[np.dtype, ...]
    slots: tuple[LeafSlot, ...]


def layout_of(tree: Any, batch_ndim: int = 0) -> Layout:
    """The layout ``pack(tree, batch_ndim)`` uses; ``tree`` may hold ShapeDtypeStructs."""
    leaves, treedef = jax.tree.flatten(tree)
    dtypes: list[np.dtype] = []
    sizes: list[int] = []
    slots = []
    for leaf in leaves:
        dtype = np.dtype(leaf.dtype)
        if dtype not in dtypes:
            dtypes.append(dtype)
            sizes.append(0)
        group = dtypes.index(dtype)
        shape = tuple(leaf.shape[batch_ndim:])
        size = math.prod(shape)
        slots.append(LeafSlot(group, sizes[group], sizes[group] + size, shape))
        sizes[group] += size
    return Layout(treedef, tuple(dtypes), tuple(slots))


def pack(tree: Any, batch_ndim: int = 0) -> tuple[tuple[jax.Array, ...], Layout]:
    """One array per dtype, [*batch, features], and the layout to read ``tree`` back."""
    layout = layout_of(tree, batch_ndim)
    leaves = jax.tree.leaves(tree)
    groups: list[list[jax.Array]] = [[] for _ in layout.dtypes]
    for leaf, slot in zip(leaves, layout.slots, strict=True):
        batch = leaf.shape[:batch_ndim]
        groups[slot.group].append(jnp.reshape(leaf, batch + (slot.stop - slot.start,)))
    arrays = tuple(
        parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=-1) for parts in groups
    )
    return arrays, layout


def unpack(arrays: tuple[jax.Array, ...], layout: Layout) -> Any:
    """The tree that ``pack`` packed into ``arrays`` with ``layout``; extra leading axes of
    ``arrays`` (beyond the layout's batch axes) lead every leaf."""
    leaves = []
    for slot in layout.slots:
        array = arrays[slot.group]
        whole = slot.start == 0 and slot.stop == array.shape[-1]
        part = array if whole else array[..., slot.start : slot.stop]
        leaves.append(jnp.reshape(part, array.shape[:-1] + slot.shape))
    return jax.tree.unflatten(layout.treedef, leaves)


def _like(template: Any) -> Any:
    """A predicate: is a node a tree of ``template``'s structure, shapes and dtypes?"""
    treedef = jax.tree.structure(template)
    kinds = [(leaf.shape, np.dtype(leaf.dtype)) for leaf in jax.tree.leaves(template)]

    def like(node: Any) -> bool:
        if jax.tree.structure(node) != treedef:
            return False
        return [(leaf.shape, np.dtype(leaf.dtype)) for leaf in jax.tree.leaves(node)] == kinds

    return like


def pack_subtrees(tree: Any, template: Any) -> Any:
    """``tree`` with every subtree shaped like ``template`` packed (``pack``, no batch axes):
    an optimizer state's moments, shaped like the parameters, become one array per dtype."""
    like = _like(template)
    nodes, outer = jax.tree.flatten(tree, is_leaf=like)
    return jax.tree.unflatten(outer, [pack(node)[0] if like(node) else node for node in nodes])


def unpack_subtrees(packed: Any, original: Any, template: Any) -> Any:
    """The inverse of ``pack_subtrees(original, template)`` for ``packed``, a tree of the
    same form (new values, same structure)."""
    like = _like(template)
    nodes, outer = jax.tree.flatten(original, is_leaf=like)
    parts = outer.flatten_up_to(packed)
    restored = [
        unpack(part, layout_of(node)) if like(node) else part
        for node, part in zip(nodes, parts, strict=True)
    ]
    return jax.tree.unflatten(outer, restored)
