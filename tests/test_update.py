import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from tolerance import assert_close

import ppojax
from ppojax.engine.epochs import OptimizerCarry, run_epochs, shuffle_into_minibatches
from ppojax.ppo.types import Batch
from ppojax.ppo.update import learning_rate_at


def test_shuffle_is_a_permutation_split_into_minibatches():
    n = 24
    batch = Batch(*(jnp.arange(n, dtype=jnp.float32) * (i + 1) for i in range(8)))
    minibatches = shuffle_into_minibatches(jax.random.key(0), batch, 4)
    assert minibatches.obs.shape == (4, 6)
    seen = np.sort(np.asarray(minibatches.obs).ravel())
    np.testing.assert_array_equal(seen, np.arange(n))
    assert not np.array_equal(np.asarray(minibatches.obs).ravel(), np.arange(n))
    # every field is permuted the same way, so samples stay whole
    for i, name in enumerate(Batch._fields[:8]):
        np.testing.assert_allclose(getattr(minibatches, name), minibatches.obs * (i + 1))
    other = shuffle_into_minibatches(jax.random.key(1), batch, 4)
    assert not np.array_equal(other.obs, minibatches.obs)


def test_learning_rate_anneals_linearly_per_gradient_step():
    config = ppojax.PPOConfig(learning_rate=1e-3)
    total = config.num_gradient_steps
    np.testing.assert_allclose(learning_rate_at(config, 0), 1e-3)
    np.testing.assert_allclose(
        learning_rate_at(config, total // 2), 1e-3 * (1 - (total // 2) / total)
    )
    np.testing.assert_allclose(learning_rate_at(config, total), 0.0)
    constant = config.replace(anneal_lr=False)
    np.testing.assert_allclose(learning_rate_at(constant, total), 1e-3)


@pytest.mark.parametrize(
    "beta,kl,target,expected",
    [
        (1.0, 0.012, 0.01, 1.0),  # inside [target / 1.5, 1.5 target]: unchanged
        (1.0, 0.0151, 0.01, 2.0),  # above 1.5 target: doubled
        (1.0, 0.1, 0.01, 2.0),
        (0.5, 0.0066, 0.01, 0.25),  # below target / 1.5: halved
        (0.5, 0.0, 0.01, 0.25),
        (3.0, 0.0067, 0.01, 3.0),  # just inside the lower edge
        (1e-8, 0.0, 0.01, 1e-8),  # the floor: beta can always double back
        (1.5e-8, 0.0, 0.01, 1e-8),
        (1e-8, 0.1, 0.01, 2e-8),
        (3.0, 0.0149, 0.01, 3.0),  # just inside the upper edge
    ],
)
def test_adaptive_kl_rule(beta, kl, target, expected):
    np.testing.assert_allclose(ppojax.adaptive_kl_update(beta, kl, target), expected, rtol=1e-6)


EARLY_STOP_CONFIG = ppojax.PPOConfig(
    num_envs=4,
    num_steps=32,
    total_timesteps=128,
    update_epochs=4,
    num_minibatches=4,
    learning_rate=1e-2,
)


def _one_update(config, key=0):
    state = ppojax.init_state(config, jax.random.key(key))
    _, metrics = jax.jit(ppojax.run_updates, static_argnums=2)(config, state, 1)
    return {name: float(value[0]) for name, value in metrics.items()}


def test_early_stop_takes_fewer_steps_for_a_tiny_target_and_all_for_a_huge_one():
    config = EARLY_STOP_CONFIG
    assert _one_update(config)["gradient_steps"] == 16
    assert _one_update(config.replace(target_kl=1e9))["gradient_steps"] == 16
    tiny = _one_update(config.replace(target_kl=1e-7))
    # The first step (ratio 1, KL 0) is always taken; the policy then moves past 1e-7.
    assert 1 <= tiny["gradient_steps"] < 16
    assert tiny["approx_kl"] <= 1e-7


def test_early_stop_keeps_the_parameters_after_the_stop():
    config = EARLY_STOP_CONFIG
    chunk = jax.jit(ppojax.run_updates, static_argnums=2)
    state = ppojax.init_state(config, jax.random.key(0))
    stopped, metrics = chunk(config.replace(target_kl=1e-7), state, 1)
    steps = int(metrics["gradient_steps"][0])
    assert int(stopped.gradient_steps) == steps
    # Adam's own step count only advances on the steps taken
    counts = [int(leaf) for leaf in jax.tree.leaves(stopped.opt_state) if leaf.ndim == 0]
    assert counts and all(count == steps for count in counts)


def _penalty_case(env_id, objective):
    """A minibatch whose old policy differs from the current one, and the manual loss parts."""
    from ppojax.networks import init_params, observation_template
    from ppojax.ppo.loss import ppo_loss
    from ppojax.ppo.train import make_agent

    config = ppojax.PPOConfig(env_id=env_id, policy_objective=objective, hidden_sizes=(8,))
    agent = make_agent(config)
    spec = agent.env.spec
    params = init_params(jax.random.key(0), agent.network, observation_template(agent.env))
    rng = np.random.default_rng(0)
    n = 6
    obs = jnp.asarray(rng.normal(size=(n, spec.obs_dim)), jnp.float32)
    head, log_std, _, _ = agent.network.apply(params, obs, None)
    old_head = head + jnp.asarray(rng.normal(0, 0.3, head.shape), jnp.float32)
    old_log_std = None if spec.discrete else jnp.full(head.shape, 0.2)
    if spec.discrete:
        action = jnp.asarray(rng.integers(0, spec.action_dim, n))
        new_logp = jax.nn.log_softmax(head)
        old_logp = jax.nn.log_softmax(old_head)
        kl = np.sum(np.exp(old_logp) * (old_logp - new_logp), axis=-1)
        old_log_prob = old_logp[jnp.arange(n), action]
        log_ratio = new_logp[jnp.arange(n), action] - old_log_prob
    else:
        action = jnp.asarray(rng.normal(size=(n, spec.action_dim)), jnp.float32)
        new_std, old_std = np.exp(np.asarray(log_std)), np.exp(0.2)
        mean_gap = np.asarray(old_head - head)
        kl = np.sum(
            np.log(new_std / old_std) + (old_std**2 + mean_gap**2) / (2 * new_std**2) - 0.5,
            axis=-1,
        )

        def gaussian_logp(x, mean, std):
            return np.sum(
                -0.5 * ((x - mean) / std) ** 2 - np.log(std) - 0.5 * np.log(2 * np.pi), -1
            )

        old_log_prob = jnp.asarray(gaussian_logp(action, old_head, old_std), jnp.float32)
        log_ratio = gaussian_logp(action, head, new_std) - old_log_prob
    advantages = jnp.asarray(rng.normal(size=n), jnp.float32)
    batch = Batch(
        obs=obs,
        action=action,
        log_prob=old_log_prob,
        value=jnp.zeros(n),
        policy_head=old_head,
        policy_log_std=old_log_std,
        advantage=advantages,
        target=jnp.zeros(n),
    )
    _, parts = ppo_loss(agent, config, jnp.float32(0.7), params, batch)
    a = np.asarray(advantages)
    a = (a - a.mean()) / (a.std() + 1e-8)
    return parts, np.asarray(kl), np.asarray(log_ratio), a


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_penalty_loss_is_the_formula_with_the_analytic_kl(env_id):
    parts, kl, log_ratio, advantages = _penalty_case(env_id, "penalty")
    np.testing.assert_allclose(parts["penalty_kl"], kl.mean(), rtol=1e-4)
    expected = -(np.exp(log_ratio) * advantages).mean() + 0.7 * kl.mean()
    # float32 against float64: the loss is a mean of terms of order 1 (normalized advantages
    # times ratios near 1) and may lie near zero, so ulps of 1.
    assert_close(parts["policy_loss"], expected, ulps=64)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_clip_penalty_adds_the_kl_term_to_the_clipped_surrogate(env_id):
    parts, kl, log_ratio, advantages = _penalty_case(env_id, "clip_penalty")
    ratio = np.exp(log_ratio)
    clipped = -np.minimum(ratio * advantages, np.clip(ratio, 0.8, 1.2) * advantages).mean()
    # As above: means of terms of order 1 in float32 against float64, so ulps of 1.
    assert_close(parts["policy_loss"], clipped + 0.7 * kl.mean(), ulps=64)
    plain, *_ = _penalty_case(env_id, "clip")
    assert_close(plain["policy_loss"], clipped, ulps=64)


def _guarded_epoch(loss_fn, optimizer, x, stop_kl=None, guard=True):
    """One epoch of one-sample minibatches over x [N, 3] from w = 0."""
    params = {"w": jnp.zeros(3)}
    carry = OptimizerCarry(params, optimizer.init(params))
    return run_epochs(
        loss_fn,
        optimizer,
        carry,
        x,
        jax.random.key(3),
        num_epochs=1,
        num_minibatches=x.shape[0],
        stop_kl=stop_kl,
        divergence_guard=guard,
    )


def _manual_epoch(loss_fn, optimizer, x, skip):
    """The same epoch as a Python loop that leaves out sample ``skip``."""
    params = {"w": jnp.zeros(3)}
    state = optimizer.init(params)
    order = jax.random.permutation(jax.random.split(jax.random.key(3), 1)[0], x.shape[0])
    for index in np.asarray(order):
        if index != skip:
            grads, _ = jax.grad(loss_fn, has_aux=True)(params, x[index : index + 1])
            updates, state = optimizer.update(grads, state, params)
            params = optax.apply_updates(params, updates)
    return params


def _nan_loss(params, x):  # NaN loss, finite (zero) gradient where x holds a NaN marker
    loss = jnp.sum(jnp.square(params["w"] - jnp.nan_to_num(x)))
    return loss + jnp.where(jnp.isnan(x).any(), jnp.nan, 0.0), {"approx_kl": jnp.float32(0)}


def _nan_gradient_loss(params, x):  # finite loss, NaN gradient (sqrt at 0) at the marker
    offset = jnp.where(jnp.isnan(x).any(), 0.0, 1.0)  # d sqrt(|u|)/du is infinite at u = 0
    kink = jnp.sqrt(jnp.abs(params["w"] - params["w"] + offset)).sum()
    loss = jnp.sum(jnp.square(params["w"] - jnp.nan_to_num(x))) + kink
    return loss, {"approx_kl": jnp.float32(0)}


def _overflow_loss(params, x):  # bounded loss, finite gradient; the SGD step overflows params
    scale = jnp.where(jnp.isnan(x).any(), 1e10, 1e-30)  # steps of about 1 with lr 1e30
    loss = scale * jnp.sum(jnp.sin(params["w"]) * jnp.nan_to_num(x, nan=1.0))
    return loss, {"approx_kl": jnp.float32(0)}


@pytest.mark.parametrize(
    "loss_fn, optimizer",
    [
        (_nan_loss, optax.adam(0.1)),
        (_nan_gradient_loss, optax.adam(0.1)),
        (_overflow_loss, optax.sgd(1e30)),
    ],
    ids=["nan-loss", "nan-gradients", "inf-parameters"],
)
def test_guard_skips_steps_whose_loss_gradients_or_parameters_are_not_finite(loss_fn, optimizer):
    x = jnp.array([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0], [jnp.nan, 0.0, 0.0], [-2.0, 1.0, 0.0]])
    carry, metrics = _guarded_epoch(loss_fn, optimizer, x)
    assert float(metrics["nonfinite_steps"]) == 1 and float(metrics["gradient_steps"]) == 3
    assert all(np.isfinite(float(value)) for value in metrics.values())
    expected = _manual_epoch(loss_fn, optimizer, x, skip=2)
    # A compiled scan against eager steps: two programs. w is a sum of three steps of order
    # 0.1-1 (Adam at 0.1, SGD steps of about 1) that may cancel near zero, so ulps of 1.
    assert_close(carry.params["w"], expected["w"], ulps=64)
    counts = [int(leaf) for leaf in jax.tree.leaves(carry.opt_state) if leaf.dtype == jnp.int32]
    assert all(count == 3 for count in counts)  # Adam's step count skips the bad step too


