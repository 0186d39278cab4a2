import jax
import numpy as np
import pytest

import ppojax
from ppojax.ppo.rollout import network_input
from ppojax.ppo.train import make_agent
from ppojax.runs import Experiment, RunOptions, run_experiment
from ppojax.runs.policy import evaluate, load, render_gif


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A tiny two-seed run trained in-process into a run folder, normalizing observations so
    that the policy must use the checkpoint's running statistics."""
    config = ppojax.PPOConfig(
        num_envs=2,
        num_steps=4,
        total_timesteps=2 * 4 * 4,
        update_epochs=1,
        num_minibatches=1,
        hidden_sizes=(8,),
        normalize_observations=True,
    )
    run_dir = tmp_path_factory.mktemp("run")
    result = run_experiment(Experiment(config, seeds=2), run_dir, RunOptions(progress=False))
    return result


def test_load_gives_the_config_and_the_saved_params(finished):
    config, act = load(finished.run_dir, run=1)
    assert config == finished.experiment.config
    loaded = act.args[0].params
    saved = jax.tree.map(lambda leaf: leaf[1], finished.state.params)
    for want, have in zip(jax.tree.leaves(saved), jax.tree.leaves(loaded), strict=True):
        np.testing.assert_array_equal(np.asarray(want), np.asarray(have))


def test_act_works_on_plain_numpy_observations(finished):
    config, act = load(finished.run_dir)
    obs = np.array([0.01, -0.02, 0.03, 0.0], np.float32)
    action = act(obs, jax.random.key(0))
    assert np.asarray(action).shape == () and int(action) in (0, 1)
    batch = np.stack([obs, -obs, 2 * obs])
    assert np.asarray(act(batch, jax.random.key(1))).shape == (3,)
    # one compiled act run twice: the same actions
    np.testing.assert_array_equal(act(batch, jax.random.key(1)), act(batch, jax.random.key(1)))
    network = make_agent(config).network
    state = act.args[0]
    assert float(state.obs_stats.count) > 0
    obs = network_input(config, state.obs_stats, batch)
    logits, _, _, _ = network.apply(state.params, obs, None)
    # act's compiled program and this eager one round the logits differently by a few ulps;
    # their argmax agrees wherever the two logits are further apart than that.
    assert (np.abs(np.diff(np.asarray(logits), axis=-1)) > 1e-4).all()
    np.testing.assert_array_equal(act(batch, deterministic=True), np.argmax(logits, axis=-1))
    with pytest.raises(ValueError, match="needs a key"):
        act(obs)


def test_evaluate_returns_one_return_per_episode(finished):
    config, act = load(finished.run_dir)
    returns = evaluate(config, act, episodes=4, seed=0, deterministic=True)
    assert returns.shape == (4,) and np.all(returns >= 1) and np.all(returns <= 500)
    # the same compiled evaluation twice: the same returns, bit for bit
    np.testing.assert_array_equal(returns, evaluate(config, act, 4, seed=0, deterministic=True))


def test_load_rejects_a_run_that_does_not_exist(finished):
    with pytest.raises(ValueError, match=r"run must lie in \[0, 1\]"):
        load(finished.run_dir, run=2)


def test_gif_of_an_env_gymnax_cannot_draw_is_a_clear_error(tmp_path, finished):
    config = ppojax.PPOConfig(env_id="Reacher-misc")
    with pytest.raises(ValueError, match="gymnax cannot draw Reacher-misc"):
        render_gif(config, None, tmp_path / "x.gif")


def test_a_recurrent_policy_loads_acts_with_its_hidden_state_and_evaluates(tmp_path):
    from ppojax.networks import reset_hidden

    config = ppojax.PPOConfig(
        num_envs=2,
        num_steps=4,
        total_timesteps=2 * 4 * 2,
        update_epochs=1,
        num_minibatches=1,
        hidden_sizes=(8,),
        recurrent="gru",
        recurrent_size=4,
    )
    run_experiment(Experiment(config), tmp_path, RunOptions(progress=False))
    loaded, act = load(tmp_path)
    assert loaded.recurrent == "gru"
    obs = np.array([0.01, -0.02, 0.03, 0.0], np.float32)
    action, hidden = act(obs, None, jax.random.key(0))
    assert np.asarray(action).shape == () and hidden.shape == (8,)  # actor's 4 + critic's 4
    again, later = act(obs, hidden, jax.random.key(0))
    assert not np.array_equal(hidden, later)  # the state moves on
    batch = np.stack([obs, obs])
    actions, states = act(batch, None, deterministic=True)
    assert actions.shape == (2,) and states.shape == (2, 8)
    np.testing.assert_allclose(states[0], hidden, rtol=1e-6, atol=1e-7)  # batch of one each
    np.testing.assert_array_equal(reset_hidden(states, np.array([True, False]))[0], 0.0)
    returns = evaluate(loaded, act, episodes=2, seed=0, deterministic=True)
    assert returns.shape == (2,) and np.all(returns >= 1)
