"""``ppojax.train`` (the library's layers, plain forms) and ``ppojax.ppo.reference`` (the
algorithm in one file) train the classic CartPole config to the same state, bit for bit."""

import jax
import pytest
from tolerance import assert_close, assert_trees_equal

import ppojax
from ppojax.checks import ConfigError
from ppojax.ppo import reference
from ppojax.runtime import kernels

# PureJaxRL's CartPole config (PPOConfig's defaults: 4 envs, 4 epochs of 4 minibatches,
# clip 0.2, lr 2.5e-4 annealed) at 32 steps a rollout and 3 updates.
CLASSIC = ppojax.PPOConfig(num_steps=32, total_timesteps=4 * 32 * 3)
# Episodes cut at 10 steps, before CartPole can fail (a random policy's earliest end is about
# 8 steps in): nearly every episode ends truncated, and GAE bootstraps from its last value.
TRUNCATED = CLASSIC.replace(env_kwargs={"max_steps_in_episode": 10})


def library_train(config: ppojax.PPOConfig, key: jax.Array) -> ppojax.TrainOutput:
    with kernels.plain():  # traced here, in a jit of its own: no program cached without it
        return jax.jit(lambda config, key: ppojax.train(config, key))(config, key)


@pytest.mark.parametrize("config", [CLASSIC, TRUNCATED], ids=["classic", "truncated"])
def test_reference_trains_to_the_library_state_bit_for_bit(config):
    key = jax.random.key(3)
    library = library_train(config, key)
    state, metrics = jax.jit(reference.train)(config, key)

    # The same keys, the same operations on the same shapes: one state, every bit.
    assert_trees_equal(state.params, library.state.params)
    assert_trees_equal(state.opt_state, library.state.opt_state)
    envs = library.state.env_state  # gymnax's states, and each running episode's counts
    assert_trees_equal(
        (state.obs, state.env_state, state.episode_return, state.episode_length),
        (library.state.obs, envs.env_state, envs.episode_return, envs.episode_length),
    )
    for name in ("episode_return", "episode_length", "episodes_finished"):
        assert_trees_equal(metrics[name], library.metrics[name])
    assert (metrics["episodes_finished"] > 0).all()
    if config is TRUNCATED:
        assert (metrics["episode_length"] <= 10).all()

    # The loss terms are means over an update's 16 minibatch steps: the library adds them up
    # one step at a time in its loop, the reference stacks them and takes jnp.mean, whose
    # order of addition XLA picks. Reordering a sum of n float32 terms moves it by at most
    # (n - 1) eps sum |term|, so the mean by 15 ulps of the terms' size: relative to the mean
    # for the positive terms, and of the per-step losses' size (below 1 on CartPole's
    # normalized advantages and clipped ratios) for the policy loss, whose terms change sign.
    for name in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction"):
        assert_close(metrics[name], library.metrics[name], ulps=16, scale=1.0, err_msg=name)


def test_the_reference_refuses_what_it_does_not_implement():
    with pytest.raises(ConfigError, match="normalize_observations=False"):
        reference.train(CLASSIC.replace(normalize_observations=True), jax.random.key(0))
    with pytest.raises(ConfigError, match="one discrete action"):
        reference.train(CLASSIC.replace(env_id="Pendulum-v1"), jax.random.key(0))
