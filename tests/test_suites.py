"""Each adapter suite against its own step function, and a few updates of training on it.

Each suite is installed by the dev extra; a test is skipped only where its suite is missing.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ppojax
from ppojax.runs.policy import max_episode_steps

TINY = dict(num_envs=4, num_steps=16, total_timesteps=4 * 16 * 3, update_epochs=2)
STEPS = 120
# The training checks look at shapes and finite losses, not speed: LLVM's optimization level
# 0 compiles their programs in about two thirds of the time on 2 cores. The side-by-side runs
# keep the default, under which the adapter's copy of a suite's step and the suite's own
# give the same bits (at level 0 Playground's rewards differ in their last bit).
QUICK = {"xla_backend_optimization_level": 0}


def flat(obs) -> jax.Array:
    return jnp.concatenate([jnp.ravel(leaf).astype(jnp.float32) for leaf in jax.tree.leaves(obs)])


def run_side_by_side(env, raw_reset, raw_step, key, action_logits, draw_action=None):
    """``STEPS`` steps of the adapter (``PPOEnv.step_from``, resets drawn outside as in a
    rollout) and of the suite's own API (``raw_step(raw, action, key)``, the key the adapter's
    step gets) from the same keys and actions (drawn from
    ``action_logits(mask)``, or by ``draw_action(key)`` for continuous actions): per step the
    adapter's StepResult and what the suite's step gave (observation before any reset,
    reward, its terminated and truncated flags, the observation after the reset)."""

    def step(carry, key):
        state, raw = carry
        action_key, env_key, next_reset_key = jax.random.split(key, 3)
        if draw_action is None:
            action = jax.random.categorical(action_key, action_logits(env.action_mask(state)))
        else:
            action = draw_action(action_key)
        result, state = env.step_from(env_key, state, action, env.reset(next_reset_key))
        result = result._replace(obs=flat(result.obs), next_obs=flat(result.next_obs))
        raw, (obs, reward, terminated, truncated) = raw_step(raw, action, env_key)
        raw = jax.lax.cond(terminated | truncated, lambda: raw_reset(next_reset_key), lambda: raw)
        expected = (flat(obs), reward, terminated, truncated, flat(raw_observation(raw)))
        return (state, raw), (result, expected)

    def run(key):
        reset_key, run_key = jax.random.split(key)
        _, state = env.reset(reset_key)
        start = (state, raw_reset(reset_key))
        return jax.lax.scan(step, start, jax.random.split(run_key, STEPS))[1]

    return jax.device_get(jax.jit(run)(key))


def raw_observation(raw):
    return raw[-1]


def check_against_suite(outputs, both_ends=True):
    result, (obs, reward, terminated, truncated, next_obs) = outputs
    np.testing.assert_array_equal(result.terminated, terminated)
    np.testing.assert_array_equal(result.truncated, truncated)
    np.testing.assert_array_equal(result.reward, reward)
    # The adapter and the suite compute the observation in two fusions of one program: float
    # observations may differ in their last bits (Craftax's light level in [0, 1] by 6e-8 at
    # 0.8). 4 float32 ulps of the value's own scale allow for that: relative above 1 (Brax and
    # Playground positions and velocities), absolute below; integer ones match exactly.
    ulps = 4 * 2**-23
    np.testing.assert_allclose(result.next_obs, obs, rtol=ulps, atol=ulps)  # final obs
    np.testing.assert_allclose(result.obs, next_obs, rtol=ulps, atol=ulps)  # next first
    ended = terminated | truncated
    assert truncated.any() and (terminated.any() or not both_ends), "the seed shows both ends"
    np.testing.assert_array_equal(result.episode_length > 0, ended)
    # Each episode's return is the sum of its rewards.
    starts = np.concatenate([[0], np.flatnonzero(ended)[:-1] + 1])
    ends = np.flatnonzero(ended)
    sums = [reward[start : end + 1].sum() for start, end in zip(starts, ends, strict=True)]
    np.testing.assert_allclose(result.episode_return[ended], sums, rtol=1e-6)


def check_training(env_id, env_kwargs):
    config = ppojax.PPOConfig(env_id=env_id, env_kwargs=env_kwargs, num_minibatches=2, **TINY)
    key = jax.random.key(0)
    out = jax.jit(ppojax.train).lower(config, key).compile(QUICK)(config, key)
    obs_dim = ppojax.make_env(env_id, **env_kwargs).spec.obs_dim
    leaves = jax.tree.leaves(out.state.obs)  # the env's own shapes, batched over 4 envs
    assert all(leaf.shape[0] == 4 for leaf in leaves)
    assert sum(leaf[0].size for leaf in leaves) == obs_dim
    for name in ("policy_loss", "value_loss", "entropy", "approx_kl", "grad_norm"):
        values = np.asarray(out.metrics[name])
        assert values.shape == (3,) and np.isfinite(values).all(), name
    return out


def test_jumanji_snake_matches_jumanji_and_trains_with_its_action_mask():
    jumanji = pytest.importorskip("jumanji")
    raw_env = jumanji.make("Snake-v1", time_limit=15)
    env = ppojax.make_env("jumanji/Snake-v1", time_limit=15)
    assert env.spec.masked and env.spec.action_dim == 4
    assert env.spec.obs_dim == 12 * 12 * 5 + 1  # {"grid", "step_count"}, mask left out

    def without_mask(observation):
        return observation._replace(action_mask=jnp.zeros(0))

    def raw_reset(key):
        state, timestep = raw_env.reset(key)
        return state, without_mask(timestep.observation)

    def raw_step(raw, action, key):
        state, timestep = raw_env.step(raw[0], action)
        # Jumanji ends Snake at its time limit with discount 0, as if terminal; the adapter
        # counts that step as truncated (so GAE bootstraps it).
        timed_out = state.step_count >= raw_env.time_limit
        terminated = timestep.last() & (timestep.discount == 0) & ~timed_out
        truncated = timestep.last() & ~terminated
        observation = without_mask(timestep.observation)
        return (state, observation), (observation, timestep.reward, terminated, truncated)

    # Mostly allowed moves, so that some episodes reach the time limit; a masked move (about
    # 1 in 25 steps) kills the snake, a terminal state.
    outputs = run_side_by_side(
        env, raw_reset, raw_step, jax.random.key(3), lambda mask: jnp.where(mask, 2.0, 0.0)
    )
    check_against_suite(outputs)
    check_training("jumanji/Snake-v1", {"time_limit": 15})
    assert max_episode_steps(env) == 15


def test_xminigrid_matches_xminigrid_and_trains():
    xminigrid = pytest.importorskip("xminigrid")
    raw_env, params = xminigrid.make("MiniGrid-Empty-5x5")
    params = params.replace(max_steps=30)
    env = ppojax.make_env("xminigrid/MiniGrid-Empty-5x5", max_steps=30)
    assert env.spec.action_dim == 6 and env.spec.obs_dim == 7 * 7 * 2

    def raw_reset(key):
        timestep = raw_env.reset(params, key)
        return timestep, timestep.observation

    def raw_step(raw, action, key):
        timestep = raw_env.step(params, raw[0], action)
        terminated = timestep.last() & (timestep.discount == 0)
        truncated = timestep.last() & (timestep.discount > 0)
        return (timestep, timestep.observation), (
            timestep.observation,
            timestep.reward,
            terminated,
            truncated,
        )

    # Forward, left and right only: a random walk that reaches the goal now and then.
    walk = jnp.array([0.0, 0.0, 0.0, -1e9, -1e9, -1e9])
    outputs = run_side_by_side(env, raw_reset, raw_step, jax.random.key(0), lambda _: walk)
    check_against_suite(outputs)
    check_training("xminigrid/MiniGrid-Empty-5x5", {"max_steps": 12})
    assert max_episode_steps(env) == 30


def test_navix_matches_navix_without_its_late_reset_and_trains():
    navix = pytest.importorskip("navix")
    raw_env = navix.make("Navix-Empty-5x5-v0", max_steps=30)
    env = ppojax.make_env("navix/Navix-Empty-5x5-v0", max_steps=30)
    assert env.spec.action_dim == len(raw_env.action_set) and env.spec.obs_dim == 5 * 5 * 3
    assert max_episode_steps(env) == 30

    def raw_reset(key):
        timestep = raw_env.reset(key)
        return timestep, timestep.observation

    def raw_step(raw, action, key):
        # navix's step resets on the call after a done; on every other call it is the
        # transition, so a step from a timestep that is not done is navix's own
        timestep = raw_env.step(raw[0], action)
        terminated = timestep.step_type == 2
        truncated = timestep.step_type == 1
        return (timestep, timestep.observation), (
            timestep.observation,
            timestep.reward,
            terminated,
            truncated,
        )

    # Rotate either way or go forward: a random walk that reaches the goal now and then.
    walk = jnp.array([0.0, 0.0, 0.0] + [-1e9] * (len(raw_env.action_set) - 3))
    outputs = run_side_by_side(env, raw_reset, raw_step, jax.random.key(0), lambda _: walk)
    check_against_suite(outputs)
    check_training("navix/Navix-Empty-5x5-v0", {"max_steps": 12})
    with pytest.raises(ppojax.ConfigError, match="Close matches: navix/Navix-Empty-5x5-v0"):
        ppojax.make_env("navix/Navix-Empty-5x5")


def brax_api_with_time_limit(raw_env, limit):
    """``raw_reset`` and ``raw_step`` for ``run_side_by_side`` of an env with brax's API
    (brax's, Playground's): ``done`` is terminal, and ``limit`` steps truncate an episode."""

    def raw_reset(key):
        state = raw_env.reset(key)
        return state, jnp.int32(0), state.obs

    def raw_step(raw, action, key):
        state = raw_env.step(raw[0], action)
        terminated = state.done > 0.5
        truncated = ~terminated & (raw[1] + 1 >= limit)
        return (state, raw[1] + 1, state.obs), (state.obs, state.reward, terminated, truncated)

    return raw_reset, raw_step


@pytest.mark.heavy
def test_brax_inverted_pendulum_matches_brax_with_its_time_limit_as_truncation():
    pytest.importorskip("brax")
    from brax import envs as brax_envs

    limit = 25
    raw_env = brax_envs.get_environment("inverted_pendulum", backend="spring")
    env = ppojax.make_env("brax/inverted_pendulum", backend="spring", max_steps_in_episode=limit)
    assert not env.spec.discrete and env.spec.action_dim == 1 and env.spec.obs_dim == 4
    assert max_episode_steps(env) == limit

    raw_reset, raw_step = brax_api_with_time_limit(raw_env, limit)

    def draw(key):  # uniform pushes in [-1, 1]: the pole falls in some episodes, not all
        return jax.random.uniform(key, (1,), minval=-1.0, maxval=1.0)

    outputs = run_side_by_side(env, raw_reset, raw_step, jax.random.key(0), None, draw)
    check_against_suite(outputs)
    check_training("brax/inverted_pendulum", {"backend": "spring", "max_steps_in_episode": 12})


@pytest.mark.heavy
def test_playground_cartpole_matches_playground_with_its_episode_length_as_truncation():
    pytest.importorskip("mujoco_playground")
    from mujoco_playground import registry

    limit = 25
    config = registry.get_default_config("CartpoleBalance")
    config.impl = "jax"
    raw_env = registry.load("CartpoleBalance", config=config)
    env = ppojax.make_env("playground/CartpoleBalance", max_steps_in_episode=limit)
    assert env.env.env._config.impl == "jax"  # MJX's JAX pipeline, not warp's CPU kernels
    assert not env.spec.discrete and env.spec.action_dim == 1 and env.spec.obs_dim == 5
    assert max_episode_steps(env) == limit
    assert max_episode_steps(ppojax.make_env("playground/CartpoleBalance")) == 1000

    raw_reset, raw_step = brax_api_with_time_limit(raw_env, limit)

    def draw(key):
        return jax.random.uniform(key, (1,), minval=-1.0, maxval=1.0)

    outputs = run_side_by_side(env, raw_reset, raw_step, jax.random.key(0), None, draw)
    check_against_suite(outputs, both_ends=False)  # the DM Control cartpole never terminates
    with pytest.raises(ppojax.ConfigError, match="no parameter 'episode_lenght'.*episode_length"):
        ppojax.make_env("playground/CartpoleBalance", episode_lenght=50)
    check_training("playground/CartpoleBalance", {"max_steps_in_episode": 12})


@pytest.mark.heavy
def test_craftax_classic_matches_craftax_with_the_time_limit_as_truncation():
    """A random player rarely dies in the 120 steps, so only truncations are certain;
    terminations are checked where they occur."""
    pytest.importorskip("craftax")
    from craftax.craftax_env import make_craftax_env_from_name

    raw_env = make_craftax_env_from_name("Craftax-Classic-Symbolic-v1", auto_reset=False)
    params = raw_env.default_params.replace(max_timesteps=25)
    env = ppojax.make_env("craftax/Craftax-Classic-Symbolic-v1", max_timesteps=25)
    assert env.spec.action_dim == 17 and env.spec.obs_dim == 1345

    def raw_reset(key):
        obs, state = raw_env.reset_env(key, params)
        return state, obs

    def raw_step(raw, action, key):
        obs, state, reward, done, _ = raw_env.step_env(key, raw[0], action, params)
        dead = (state.player_health <= 0) | ((state.timestep < params.max_timesteps) & done)
        return (state, obs), (obs, reward, done & dead, done & ~dead)

    outputs = run_side_by_side(env, raw_reset, raw_step, jax.random.key(0), lambda _: jnp.zeros(17))
    check_against_suite(outputs, both_ends=False)
    check_training("craftax/Craftax-Classic-Symbolic-v1", {"max_timesteps": 12})


def test_suite_ids_name_unknown_envs_and_missing_extras(monkeypatch):
    pytest.importorskip("jumanji")
    with pytest.raises(ppojax.ConfigError, match="Close matches: jumanji/Snake-v1"):
        ppojax.make_env("jumanji/Snak-v1")
    from ppojax.envs import registry

    monkeypatch.setattr(registry, "suite_installed", lambda suite: False)
    with pytest.raises(ppojax.ConfigError, match=r'pip install "ppojax\[jumanji\]"'):
        ppojax.PPOConfig(env_id="jumanji/Snake-v1")
