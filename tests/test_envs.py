import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppojax.envs import PPOEnv, list_envs, make_env


def run_env(env, actions, key):
    obs, state = env.reset(key)

    def step(carry, action_and_key):
        state, _ = carry
        action, key = action_and_key
        result, state = env.step(key, state, action)
        return (state, result.obs), result

    keys = jax.random.split(jax.random.key(1), actions.shape[0])
    _, results = jax.lax.scan(step, (state, obs), (actions, keys))
    return obs, results


def test_truncation_is_kept_apart_from_termination_and_gives_the_final_observation():
    base, params = gymnax.make("CartPole-v1")
    env = PPOEnv(base, params.replace(max_steps_in_episode=5))
    actions = jnp.array([0, 1] * 6)  # alternating keeps the pole up for 5 steps
    first_obs, results = run_env(env, actions, jax.random.key(0))
    truncated = np.asarray(results.truncated)
    assert truncated[4] and truncated[9] and truncated.sum() == 2
    assert not np.asarray(results.terminated).any()
    # Without an episode end the next observation is the one returned; at the end it is not.
    np.testing.assert_array_equal(results.next_obs[:4], results.obs[:4])
    assert not np.allclose(results.next_obs[4], results.obs[4])
    np.testing.assert_allclose(results.episode_return[4], 5.0)
    np.testing.assert_array_equal(np.asarray(results.episode_length)[[4, 9]], [5, 5])
    assert np.asarray(results.episode_return)[[0, 1, 2, 3, 5]].sum() == 0


def test_termination_records_episode_statistics():
    env = make_env("CartPole-v1")
    actions = jnp.zeros(40, jnp.int32)  # always push left: the pole falls within 40 steps
    _, results = run_env(env, actions, jax.random.key(0))
    ended = np.flatnonzero(np.asarray(results.terminated))
    assert ended.size >= 1
    first = ended[0]
    assert results.episode_length[first] == first + 1
    np.testing.assert_allclose(results.episode_return[first], first + 1)  # reward 1 per step


def test_continuous_actions_are_clipped_at_the_env():
    env = make_env("Pendulum-v1")
    assert not env.spec.discrete and env.spec.action_high == (2.0,)
    obs, state = env.reset(jax.random.key(0))
    key = jax.random.key(1)
    huge, _ = env.step(key, state, jnp.array([100.0]))
    bound, _ = env.step(key, state, jnp.array([2.0]))
    np.testing.assert_allclose(huge.reward, bound.reward)
    np.testing.assert_allclose(huge.obs, bound.obs)


def test_spec_of_discrete_env():
    spec = make_env("CartPole-v1").spec
    assert spec.discrete and spec.action_dim == 2 and spec.obs_dim == 4


def test_image_observations_are_flattened():
    env = make_env("Breakout-MinAtar")
    obs, _ = env.reset(jax.random.key(0))
    assert obs.shape == (env.spec.obs_dim,) and env.spec.obs_dim == 10 * 10 * 4


def test_unknown_env_id_lists_close_matches():
    with pytest.raises(ValueError, match="CartPole-v1"):
        make_env("CartPole-v2")
    assert "CartPole-v1" in list_envs()
