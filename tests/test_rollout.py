import jax
import numpy as np
import pytest
from tolerance import assert_close

import ppojax
from ppojax.networks import initial_hidden
from ppojax.ppo.rollout import (
    act,
    collect_rollout,
    episode_metrics,
    network_input,
    reset_envs,
    rollout_start,
)
from ppojax.ppo.train import init_state, make_agent


@pytest.fixture(scope="module")
def rollout():
    config = ppojax.PPOConfig(num_envs=3, num_steps=64, total_timesteps=3 * 64)
    agent = make_agent(config)
    state = init_state(config, jax.random.key(0))
    run = jax.jit(lambda params, carry: collect_rollout(agent, config, params, carry))
    start = rollout_start(state)
    carry, transitions = run(state.params, start)
    return config, state, carry, jax.tree.map(np.asarray, transitions)


def test_rollout_is_time_major_with_the_right_shapes(rollout):
    config, _, carry, transitions = rollout
    steps, envs = config.num_steps, config.num_envs
    assert transitions.obs.shape == (steps, envs, 4)
    assert transitions.next_obs.shape == (steps, envs, 4)
    for name in ("action", "log_prob", "value", "reward", "terminated", "truncated"):
        assert getattr(transitions, name).shape == (steps, envs), name
    assert carry.obs.shape == (envs, 4)


def test_auto_reset_boundaries(rollout):
    _, state, carry, transitions = rollout
    np.testing.assert_array_equal(transitions.obs[0], np.asarray(state.obs))
    following = np.concatenate([transitions.obs[1:], np.asarray(carry.obs)[None]])
    done = transitions.terminated | transitions.truncated
    assert done.sum() >= 3  # a fresh CartPole policy drops the pole within 64 steps
    # Within an episode the next observation is the next step's observation ...
    np.testing.assert_array_equal(transitions.next_obs[~done], following[~done])
    # ... and at an episode end the next step starts from a reset: small, new observation.
    assert not np.isclose(transitions.next_obs[done], following[done]).all(axis=-1).any()
    assert (np.abs(following[done]) <= 0.05).all()


def test_episode_stats_match_the_steps_since_the_last_reset(rollout):
    _, _, _, transitions = rollout
    done = transitions.terminated | transitions.truncated
    for env in range(done.shape[1]):
        ends = np.flatnonzero(done[:, env])
        starts = np.concatenate([[-1], ends[:-1]])
        # the first episode may have started before the rollout: only check later ones
        for start, end in list(zip(starts, ends, strict=True))[1:]:
            assert transitions.episode_length[end, env] == end - start
            np.testing.assert_allclose(
                transitions.episode_return[end, env],
                transitions.reward[start + 1 : end + 1, env].sum(),
            )


def test_episode_metrics_are_nan_when_no_episode_ended(rollout):
    _, _, _, transitions = rollout
    no_end = transitions._replace(
        terminated=np.zeros_like(transitions.terminated),
        truncated=np.zeros_like(transitions.truncated),
    )
    metrics = episode_metrics(no_end)
    assert np.isnan(metrics["episode_return"]) and np.isnan(metrics["episode_length"])
    assert metrics["episodes_finished"] == 0
    done = transitions.terminated | transitions.truncated
    full = episode_metrics(transitions)
    np.testing.assert_allclose(full["episode_return"], transitions.episode_return[done].mean())


def test_reset_envs_gives_distinct_starts():
    config = ppojax.PPOConfig(num_envs=8)
    obs, _ = reset_envs(make_agent(config), jax.random.key(0), 8)
    assert obs.shape == (8, 4) and len(np.unique(np.asarray(obs)[:, 0])) == 8


def _rollout(config, key=0):
    agent = make_agent(config)
    state = init_state(config, jax.random.key(key))
    start = rollout_start(state)
    run = jax.jit(lambda params, carry: collect_rollout(agent, config, params, carry))
    carry, transitions = run(state.params, start)
    return carry, jax.tree.map(np.asarray, transitions)


PENDULUM = dict(env_id="Pendulum-v1", num_envs=8, num_steps=200, total_timesteps=1600)


def test_observation_normalization_standardizes_what_the_networks_see():
    config = ppojax.PPOConfig(**PENDULUM)
    _, raw = _rollout(config)
    carry, normalized = _rollout(config.replace(normalize_observations=True))
    assert np.abs(raw.obs[:, :, 2]).max() > 2.0  # raw angular velocity spans several units
    # what the networks saw is standardized by the running statistics
    np.testing.assert_allclose(normalized.obs[-50:].reshape(-1, 3).mean(0), 0.0, atol=0.6)
    assert 0.4 < normalized.obs.reshape(-1, 3).std(0).min() < 2.0
    assert float(carry.obs_stats.count) == 8 * 200