def test_without_the_guard_a_nan_step_is_applied_and_counted():
    """The classic program: the NaN gradient at the marker reaches the parameters (and every
    later step's), and ``nonfinite_steps`` still counts the steps that were not finite."""
    x = jnp.array([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0], [jnp.nan, 0.0, 0.0], [-2.0, 1.0, 0.0]])
    carry, metrics = _guarded_epoch(_nan_gradient_loss, optax.adam(0.1), x, guard=False)
    assert np.isnan(np.asarray(carry.params["w"])).all()
    assert float(metrics["gradient_steps"]) == 4 and float(metrics["nonfinite_steps"]) >= 1
    # on finite data the two programs take the same steps: same parameters to float32's
    # rounding of three Adam steps of order 0.1 (ulps of 1, as above)
    healthy = x.at[2].set(jnp.array([0.3, 0.3, 0.3]))
    guarded, _ = _guarded_epoch(_nan_gradient_loss, optax.adam(0.1), healthy)
    plain, plain_metrics = _guarded_epoch(_nan_gradient_loss, optax.adam(0.1), healthy, guard=False)
    assert float(plain_metrics["nonfinite_steps"]) == 0
    assert_close(plain.params["w"], guarded.params["w"], ulps=64)


def test_an_update_whose_every_step_is_skipped_keeps_the_parameters_and_logs_nan():
    x = jnp.full((4, 3), jnp.nan)
    carry, metrics = _guarded_epoch(_nan_loss, optax.adam(0.1), x)
    np.testing.assert_array_equal(carry.params["w"], np.zeros(3))
    assert float(metrics["nonfinite_steps"]) == 4 and float(metrics["gradient_steps"]) == 0
    assert np.isnan(float(metrics["grad_norm"]))  # no step taken: no mean to report


