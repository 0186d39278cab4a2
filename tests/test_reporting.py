import numpy as np

import ppojax
from ppojax.ppo.summary import latest_finite
from ppojax.runs.options import RunOptions
from ppojax.runs.progress import ChunkHandler, divergence_report

CONFIG = ppojax.PPOConfig(num_envs=2, num_steps=8, total_timesteps=2 * 8 * 5, hidden_sizes=(8,))


def test_latest_finite_takes_each_runs_last_episode_return():
    returns = np.array([[1.0, np.nan, 3.0, np.nan], [np.nan] * 4])
    np.testing.assert_array_equal(latest_finite(returns), [3.0, np.nan])


def test_divergence_report_counts_skips_and_says_which_runs_recovered():
    skipped = np.array([[0, 2, 0, 0], [0, 0, 1, 3], [0, 0, 0, 0]])
    rows = divergence_report(skipped)
    assert rows[0] == {
        "run": 0,
        "nonfinite_steps": 2,
        "first_update": 2,
        "last_update_skipped": 0,
        "recovered": True,
    }
    assert (rows[1]["nonfinite_steps"], rows[1]["first_update"], rows[1]["recovered"]) == (
        4,
        3,
        False,
    )
    assert rows[2]["first_update"] is None and rows[2]["recovered"]
    assert divergence_report(None) == []


def test_chunk_handler_joins_the_chunks_metrics_in_update_order(capsys):
    runs = [{"run": 0, "seed": 0}, {"run": 1, "seed": 1}]
    handler = ChunkHandler(CONFIG, runs, None, RunOptions(progress=False), 0)
    first = {
        "episode_return": np.array([[1.0, 2.0], [3.0, 4.0]]),
        "nonfinite_steps": np.zeros((2, 2)),
    }
    second = {
        "episode_return": np.array([[5.0], [6.0]]),
        "nonfinite_steps": np.array([[0.0], [1.0]]),
    }
    handler(0, None, first)
    handler(2, None, second)
    # the guard's first skip is said once, with its update and run
    err = capsys.readouterr().err
    assert "at update 3" in err and "1 minibatch step(s) of run 1" in err
    metrics = handler.finish(None)
    np.testing.assert_array_equal(metrics["episode_return"], [[1.0, 2.0, 5.0], [3.0, 4.0, 6.0]])