def test_observation_clip_bounds_the_normalized_observation():
    config = ppojax.PPOConfig(**PENDULUM, normalize_observations=True, obs_clip=0.5)
    _, transitions = _rollout(config)
    assert np.abs(transitions.obs).max() <= 0.5
    assert np.abs(transitions.next_obs).max() <= 0.5


def test_reward_normalization_rescales_the_loss_reward_but_not_the_episode_stats():
    config = ppojax.PPOConfig(**PENDULUM)
    _, raw = _rollout(config)
    carry, scaled = _rollout(config.replace(normalize_rewards=True))
    ratio = raw.reward / scaled.reward
    # one positive scale per step, shared by all envs: sqrt of the running variance of G
    np.testing.assert_allclose(ratio, ratio[:, :1] * np.ones_like(ratio), rtol=1e-4)
    assert (ratio > 0).all() and ratio[-1, 0] > 5.0  # Pendulum returns span tens of units
    np.testing.assert_allclose(
        ratio[-1, 0], np.sqrt(float(carry.reward_normalizer.return_stats.var) + 1e-8), rtol=1e-4
    )
    # Two programs (the reward normalizer adds ops that XLA may fuse with the env step): the
    # episode returns are sums of up to 200 Pendulum rewards in [-16.3, 0], so float32
    # rounding of terms of order 10.
    assert_close(raw.episode_return, scaled.episode_return, ulps=256, scale=10.0)


def test_reward_clip_bounds_the_reward():
    config = ppojax.PPOConfig(**PENDULUM, reward_clip=1.0)
    _, transitions = _rollout(config)
    assert transitions.reward.min() == -1.0 and transitions.reward.max() <= 1.0
    assert transitions.episode_return.min() < -100.0  # the episode statistics stay raw


def test_values_and_log_probs_are_the_networks_at_each_step(rollout):
    # A feed-forward rollout computes V(obs) and log pi(a | obs) after the scan, batched over
    # all steps; they must be what the network gives on each step's observations.
    config, state, _, transitions = rollout
    agent = make_agent(config)
    steps, envs = transitions.reward.shape
    obs = transitions.obs.reshape(steps * envs, -1)
    head, _, value, _ = agent.network.apply(state.params, obs, None)
    head, value = np.asarray(head).reshape(steps, envs, -1), np.asarray(value).reshape(steps, envs)
    log_prob = jax.nn.log_softmax(head)
    taken = np.take_along_axis(np.asarray(log_prob), transitions.action[..., None], -1)[..., 0]
    # Two programs (the rollout's, and this eager call): dense layers of 64 units
    # with weights of order 1/8 and values of order 1, so ulps of 1.
    assert_close(transitions.value, value, ulps=64)
    assert_close(transitions.log_prob, taken, ulps=64)
    np.testing.assert_allclose(transitions.policy_head, head, atol=64 * 1.2e-7)


def test_reset_pool_gives_each_env_its_own_starts_in_order_then_repeats_the_last():
    """Two-step episodes end 4 times per env in 8 steps; with 2 starts per env per rollout the
    first two restarts are fresh and distinct, the last two repeat the second start."""
    base = ppojax.PPOConfig(
        num_envs=3, num_steps=8, total_timesteps=24, env_kwargs={"max_steps_in_episode": 2}
    )
    fresh_carry, fresh = _rollout(base)
    carry, pooled = _rollout(base.replace(reset_pool=2))
    for transitions in (fresh, pooled):
        ends = transitions.terminated | transitions.truncated
        np.testing.assert_array_equal(np.flatnonzero(ends.any(axis=1)), [1, 3, 5, 7])
        assert ends[1::2].all()
    # without the pool every restart is a fresh draw
    starts = np.stack([fresh.obs[2], fresh.obs[4], fresh.obs[6], np.asarray(fresh_carry.obs)])
    assert len(np.unique(starts.reshape(-1, 4), axis=0)) == 12
    assert int(fresh_carry.repeated_starts) == 0
    first, second = pooled.obs[2], pooled.obs[4]
    assert len(np.unique(np.concatenate([first, second]), axis=0)) == 6  # per env, distinct
    np.testing.assert_array_equal(pooled.obs[6], second)
    np.testing.assert_array_equal(np.asarray(carry.obs), second)
    assert int(carry.repeated_starts) == 2 * 3
    # each step's final observation is still the true one, not the start
    np.testing.assert_array_equal(pooled.next_obs[0], pooled.obs[1])


def test_reset_pool_rejects_what_is_not_a_count_of_starts():
    for bad in (0, 9, 1.5, True):
        with pytest.raises(
            ppojax.ConfigError, match="reset_pool must be None .* from 1 to num_steps=8"
        ):
            ppojax.PPOConfig(num_envs=3, num_steps=8, total_timesteps=24, reset_pool=bad)


