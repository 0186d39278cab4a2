"""ppojax.runtime.kernels: each stand-in computes what its plain form computes, and ``plain()``
really swaps the plain form in.

Random bits and keys are integers and must match exactly. Normal, Gumbel and uniform values
are the same elementwise float32 functions of those bits in two programs of different shapes,
where XLA may vectorize the tail differently: they are compared within 4 float32 ulps of their
magnitude (order 1, Gumbel tails up to ~10)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from tolerance import TRAINING_ULPS, assert_close, assert_trees_close

import ppojax
from ppojax.ppo.update import OptimizerCarry, run_epochs
from ppojax.runtime import kernels


@pytest.mark.parametrize("shape", [(128, 4), (3, 5, 2), (7,)])
def test_flat_draws_equal_jax_random_draws_of_the_shape(shape):
    key = jax.random.key(11)
    np.testing.assert_array_equal(
        jax.random.key_data(kernels.split(key, shape)),
        jax.random.key_data(jax.random.split(key, shape)),
    )
    np.testing.assert_array_equal(
        kernels.draw(jax.random.bits, key, shape), jax.random.bits(key, shape)
    )
    for sampler in (jax.random.normal, jax.random.gumbel, jax.random.uniform):
        assert_close(kernels.draw(sampler, key, shape), sampler(key, shape), ulps=4)


def test_flat_draws_equal_jax_random_draws_under_vmap():
    keys = jax.random.split(jax.random.key(3), 4)
    ours = jax.jit(jax.vmap(lambda k: kernels.draw(jax.random.gumbel, k, (16, 4, 2))))(keys)
    theirs = jax.jit(jax.vmap(lambda k: jax.random.gumbel(k, (16, 4, 2))))(keys)
    assert_close(ours, theirs, ulps=4)


def test_permutation_is_uniform_over_all_orders():
    keys = jax.random.split(jax.random.key(0), 24_000)
    orders = np.asarray(jax.jit(jax.vmap(lambda key: kernels.permutation(key, 4)))(keys))
    np.testing.assert_array_equal(np.sort(orders, axis=1), np.tile(np.arange(4), (24_000, 1)))
    _, counts = np.unique(orders, axis=0, return_counts=True)
    assert len(counts) == 24  # every order of 4 items appears, each about 1000 times
    # a chi-square test with 23 degrees of freedom: 49.7 is its 0.999 quantile
    assert ((counts - 1000.0) ** 2 / 1000.0).sum() < 49.7


def test_permutation_of_a_large_batch_visits_every_item_once():
    order = np.asarray(kernels.permutation(jax.random.key(3), 32_768))
    np.testing.assert_array_equal(np.sort(order), np.arange(32_768))
    # positions and items are uncorrelated
    assert abs(np.corrcoef(order, np.arange(32_768))[0, 1]) < 0.03


def test_sort_rounds_give_enough_random_bits():
    assert kernels.sort_rounds(512) == 2  # 2 x 23 random bits per item >= 3 x 9
    assert kernels.sort_rounds(32_768) == 3  # 3 x 17 >= 3 x 15
    with pytest.raises(ValueError, match="2\\*\\*24"):
        kernels.sort_rounds(2**25)


def test_plain_swaps_in_jax_permutation_and_restores_the_stand_in():
    key = jax.random.key(5)
    with kernels.plain():
        assert not kernels.stand_ins_on()
        plain = kernels.permutation(key, 64)
    assert kernels.stand_ins_on()
    np.testing.assert_array_equal(plain, jax.random.permutation(key, 64))
    assert not np.array_equal(kernels.permutation(key, 64), plain)


def _packed_and_plain(fn):
    """``fn()`` traced with the stand-ins and with the plain forms."""
    fast = jax.jit(fn)()
    with kernels.plain():
        slow = jax.jit(lambda: fn())()
    return fast, slow


def test_epoch_optimizer_steps_equal_optax_on_the_tree():
    params = {"b": jnp.array([0.1, 0.2, 0.3]), "w": jnp.ones((2, 3))}
    grads = {"b": jnp.array([1.0, -2.0, 3.0]), "w": jnp.full((2, 3), 0.5)}
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))

    def two_steps():
        epochs = kernels.epoch_optimizer(optimizer, params)
        state = epochs.enter(optimizer.init(params))
        for _ in range(2):
            step = epochs.step(grads, state, params)
            state = step.state
        return step.updates, epochs.leave(state), step.grad_norm, step.update_norm

    (updates, state, grad_norm, update_norm), plain = _packed_and_plain(two_steps)
    # the plain state is optax's own; the packed one reads back into the same structure
    assert jax.tree.structure(state) == jax.tree.structure(plain[1])
    # Elementwise Adam on arrays of another length compiles to other vector loops (fused
    # multiply-adds): each of its half-dozen roundings may differ by an ulp of its result;
    # the global norms sum 9 terms of order 1 in another order.
    assert_trees_close((updates, state), plain[:2], ulps=8, scale=0.0)
    assert_close(grad_norm, plain[2], ulps=8)
    assert_close(update_norm, plain[3], ulps=8)
    assert_close(grad_norm, np.sqrt(14.0 + 6 * 0.25), ulps=8)


def test_run_epochs_with_the_stand_ins_takes_the_plain_steps():
    # One minibatch, so the shuffle's order changes only the order of the loss's sum.
    data = jax.random.normal(jax.random.key(0), (32, 3))
    target = data @ jnp.array([1.0, -2.0, 0.5])
    params = {"w": jnp.zeros(3), "b": jnp.zeros(())}
    optimizer = optax.chain(optax.clip_by_global_norm(0.5), optax.adam(3e-2))

    def loss_fn(params, batch):
        x, y = batch
        error = x @ params["w"] + params["b"] - y
        return (error**2).mean(), {"error": jnp.abs(error).mean()}

    def epochs():
        carry = OptimizerCarry(params, optimizer.init(params))
        return run_epochs(
            loss_fn,
            optimizer,
            carry,
            (data, target),
            jax.random.key(1),
            num_epochs=6,
            num_minibatches=1,
        )

    (carry, metrics), (plain_carry, plain_metrics) = _packed_and_plain(epochs)
    # Six Adam steps from terms of order 1: a few ulps per step, carried on (TRAINING_ULPS).
    assert_trees_close(carry, plain_carry, ulps=TRAINING_ULPS)
    assert_trees_close(metrics, plain_metrics, ulps=TRAINING_ULPS)
    assert float(metrics["gradient_steps"]) == 6.0
    assert float(carry.params["w"][0]) > 0.1  # the steps moved the parameters


def test_scan_drawing_draws_ahead_or_per_step():
    def draw(key, steps):
        return {"u": jax.random.uniform(key, (steps, 3))}

    def step(total, noise):
        return total + noise["u"].sum(), noise["u"]

    key = jax.random.key(2)
    total, drawn = kernels.scan_drawing(step, 0.0, key, draw, 5)
    np.testing.assert_array_equal(drawn, draw(key, 5)["u"])  # all five drawn at once
    with kernels.plain():
        plain_total, per_step = kernels.scan_drawing(step, 0.0, key, draw, 5)
    step_keys = jax.random.split(key, 5)
    for i in range(5):  # each step drew its own, from its own key
        np.testing.assert_array_equal(per_step[i], draw(step_keys[i], 1)["u"][0])
    # 15 uniforms summed in another order: a few ulps of the total (~7.5)
    assert_close(plain_total, per_step.sum(), ulps=8, scale=8.0)
    assert_close(total, drawn.sum(), ulps=8, scale=8.0)


@pytest.mark.parametrize("reset_pool", [None, 2])
def test_rollouts_with_per_step_draws_run_and_restart_episodes(tiny_config, reset_pool):
    config = tiny_config.replace(reset_pool=reset_pool)
    with kernels.plain():
        out = jax.jit(lambda c, k: ppojax.train(c, k))(config, jax.random.key(1))
    finished = np.asarray(out.metrics["episodes_finished"])
    assert finished.sum() >= 3  # 192 steps of a random CartPole policy: episodes of ~20 steps
    returns = np.asarray(out.metrics["episode_return"])[finished > 0]
    assert np.isfinite(returns).all() and (returns >= 1).all()
