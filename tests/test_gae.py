import jax
import numpy as np
import pytest

import ppojax
from ppojax.engine import gae
from ppojax.runtime import kernels


def gae_reference(rewards, values, next_values, terminated, truncated, gamma, gae_lambda):
    """Plain reverse loop over time, written straight from the definition."""
    steps, envs = rewards.shape
    advantages = np.zeros((steps, envs))
    running = np.zeros(envs)
    for t in reversed(range(steps)):
        done = np.logical_or(terminated[t], truncated[t])
        delta = rewards[t] + gamma * (1 - terminated[t]) * next_values[t] - values[t]
        running = delta + gamma * gae_lambda * (1 - done) * running
        advantages[t] = running
    return advantages, advantages + values


@pytest.mark.parametrize("gamma,gae_lambda", [(0.99, 0.95), (0.9, 0.0), (1.0, 1.0), (0.5, 0.7)])
def test_gae_matches_numpy_loop_with_terminations_and_truncations(gamma, gae_lambda):
    rng = np.random.default_rng(0)
    shape = (37, 6)
    rewards = rng.normal(size=shape).astype(np.float32)
    values = rng.normal(size=shape).astype(np.float32)
    next_values = rng.normal(size=shape).astype(np.float32)
    terminated = rng.random(shape) < 0.1
    truncated = (rng.random(shape) < 0.1) & ~terminated
    assert terminated.any() and truncated.any()
    advantages, returns = ppojax.compute_gae(
        rewards, values, next_values, terminated, truncated, gamma=gamma, gae_lambda=gae_lambda
    )
    expected_adv, expected_ret = gae_reference(
        rewards, values, next_values, terminated, truncated, gamma, gae_lambda
    )
    np.testing.assert_allclose(advantages, expected_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(returns, expected_ret, rtol=1e-5, atol=1e-5)


def _column(*values):
    return np.array(values, np.float32)[:, None]


REWARDS = _column(1.0, 2.0, 3.0)
VALUES = _column(0.5, 0.5, 0.5)
NEXT_VALUES = _column(0.5, 0.7, 4.0)
NONE = _column(0, 0, 0).astype(bool)
AT_1 = _column(0, 1, 0).astype(bool)


def test_lambda_zero_gives_td_errors():
    # delta = r + 0.9 * V(next) - V
    advantages, returns = ppojax.compute_gae(
        REWARDS, VALUES, NEXT_VALUES, NONE, NONE, gamma=0.9, gae_lambda=0.0
    )
    np.testing.assert_allclose(advantages[:, 0], [0.95, 2.13, 6.1], rtol=1e-6)
    np.testing.assert_allclose(returns[:, 0], [1.45, 2.63, 6.6], rtol=1e-6)


def test_gamma_lambda_one_sums_rewards_to_the_bootstrap():
    # deltas [1.0, 2.2, 6.5]: A_t is the sum of the deltas from t on.
    advantages, returns = ppojax.compute_gae(
        REWARDS, VALUES, NEXT_VALUES, NONE, NONE, gamma=1.0, gae_lambda=1.0
    )
    np.testing.assert_allclose(advantages[:, 0], [9.7, 8.7, 6.5], rtol=1e-6)
    np.testing.assert_allclose(returns[:, 0], [10.2, 9.2, 7.0], rtol=1e-6)


def test_termination_cuts_the_bootstrap_and_the_trace():
    # t=1 terminated: delta_1 = 2 - 0.5 = 1.5 and A_1 does not see A_2.
    advantages, _ = ppojax.compute_gae(
        REWARDS, VALUES, NEXT_VALUES, AT_1, NONE, gamma=1.0, gae_lambda=1.0
    )
    np.testing.assert_allclose(advantages[:, 0], [2.5, 1.5, 6.5], rtol=1e-6)


def test_truncation_bootstraps_from_the_final_observation_but_cuts_the_trace():
    # t=1 truncated: delta_1 = 2 + V(final obs)=0.7 - 0.5 = 2.2, and A_1 does not see A_2.
    advantages, _ = ppojax.compute_gae(
        REWARDS, VALUES, NEXT_VALUES, NONE, AT_1, gamma=1.0, gae_lambda=1.0
    )
    np.testing.assert_allclose(advantages[:, 0], [3.2, 2.2, 6.5], rtol=1e-6)


def test_associative_form_computes_the_reverse_scan_recurrence():
    """The CUDA default "associative_gae" against the reference reverse scan and a float64
    loop, at the rollout's T = 128 with terminations and truncations. A_t is the sum over k of
    (decays_t ... decays_{t+k-1}) * deltas_{t+k}: each form rounds every term at most ~2T
    times (the chain) or ~4 log2 T times (the tree), so both lie within 2T ulps of
    S_t = sum_k |product| * |deltas_{t+k}| of the exact sum; a wrong composition order would
    be off by terms of size S_t."""
    rng = np.random.default_rng(1)
    steps, envs = 128, 32
    deltas = (rng.normal(size=(steps, envs)) * 10.0).astype(np.float32)
    done = rng.random((steps, envs)) < 0.05  # terminated or truncated: both cut the trace
    decays = np.where(done, 0.0, 0.99 * 0.95).astype(np.float32)
    assert done.any(axis=0).all() and (~done).sum() > steps * envs * 0.9
    exact, scale = np.zeros((steps, envs)), np.zeros((steps, envs))
    running, running_scale = np.zeros(envs), np.zeros(envs)
    for t in reversed(range(steps)):
        running = deltas[t] + decays[t].astype(np.float64) * running
        running_scale = np.abs(deltas[t]) + decays[t].astype(np.float64) * running_scale
        exact[t], scale[t] = running, running_scale
    plain = np.asarray(gae.reverse_scan(deltas, decays))
    associative = np.asarray(gae.associative_reverse_scan(deltas, decays))
    tolerance = 2 * steps * np.finfo(np.float32).eps * scale
    assert (np.abs(plain - exact) <= tolerance).all()
    assert (np.abs(associative - exact) <= tolerance).all()
    # and it is what compute_gae runs where chosen (on CUDA by default)
    rewards, values = deltas, np.zeros_like(deltas)
    with kernels.use("associative_gae"):
        advantages, _ = ppojax.compute_gae(
            rewards, values, values, done, np.zeros_like(done), gamma=0.99, gae_lambda=0.95
        )
    np.testing.assert_array_equal(advantages, associative)


def test_monte_carlo_returns_bootstrap_only_where_an_episode_leaves_the_rollout():
    # gamma 0.9, G_t = r_t + 0.9 G_{t+1}, and G_2 = 3 + 0.9 V(final obs) = 6.6 at the rollout's
    # end; next_values 0.5 and 0.7 mid-episode are not read (GAE with lambda 1 would).
    advantages, returns = gae.monte_carlo_advantages(
        REWARDS, VALUES, NEXT_VALUES, NONE, NONE, gamma=0.9, gae_lambda=0.3
    )
    np.testing.assert_allclose(returns[:, 0], [8.146, 7.94, 6.6], rtol=1e-6)
    np.testing.assert_allclose(advantages[:, 0], [7.646, 7.44, 6.1], rtol=1e-6)
    # truncated at t=1: G_1 = 2 + 0.9 V(final obs) = 2.63, G_0 = 1 + 0.9 * 2.63
    _, returns = gae.monte_carlo_advantages(
        REWARDS, VALUES, NEXT_VALUES, NONE, AT_1, gamma=0.9, gae_lambda=0.3
    )
    np.testing.assert_allclose(returns[:, 0], [3.367, 2.63, 6.6], rtol=1e-6)
    # terminated at t=1: G_1 = 2, no bootstrap
    _, returns = gae.monte_carlo_advantages(
        REWARDS, VALUES, NEXT_VALUES, AT_1, NONE, gamma=0.9, gae_lambda=0.3
    )
    np.testing.assert_allclose(returns[:, 0], [2.8, 2.0, 6.6], rtol=1e-6)


def test_make_batch_takes_the_configs_estimator_and_gae_by_default(tiny_config):
    from ppojax.ppo.rollout import collect_rollout, rollout_start
    from ppojax.ppo.train import init_state, make_agent, make_batch, next_values

    assert tiny_config.advantage_estimator == "gae"
    assert gae.ADVANTAGE_ESTIMATORS["gae"] is gae.compute_gae
    agent = make_agent(tiny_config)
    state = init_state(tiny_config, jax.random.key(0))
    _, transitions = collect_rollout(agent, tiny_config, state.params, rollout_start(state))
    assert transitions.terminated.any()
    inputs = (
        transitions.reward,
        transitions.value,
        next_values(agent, state.params, transitions),
        transitions.terminated,
        transitions.truncated,
    )
    batches = {}
    for name, estimator in [("gae", gae.compute_gae), ("monte_carlo", gae.monte_carlo_advantages)]:
        config = tiny_config if name == "gae" else tiny_config.replace(advantage_estimator=name)
        batches[name] = make_batch(agent, config, state.params, transitions)
        advantages, targets = estimator(*inputs, gamma=config.gamma, gae_lambda=config.gae_lambda)
        np.testing.assert_array_equal(batches[name].advantage, advantages.reshape(-1))
        np.testing.assert_array_equal(batches[name].target, targets.reshape(-1))
    assert not np.allclose(batches["gae"].advantage, batches["monte_carlo"].advantage)
