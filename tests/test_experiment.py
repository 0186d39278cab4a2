import importlib

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ppojax
from ppojax.envs import PPOEnv
from ppojax.ppo.summary import grid_points
from ppojax.ppo.sweeps import sweepable_fields
from ppojax.runs.experiment import (
    Experiment,
    batched_config,
    chunk_length,
    chunk_plan,
    init_states,
    init_states_compiling,
    report_interval,
    run_keys,
    run_table,
)
from ppojax.runs.loop import scan_chunk

CONFIG = ppojax.PPOConfig(num_envs=2, num_steps=8, total_timesteps=2 * 8 * 10, hidden_sizes=(8,))


def test_chunk_plan_covers_every_update_and_ends_chunks_on_checkpoints():
    assert chunk_plan(0, 10, 4, None) == [(0, 4), (4, 4), (8, 2)]
    assert chunk_plan(0, 10, 4, 3) == [(0, 3), (3, 3), (6, 3), (9, 1)]
    assert chunk_plan(4, 10, 3, 5) == [(4, 1), (5, 3), (8, 2)]
    assert chunk_plan(10, 10, 3, None) == []


def test_scan_chunk_runs_count_numbered_steps_and_skips_the_rest():
    """Steps 2, 3, 4 of a chunk of length 4 from step 2: the state adds each step's number
    times the input (10 * (2 + 3 + 4) = 90), the metrics [runs, length] hold each step's
    number and a zero for the skipped step, and ``after`` sees every step, ran or not."""
    seen = []

    def step(scale, state, number):
        return state + scale * number, {"number": jnp.stack([number, -number])}

    def after(scale, number, metrics, ran):
        jax.debug.callback(lambda *values: seen.append(tuple(map(int, values))), number, ran)

    run = jax.jit(lambda first, count: scan_chunk(step, 10, 0, first, count, 4, after))
    state, metrics = jax.block_until_ready(run(2, 3))
    assert int(state) == 90
    np.testing.assert_array_equal(metrics["number"], [[2, 3, 4, 0], [-2, -3, -4, 0]])
    assert sorted(seen) == [(2, 1), (3, 1), (4, 1), (5, 0)]


def test_chunks_follow_checkpoints_and_reports_spread_over_the_run():
    assert chunk_length(976, None) == 976
    assert chunk_length(976, 8) == 8
    assert chunk_length(3, 8) == 3
    assert report_interval(976, 100) == 10
    assert report_interval(5, 100) == 1


def test_grid_points_are_the_cartesian_product_in_run_order():
    grid = {"learning_rate": (1e-3, 3e-4), "clip_eps": (0.1, 0.2, 0.3)}
    assert len(grid_points(grid)) == 6 and grid_points({}) == [{}]
    experiment = Experiment(CONFIG, seeds=2, grid=grid)
    table = run_table(experiment)
    assert experiment.num_runs == 12 and len(table) == 12
    assert table[3] == {"run": 3, "seed": 1, "learning_rate": 1e-3, "clip_eps": 0.2}


def test_batched_config_batches_the_swept_fields_and_keys_repeat_per_point():
    experiment = Experiment(CONFIG, seeds=2, grid={"learning_rate": (1e-3, 3e-4)})
    config, axes = batched_config(experiment)
    assert axes == 0
    np.testing.assert_allclose(config.learning_rate, [1e-3, 1e-3, 3e-4, 3e-4])
    np.testing.assert_allclose(config.gamma, [CONFIG.gamma] * 4)
    keys = jax.random.key_data(run_keys(experiment))
    np.testing.assert_array_equal(keys[:2], keys[2:])
    assert batched_config(Experiment(CONFIG, seeds=3)) == (CONFIG, None)


def test_bad_grids_are_clear_errors():
    assert "learning_rate" in sweepable_fields() and "num_envs" not in sweepable_fields()
    with pytest.raises(ValueError, match="cannot be swept"):
        Experiment(CONFIG, grid={"num_envs": (2, 4)})
    with pytest.raises(ValueError, match="Did you mean learning_rate"):
        Experiment(CONFIG, grid={"learning_rat": (1e-3,)})
    with pytest.raises(ValueError, match="PPOConfig.gamma"):
        Experiment(CONFIG, grid={"gamma": (0.9, 1.5)})
    with pytest.raises(ValueError, match="seeds"):
        Experiment(CONFIG, seeds=0)