def test_rollouts_chain_in_a_scan_from_rollout_start():
    # the carry rollout_start builds has the structure collect_rollout returns, so a scan
    # over rollouts (as the benchmarks' rollout-only limits run) traces
    config = ppojax.PPOConfig(num_envs=2, num_steps=8, total_timesteps=16)
    agent = make_agent(config)
    state = init_state(config, jax.random.key(0))

    def rollouts(params, carry):
        def body(carry, _):
            carry, transitions = collect_rollout(agent, config, params, carry)
            return carry, transitions.reward.sum()

        return jax.lax.scan(body, carry, None, 3)

    carry, rewards = jax.jit(rollouts)(state.params, rollout_start(state))
    assert rewards.shape == (3,) and int(carry.repeated_starts) == 0
    np.testing.assert_array_equal(rewards, 16.0)  # CartPole's reward is 1 on every step


@pytest.mark.parametrize("recurrent", [None, "gru"])
def test_act_is_one_call_for_feed_forward_and_recurrent_policies(recurrent):
    # A feed-forward policy's hidden state is None and stays None; a recurrent one's comes
    # back as the core's new state. The mode is the argmax of the network's logits.
    config = ppojax.PPOConfig(
        num_envs=4, num_steps=4, total_timesteps=16, recurrent=recurrent, recurrent_size=8
    )
    agent = make_agent(config)
    state = init_state(config, jax.random.key(0))
    obs = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(3, 4)
    hidden = initial_hidden(agent.network, 3)
    policy = (agent, config, state.params, state.obs_stats, obs, hidden)
    mode, new_hidden = act(*policy, None, deterministic=True)
    head, _, _, expected_hidden = agent.network.apply(
        state.params, network_input(config, state.obs_stats, obs), hidden
    )
    np.testing.assert_array_equal(mode, np.argmax(head, axis=-1))
    if recurrent is None:
        assert hidden is None and new_hidden is None
    else:
        np.testing.assert_array_equal(new_hidden, expected_hidden)
    sampled, _ = act(*policy, jax.random.key(1))
    again, _ = act(*policy, jax.random.key(1))
    assert sampled.shape == (3,)
    np.testing.assert_array_equal(sampled, again)


def pendulum_rollout_noise(correlation: float, reset_pool: int | None = None) -> np.ndarray:
    """The standard normal noise behind one Pendulum rollout's actions, [T, B]: (action -
    mean) / std from the recorded policy outputs."""
    config = ppojax.PPOConfig(
        env_id="Pendulum-v1",
        num_envs=64,
        num_steps=128,
        total_timesteps=64 * 128,
        action_noise_correlation=correlation,
        reset_pool=reset_pool,
    )
    agent = make_agent(config)
    state = init_state(config, jax.random.key(0))
    run = jax.jit(lambda params, carry: collect_rollout(agent, config, params, carry))
    carry, transitions = run(state.params, rollout_start(state))
    assert carry.action_noise is None  # the next rollout draws its own first noise
    noise = (transitions.action - transitions.policy_head) / np.exp(transitions.policy_log_std)
    return np.asarray(noise)[..., 0]


@pytest.mark.parametrize("correlation", [0.0, 0.5, 0.9])
def test_action_noise_correlation_makes_the_noise_an_ar1_process_of_standard_normals(
    correlation,
):
    noise = pendulum_rollout_noise(correlation)
    # 8192 draws: the mean's and the std's standard errors are ~0.011 and ~0.008, but
    # correlated draws count for fewer (up to 1 / (1 - rho) = 10 times fewer at rho 0.9)
    assert abs(noise.mean()) < 0.15 and abs(noise.std() - 1.0) < 0.1
    for lag in (1, 4):
        observed = np.corrcoef(noise[:-lag].ravel(), noise[lag:].ravel())[0, 1]
        assert abs(observed - correlation**lag) < 0.05, (lag, observed)
    # the first step is already N(0, 1) (a fresh draw, not white noise scaled down)
    assert abs(noise[0].std() - 1.0) < 0.25


def test_action_noise_correlation_holds_across_blocks_of_pooled_starts():
    noise = pendulum_rollout_noise(0.9, reset_pool=2)
    observed = np.corrcoef(noise[:-1].ravel(), noise[1:].ravel())[0, 1]
    assert abs(observed - 0.9) < 0.05


def test_action_noise_correlation_is_for_continuous_actions_only():
    config = ppojax.PPOConfig(num_envs=2, num_steps=8, total_timesteps=16)
    config = config.replace(action_noise_correlation=0.5)
    agent = make_agent(config)
    state = init_state(config, jax.random.key(0))
    with pytest.raises(ppojax.ConfigError, match="needs continuous actions"):
        collect_rollout(agent, config, state.params, rollout_start(state))
