import jax
import jax.numpy as jnp
import numpy as np
import optax
from tolerance import assert_trees_close, assert_trees_equal

from ppojax.runtime import packing


def _tree():
    return {
        "obs": jnp.arange(5 * 2 * 3, dtype=jnp.float32).reshape(5, 2, 3),
        "action": jnp.arange(5, dtype=jnp.int32),
        "done": jnp.array([True, False, True, False, False]),
        "value": -jnp.arange(5, dtype=jnp.float32),
        "nested": (jnp.ones((5, 4), jnp.bfloat16), None),
    }


def test_pack_makes_one_array_per_dtype_in_tree_order():
    arrays, layout = packing.pack(_tree(), batch_ndim=1)
    # leaves in tree order: action, done, nested[0], obs, value
    assert [a.dtype for a in arrays] == [jnp.int32, jnp.bool_, jnp.bfloat16, jnp.float32]
    assert [a.shape for a in arrays] == [(5, 1), (5, 1), (5, 4), (5, 7)]
    np.testing.assert_array_equal(arrays[3][:, :6], np.arange(30).reshape(5, 6))
    np.testing.assert_array_equal(arrays[3][:, 6], -np.arange(5))
    assert hash(layout) == hash(packing.layout_of(_tree(), batch_ndim=1))  # static


def test_unpack_restores_every_leaf_bit_for_bit_with_extra_leading_axes():
    tree = _tree()
    arrays, layout = packing.pack(tree, batch_ndim=1)
    assert_trees_equal(packing.unpack(arrays, layout), tree)
    # a scan's stacked output: every leaf gains the leading axis
    stacked = tuple(jnp.stack([a, a]) for a in arrays)
    restored = packing.unpack(stacked, layout)
    assert restored["obs"].shape == (2, 5, 2, 3) and restored["nested"][1] is None
    assert_trees_equal(restored, jax.tree.map(lambda x: jnp.stack([x, x]), tree))


def test_optimizer_moments_pack_and_unpack_around_the_step_count():
    params = {"b": jnp.zeros(3), "w": jnp.ones((2, 3))}
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))
    state = optimizer.init(params)
    grads = {"b": jnp.array([1.0, -2.0, 3.0]), "w": jnp.full((2, 3), 0.5)}
    _, state = optimizer.update(grads, state, params)
    packed = packing.pack_subtrees(state, params)
    adam = packed[1][0]
    assert isinstance(adam.mu, tuple) and adam.mu[0].shape == (9,)
    assert adam.count.shape == () and int(adam.count) == 1  # not shaped like params: kept
    assert_trees_equal(packing.unpack_subtrees(packed, state, params), state)


def test_an_optimizer_step_on_packed_parameters_matches_the_step_on_the_tree():
    params = {"b": jnp.array([0.1, 0.2, 0.3]), "w": jnp.ones((2, 3))}
    grads = {"b": jnp.array([1.0, -2.0, 3.0]), "w": jnp.full((2, 3), 0.5)}
    optimizer = optax.adam(1e-2)  # elementwise: the same arithmetic on every element
    state = optimizer.init(params)
    updates, new_state = optimizer.update(grads, state, params)
    flat, layout = packing.pack(params)
    flat_updates, flat_state = optimizer.update(
        packing.pack(grads)[0], packing.pack_subtrees(state, params), flat
    )
    # Elementwise, but arrays of another length compile to other loops (vector width, fused
    # multiply-adds): each of Adam's half-dozen roundings may differ by an ulp of its result.
    assert_trees_close(packing.unpack(flat_updates, layout), updates, ulps=8, scale=0.0)
    packed_state = packing.unpack_subtrees(flat_state, state, params)
    assert_trees_close(packed_state, new_state, ulps=8, scale=0.0)