def test_fresh_states_are_made_while_the_runner_compiles_in_another_thread():
    """init_states_compiling gives init_states' arrays bit for bit, and hands compile_for the
    states' shapes and dtypes in a thread of its own (so the two compiles overlap)."""
    import threading

    experiment = Experiment(CONFIG, seeds=2, grid={"learning_rate": (1e-3, 3e-4)})
    seen = {}

    def compile_for(template):
        seen["thread"] = threading.current_thread().name
        seen["template"] = template
        return "compiled"

    states, compiled = init_states_compiling(experiment, compile_for)
    assert compiled == "compiled" and seen["thread"] != threading.current_thread().name
    expected = init_states(experiment)
    template = jax.tree.map(lambda leaf: (leaf.shape, leaf.dtype), seen["template"])
    assert template == jax.tree.map(lambda leaf: (leaf.shape, leaf.dtype), expected)
    for got, want in zip(jax.tree.leaves(states), jax.tree.leaves(expected), strict=True):
        if jnp.issubdtype(want.dtype, jax.dtypes.prng_key):
            got, want = jax.random.key_data(got), jax.random.key_data(want)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_an_interrupted_run_keeps_its_checkpoints_and_resumes(tmp_path, monkeypatch):
    """Ctrl-C after the second chunk: the checkpoint at update 2 stays, no unfinished state is
    saved as final, and resuming finishes the run."""
    from ppojax.runs import experiment, folder

    config = CONFIG.replace(total_timesteps=2 * 8 * 6, update_epochs=1, num_minibatches=1)
    chunks = []
    real_append = folder.append_metrics

    def append_then_interrupt(*args):
        chunks.append(args)
        real_append(*args)
        if len(chunks) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(folder, "append_metrics", append_then_interrupt)
    options = experiment.RunOptions(progress=False, checkpoint_every=2)
    with pytest.raises(KeyboardInterrupt):
        experiment.run_experiment(Experiment(config, seeds=2), tmp_path, options)
    assert [path.name for path in (tmp_path / folder.CHECKPOINT_DIR).iterdir()] == ["2"]
    monkeypatch.setattr(folder, "append_metrics", real_append)
    result = experiment.resume_experiment(tmp_path)
    assert result.resumed_from == 2 and result.metrics["episode_return"].shape == (2, 6)
    np.testing.assert_array_equal(result.state.update_step, [6, 6])


class NaNRewardAt:
    """CartPole whose reward is NaN at its ``at``-th step (counted over episodes: the
    counter lives beside gymnax's state, which its auto-reset leaves alone)."""

    def __init__(self, at: int) -> None:
        self.env, self.params = gymnax.make("CartPole-v1")
        self.at = at

    def reset(self, key, params):
        obs, state = self.env.reset(key, params)
        return obs, (state, jnp.int32(0))

    def step(self, key, state, action, params):
        inner, count = state
        obs, inner, reward, terminated, truncated, info = self.env.step(key, inner, action, params)
        reward = jnp.where(count + 1 == self.at, jnp.nan, reward)
        return obs, (inner, count + 1), reward, terminated, truncated, info

    def observation_space(self, params):
        return self.env.observation_space(params)

    def action_space(self, params):
        return self.env.action_space(params)


def test_a_nan_reward_skips_one_update_is_reported_and_the_run_recovers(
    tmp_path, monkeypatch, capsys
):
    """A NaN reward at env step 40 (in update 3 of 16-step rollouts) reaches GAE and every
    minibatch of update 3: the guard skips all its steps, summary.json and the result name
    update 3, and with the normalizers left clean the run trains on, finite, to the end."""
    from ppojax.runs import experiment, folder

    train_module = importlib.import_module("ppojax.ppo.train")  # ppojax.train is the function
    env = NaNRewardAt(40)
    monkeypatch.setattr(
        train_module, "make_env", lambda env_id: PPOEnv(env, env.params, "NaNReward")
    )
    config = CONFIG.replace(
        num_steps=16,
        total_timesteps=2 * 16 * 6,
        normalize_rewards=True,
        normalize_observations=True,
        divergence_guard=True,
    )
    options = experiment.RunOptions(progress=False)
    result = experiment.run_experiment(Experiment(config, seeds=2), tmp_path, options)
    steps = config.update_epochs * config.num_minibatches
    skipped = result.metrics["nonfinite_steps"]
    np.testing.assert_array_equal(skipped, [[0, 0, steps, 0, 0, 0]] * 2)
    np.testing.assert_array_equal(result.metrics["gradient_steps"][:, 2], [0, 0])
    expected = [
        {
            "run": run,
            "nonfinite_steps": steps,
            "first_update": 3,
            "last_update_skipped": 0,
            "recovered": True,
        }
        for run in (0, 1)
    ]
    assert result.divergence == expected and result.diverged_runs == []
    summary = folder.read_json(tmp_path / folder.SUMMARY_FILE)
    assert summary["divergence"] == expected and summary["diverged_runs"] == []
    state = result.state
    for leaf in jax.tree.leaves((state.params, state.opt_state, state.obs_stats)):
        assert np.isfinite(np.asarray(leaf)).all()
    assert np.isfinite(np.asarray(state.reward_normalizer.return_stats.var)).all()
    assert (result.metrics["gradient_steps"][:, 3:] == steps).all()  # trained on afterwards
    assert f"at update 3 the divergence guard skipped {steps} minibatch step(s) of run 0" in (
        capsys.readouterr().err
    )
