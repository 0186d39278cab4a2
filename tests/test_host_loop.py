"""``train_loop`` takes the user's ``RunOptions`` (what to show and keep) and its own loop
mechanics as arguments: chunks end on ``checkpoint_every`` (None: one chunk, the final state
kept), a resume goes on from the newest checkpoint, and every bad option or argument is an
error naming it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppojax.checks import ConfigError
from ppojax.runs.folder import CHECKPOINT_DIR
from ppojax.runs.loop import train_loop
from ppojax.runs.options import RunOptions


def count_step(frozen, state, key):
    """Adds ``frozen`` and a draw of ``key`` to a running total; its metric is the total."""
    total = state["total"] + frozen + jax.random.uniform(key)
    return {"total": total}, {"total": total}


def run(run_dir, options, **loop):
    return train_loop(
        run_dir,
        count_step,
        {"total": jnp.float32(0)},
        jnp.float32(1),
        jax.random.key(0),
        options,
        **loop,
    )


def saved_steps(run_dir):
    return sorted(int(path.name) for path in (run_dir / CHECKPOINT_DIR).iterdir())


def test_checkpoints_follow_the_options_and_a_resume_goes_on_bit_for_bit(tmp_path):
    every = RunOptions(progress=False, checkpoint_every=2, keep_checkpoints=None)
    whole = run(tmp_path / "whole", every, num_steps=5)
    assert saved_steps(tmp_path / "whole") == [2, 4, 5] and whole.start == 0
    # None: what it means for an env run, one chunk and the final state kept
    once = run(tmp_path / "once", RunOptions(progress=False), num_steps=5)
    assert saved_steps(tmp_path / "once") == [5]
    np.testing.assert_array_equal(once.metrics["total"], whole.metrics["total"])
    cut = run(tmp_path / "cut", every, num_steps=3)
    resumed = run(tmp_path / "cut", every, num_steps=5, resume=True)
    assert resumed.start == 3  # the final state of a shorter run is a checkpoint too
    np.testing.assert_array_equal(resumed.metrics["total"], whole.metrics["total"])
    assert cut.metrics["total"].shape == (3,)


@pytest.mark.parametrize(
    ("options", "loop", "error", "names"),
    [
        (RunOptions(progress=False), {"num_steps": 0}, ConfigError, "train_loop.num_steps"),
        (
            RunOptions(progress=False),
            {"num_steps": 2, "resume": "yes"},
            ConfigError,
            "train_loop.resume",
        ),
        (
            RunOptions(progress=False),
            {"num_steps": 2, "donate": 1},
            ConfigError,
            "train_loop.donate",
        ),
        (RunOptions(tensorboard=True), {"num_steps": 2}, ConfigError, "RunOptions.tensorboard"),
        ({"checkpoint_every": 2}, {"num_steps": 2}, TypeError, "RunOptions"),
        (RunOptions(progress=False), {"num_step": 2}, TypeError, "num_step"),
    ],
)
def test_a_bad_option_or_argument_names_it(tmp_path, options, loop, error, names):
    with pytest.raises(error, match=names):
        run(tmp_path, options, **loop)
    assert not (tmp_path / CHECKPOINT_DIR).exists()


@pytest.mark.parametrize(
    ("fields", "error", "names"),
    [
        ({"checkpoint_every": 0}, ConfigError, "RunOptions.checkpoint_every"),
        ({"keep_checkpoints": 1.5}, ConfigError, "RunOptions.keep_checkpoints"),
        ({"progress": "no"}, ConfigError, "RunOptions.progress"),
        ({"checkpint_every": 2}, TypeError, "checkpint_every"),
    ],
)
def test_a_bad_run_option_names_its_field(fields, error, names):
    with pytest.raises(error, match=names):
        RunOptions(**fields)


def test_every_kind_of_summary_shares_one_part(tmp_path):
    """A language-model run counts steps and an env run updates: the length, resume and
    timing keys follow the unit, the rest is the same, and each kind's keys are kept."""
    from ppojax.runs.folder import SUMMARY_FILE, read_json
    from ppojax.runs.summary import write_summary

    (tmp_path / "lm").mkdir(), (tmp_path / "env").mkdir()
    lm = write_summary(tmp_path / "lm", "step", 4, 2, {"final": {"loss": 1.0}}, {"wall_s": 1.23456})
    env = write_summary(
        tmp_path / "env",
        "update",
        6,
        0,
        {"final_return": [1.0]},
        {"compile_seconds": 0.5, "run_seconds": 2.0},
        head={"env_id": "CartPole-v1"},
        extras={"diverged_runs": []},
    )
    assert read_json(tmp_path / "lm" / SUMMARY_FILE) == lm
    assert lm["steps"] == 4 and lm["resumed_from_step"] == 2 and lm["timed_steps"] == 2
    assert lm["wall_s"] == 1.235 and lm["final"] == {"loss": 1.0}
    assert env["num_updates"] == 6 and env["resumed_from_update"] is None
    assert env["timed_updates"] == 6 and env["env_id"] == "CartPole-v1"
    assert env["diverged_runs"] == [] and env["run_seconds"] == 2.0
    for summary in (lm, env):
        assert summary["finished_utc"] and summary["versions"]["jax"] == jax.__version__
    with pytest.raises(ValueError, match="unit"):
        write_summary(tmp_path / "bad", "epoch", 1, 0, {}, {})
