import json

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnax.environments import spaces

import ppojax
from ppojax.envs import MultiDiscrete, PPOEnv, list_envs, make_env
from ppojax.ppo.train import make_agent
from ppojax.runs import folder as ppojax_io


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
    # the same eager ops on the same clipped action: equal to the last bit
    np.testing.assert_allclose(huge.reward, bound.reward)
    np.testing.assert_allclose(huge.obs, bound.obs)


def test_spec_of_discrete_env():
    spec = make_env("CartPole-v1").spec
    assert spec.discrete and spec.action_dim == 2 and spec.obs_dim == 4


def test_image_observations_keep_their_shape_as_float32():
    env = make_env("Breakout-MinAtar")
    obs, state = env.reset(jax.random.key(0))
    assert obs.shape == (10, 10, 4) and obs.dtype == np.float32
    assert env.spec.obs_dim == 10 * 10 * 4  # the flattened size, for the MLP
    raw = env.env.get_obs(state.env_state, env.env_params)
    np.testing.assert_array_equal(obs, np.asarray(raw, np.float32))
    result, _ = env.step(jax.random.key(1), state, jnp.int32(0))
    assert result.obs.shape == result.next_obs.shape == (10, 10, 4)


def test_unknown_env_id_lists_close_matches():
    with pytest.raises(ValueError, match="CartPole-v1"):
        make_env("CartPole-v2")
    assert "CartPole-v1" in list_envs()


class OtherSpaces:
    """Pendulum's dynamics behind other spaces (every registered gymnax env has a Discrete or
    Box action space, so an unsupported one is made here)."""

    def __init__(self, action_space, observation_space=None):
        self.base, self.params = gymnax.make("Pendulum-v1")
        self.spaces = action_space, observation_space

    def action_space(self, params):
        return self.spaces[0]

    def observation_space(self, params):
        return self.spaces[1] or self.base.observation_space(params)


@pytest.mark.parametrize(
    "action_space, observation_space, message",
    [
        (spaces.Tuple([spaces.Discrete(2)] * 2), None, "Tuple.*is not supported"),
        (spaces.Dict({"a": spaces.Discrete(2)}), None, "Dict.*is not supported"),
        (spaces.Box(0, 5, (2,), jnp.int32), None, "needs a Box of float actions"),
        (spaces.Box(0.0, 1.0, (0,)), None, "needs a Box of float actions"),
        (spaces.Box(1.0, -1.0, (2,)), None, "low > high"),
        (spaces.Box(jnp.nan, 1.0, (2,)), None, "NaN bounds"),
        (spaces.Discrete(0), None, "has no actions"),
        (spaces.Discrete(2), spaces.Tuple([spaces.Discrete(2)]), "observation space Tuple"),
    ],
)
def test_spaces_the_policy_cannot_handle_are_clear_errors(action_space, observation_space, message):
    with pytest.raises(ValueError, match=f"MyEnv: .*{message}"):
        env = OtherSpaces(action_space, observation_space)
        PPOEnv(env, env.params, name="MyEnv")


def test_unbounded_and_matrix_shaped_boxes_are_supported():
    base = OtherSpaces(spaces.Box(-jnp.inf, jnp.inf, (2, 3)))
    env = PPOEnv(base, base.params)
    assert env.spec.action_dim == 6 and not env.spec.discrete
    assert env.spec.action_low == (-np.inf,) * 6
    clipped = env._env_action(jnp.arange(6.0) * 1e30)
    assert clipped.shape == (2, 3) and np.isfinite(np.asarray(clipped)).all()


def test_an_env_that_cannot_be_built_names_its_id(monkeypatch):
    def offline(env_id, **kwargs):
        raise OSError("<urlopen error [Errno -2] Name or service not known>")

    monkeypatch.setattr(gymnax, "make", offline)
    with pytest.raises(ValueError, match="gymnax could not build 'MNISTBandit-bsuite': <urlopen"):
        make_env("MNISTBandit-bsuite")