def test_a_skipped_step_does_not_count_as_a_target_kl_stop():
    x = jnp.array([[jnp.nan, 0.0, 0.0], [1.0, 2.0, 3.0], [0.5, -1.0, 2.0], [-2.0, 1.0, 0.0]])
    _, metrics = _guarded_epoch(_nan_loss, optax.adam(0.1), x, stop_kl=1e9)
    assert float(metrics["gradient_steps"]) == 3 and float(metrics["nonfinite_steps"]) == 1


def test_epochs_on_a_tree_of_several_dtypes_match_a_loop_of_optax_steps():
    # run_epochs packs gradients and Adam's moments into one array per dtype; the steps must be
    # optax's on the tree: clipping by the global norm over all leaves, Adam per element.
    params = {
        "a": jnp.array([[0.5, -1.0], [2.0, 0.0]]),
        "b": jnp.array([1.0, 2.0, 3.0]),
        "h": jnp.array([0.25, -0.5], jnp.bfloat16),
    }
    x = jax.random.normal(jax.random.key(0), (8, 3))

    def loss_fn(p, xs):
        h = p["h"].astype(jnp.float32)
        y = jnp.tanh(xs @ p["b"][:, None] * p["a"][0] + h) @ p["a"][1]
        return jnp.mean(jnp.square(y - 1.0)), {"approx_kl": jnp.float32(0)}

    optimizer = optax.chain(optax.clip_by_global_norm(0.1), optax.adam(0.05))
    carry, metrics = run_epochs(
        loss_fn,
        optimizer,
        OptimizerCarry(params, optimizer.init(params)),
        x,
        jax.random.key(3),
        num_epochs=2,
        num_minibatches=4,
        stop_kl=None,
        divergence_guard=True,
    )
    assert float(metrics["gradient_steps"]) == 8
    assert carry.params["h"].dtype == jnp.bfloat16
    expected, state = params, optimizer.init(params)
    for epoch_key in jax.random.split(jax.random.key(3), 2):
        minibatches = shuffle_into_minibatches(epoch_key, x, 4)
        for minibatch in minibatches:
            grads, _ = jax.grad(loss_fn, has_aux=True)(expected, minibatch)
            updates, state = optimizer.update(grads, state, expected)
            expected = optax.apply_updates(expected, updates)
    # Compiled scan against eager steps, with the global norm summed in another order: eight
    # clipped Adam steps of 0.05 on parameters of order 1, so ulps of 1; h, rounded to
    # bfloat16 at every step, may round the other way: one bfloat16 ulp (2**-7 relative).
    assert_close(carry.params["a"], expected["a"], ulps=64)
    assert_close(carry.params["b"], expected["b"], ulps=64)
    np.testing.assert_allclose(np.float32(carry.params["h"]), np.float32(expected["h"]), rtol=2**-7)
    restored = jax.tree.leaves(carry.opt_state)
    assert [leaf.shape for leaf in restored] == [leaf.shape for leaf in jax.tree.leaves(state)]


@pytest.mark.parametrize("flat", [False, True])
def test_clipped_adam_clips_to_the_global_norm_then_takes_an_adam_step(flat):
    """Hand values: grads (3, 4) have norm 5, clipped to norm 1 they are (0.6, 0.8); Adam's
    first step is -lr * m_hat / (sqrt(v_hat) + eps) = -lr * g / (|g| + eps) per element."""
    from ppojax.engine.optim import clipped_adam

    params = {"a": jnp.zeros(1), "b": jnp.zeros(1)}
    grads = {"a": jnp.array([3.0]), "b": jnp.array([-4.0])}
    eps, lr = 1e-3, 0.1
    optimizer = clipped_adam(lr, 1.0, eps=eps, flat=flat)
    updates, _ = optimizer.update(grads, optimizer.init(params), params)
    # Adam's bias correction divides by 1 - 0.999 computed in float32: 0.999's rounding error
    # (~6e-8) is ~6e-5 of that difference, so the update agrees to ~1e-4, not to float32's 1e-7
    np.testing.assert_allclose(updates["a"], [-lr * 0.6 / (0.6 + eps)], rtol=1e-4)
    np.testing.assert_allclose(updates["b"], [lr * 0.8 / (0.8 + eps)], rtol=1e-4)
    wrong = {"a": jnp.array([-lr]), "b": jnp.array([lr])}  # unclipped: -lr * sign(g)
    assert not np.allclose(updates["a"], wrong["a"], rtol=1e-4, atol=0)