def test_dict_observations_count_every_leaf():
    obs_space = spaces.Dict({"grid": spaces.Box(0, 1, (3, 4, 2)), "step": spaces.Discrete(5)})
    base = OtherSpaces(spaces.Discrete(2), obs_space)
    assert PPOEnv(base, base.params).spec.obs_dim == 3 * 4 * 2 + 1


def test_multidiscrete_actions_are_one_categorical_per_choice():
    base = OtherSpaces(MultiDiscrete([3, 2, 4]))
    spec = PPOEnv(base, base.params).spec
    assert spec.discrete and spec.action_nvec == (3, 2, 4) and spec.action_dim == 9
    with pytest.raises(ValueError, match="empty choice"):
        PPOEnv(OtherSpaces(MultiDiscrete([3, 0])), base.params)


def scripted_episode_ends(env, steps):
    """Terminated and truncated flags and episode lengths [steps] under a constant action."""
    _, results = run_env(env, jnp.ones(steps, jnp.int32), jax.random.key(0))
    return (
        np.asarray(results.terminated),
        np.asarray(results.truncated),
        np.asarray(results.episode_length),
    )


def test_env_kwargs_override_the_env_params_an_episode_length_of_50_truncates_at_50():
    # MountainCar with no push never reaches the goal: only the time limit ends episodes.
    terminated, truncated, lengths = scripted_episode_ends(
        make_env("MountainCar-v0", max_steps_in_episode=50), 120
    )
    assert not terminated.any()
    np.testing.assert_array_equal(np.flatnonzero(truncated), [49, 99])
    np.testing.assert_array_equal(lengths[[49, 99]], [50, 50])
    # gymnax's default time limit (200) does not end an episode in those steps.
    assert not scripted_episode_ends(make_env("MountainCar-v0"), 120)[1].any()


def test_env_kwargs_reach_a_training_config_and_survive_json():
    config = ppojax.PPOConfig(env_id="MountainCar-v0", env_kwargs={"max_steps_in_episode": 50})
    assert make_agent(config).env.env_params.max_steps_in_episode == 50
    again = ppojax_io.config_from_dict(json.loads(json.dumps(ppojax_io.config_to_dict(config))))
    assert again == config and hash(again.env_kwargs) == hash(config.env_kwargs)
    with pytest.raises(TypeError, match="read-only"):
        config.env_kwargs["max_steps_in_episode"] = 3


def test_env_kwargs_other_than_params_go_to_the_env_constructor():
    assert make_env("Breakout-MinAtar").spec.action_dim == 3
    assert make_env("Breakout-MinAtar", use_minimal_action_set=False).spec.action_dim == 6


@pytest.mark.parametrize(
    "env_id, env_kwargs, message",
    [
        ("CartPole-v1", {"max_steps_in_episode": [1, {"a": 2}]}, r"env_kwargs\['max_steps"),
        ("CartPole-v1", "max_steps_in_episode=5", "must be a dict"),
    ],
)
def test_unwritable_env_kwargs_are_config_errors(env_id, env_kwargs, message):
    with pytest.raises(ppojax.ConfigError, match=message) as error:
        ppojax.PPOConfig(env_id=env_id, env_kwargs=env_kwargs)
    assert error.value.field == "env_kwargs"


@pytest.mark.parametrize(
    "env_id, env_kwargs, message",
    [
        ("CartPole-v1", {"max_step_in_episode": 5}, "no parameter 'max_step_in_episode'. Did you"),
        ("Breakout-MinAtar", {"colour": 1}, "no parameter 'colour'"),
    ],
)
def test_unknown_env_kwargs_are_config_errors_when_the_env_is_built(env_id, env_kwargs, message):
    """The config holds values only; the env says which settings it takes when it is built."""
    config = ppojax.PPOConfig(env_id=env_id, env_kwargs=env_kwargs)
    with pytest.raises(ppojax.ConfigError, match=message) as error:
        make_env(config.env_id, **config.env_kwargs)
    assert error.value.field == "env_kwargs"
