"""Population-based training: truncation selection and explore against hand-made arrays, the
search's checks, and a whole population trained in one compiled program."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ppojax
from ppojax.ppo.pbt import (
    Bound,
    exploit_and_explore,
    exploit_sources,
    interval_scores,
    num_replaced,
    parse_search,
)

TINY = ppojax.PPOConfig(
    num_envs=4,
    num_steps=16,
    total_timesteps=4 * 16 * 6,
    update_epochs=1,
    num_minibatches=2,
    hidden_sizes=(8,),
)
SEARCH = {"learning_rate": (1e-4, 3e-3, "log"), "ent_coef": (0.0, 0.05)}


def test_the_lowest_scores_copy_from_the_highest():
    scores = jnp.array([1.0, 4.0, np.nan, 3.0, 2.0, 5.0, 0.5, 6.0])
    sources = np.asarray(exploit_sources(jax.random.key(0), scores, replaced=2))
    # bottom two: member 2 (NaN ranks lowest) and member 6 (0.5); top two: 5 and 7
    assert set(np.flatnonzero(sources != np.arange(8))) <= {2, 6}
    assert sources[2] in (5, 7) and sources[6] in (5, 7)
    kept = [0, 1, 3, 4, 5, 7]
    np.testing.assert_array_equal(sources[kept], kept)
    assert num_replaced(8, 0.25) == 2 and num_replaced(3, 0.25) == 1 and num_replaced(2, 0.5) == 1


def test_exploit_copies_the_state_but_not_the_key_and_explore_perturbs_within_bounds():
    population = 4
    states = jax.vmap(ppojax.init_state, in_axes=(None, 0))(
        TINY, jax.random.split(jax.random.key(1), population)
    )
    bounds = {"learning_rate": Bound(1e-4, 3e-3, True)}
    hyper = {"learning_rate": jnp.array([1e-3, 2e-3, 2.9e-3, 5e-4])}
    scores = jnp.array([3.0, 1.0, 4.0, 2.0])  # member 1 is the lowest, member 2 the highest
    new, values, sources = exploit_and_explore(
        jax.random.key(2), scores, states, hyper, bounds, 0.25, "perturb"
    )
    np.testing.assert_array_equal(sources, [0, 2, 2, 3])
    kept = np.array([0, 2, 3])
    for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(states.params), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        np.testing.assert_array_equal(a[1], b[2])
        np.testing.assert_array_equal(a[kept], b[kept])
    np.testing.assert_array_equal(jax.random.key_data(new.key), jax.random.key_data(states.key))
    lr = np.asarray(values["learning_rate"])
    np.testing.assert_allclose(lr[kept], [1e-3, 2.9e-3, 5e-4])
    # 2.9e-3 x 0.8 = 2.32e-3, or x 1.25 = 3.625e-3 clipped to the bound 3e-3
    assert np.isclose(lr[1], 2.32e-3) or np.isclose(lr[1], 3e-3)
    resampled = exploit_and_explore(
        jax.random.key(3), scores, states, hyper, bounds, 0.25, "resample"
    )[1]["learning_rate"]
    assert 1e-4 <= float(resampled[1]) <= 3e-3


def test_interval_scores_skip_updates_without_an_ended_episode():
    metrics = {"episode_return": jnp.array([[1.0, np.nan, 3.0], [np.nan, np.nan, np.nan]])}
    np.testing.assert_allclose(interval_scores(metrics), [2.0, np.nan])


@pytest.mark.parametrize(
    "search, message",
    [
        ({"num_envs": (2, 8)}, "fixes the program's shapes"),
        ({"learning_rat": (1e-4, 1e-3)}, "Did you mean learning_rate"),
        ({"learning_rate": (1e-3, 1e-4)}, "low < high"),
        ({"ent_coef": (0.0, 0.1, "log")}, "log bounds must be > 0"),
        ({"ent_coef": (0.0, 0.1, "cubic")}, "'log' or 'linear'"),
        ({"gamma": (0.9, 1.5)}, "gamma"),
        ({}, "needs a search"),
    ],
)
def test_bad_searches_are_clear_errors(search, message):
    with pytest.raises(ValueError, match=message):
        parse_search(TINY, search)


def test_a_population_trains_in_one_program_with_records_of_every_interval():
    run = jax.jit(functools.partial(ppojax.pbt, population=4, interval=2, search=SEARCH))
    out = run(TINY, jax.random.key(0))
    assert out.metrics["episode_return"].shape == (4, TINY.num_updates)
    assert out.lineage.shape == out.scores.shape == (4, 3)
    assert out.hyperparams["learning_rate"].shape == (4, 3)
    lr = np.asarray(out.hyperparams["learning_rate"])
    assert (lr >= 1e-4 * (1 - 1e-6)).all() and (lr <= 3e-3 * (1 + 1e-6)).all()
    np.testing.assert_array_equal(out.lineage[:, -1], np.arange(4))  # no exploit after the end
    # a member that copied another carries that member's hyperparameters, perturbed
    for g in range(2):
        for member, source in enumerate(np.asarray(out.lineage[:, g])):
            if source != member:
                ratio = lr[member, g + 1] / lr[source, g]
                assert (
                    np.isclose(ratio, 0.8, rtol=1e-5)
                    or np.isclose(ratio, 1.25, rtol=1e-5)
                    or (np.isclose(lr[member, g + 1], 1e-4) or np.isclose(lr[member, g + 1], 3e-3))
                )
    again = run(TINY, jax.random.key(0))
    plain = (out.state.replace(key=None), out.metrics, out.hyperparams, out.lineage)
    plain_again = (again.state.replace(key=None), again.metrics, again.hyperparams, again.lineage)
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(plain_again), strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_run_must_divide_into_intervals():
    with pytest.raises(ValueError, match="interval=4 must divide the run's 6 updates"):
        ppojax.pbt(TINY, jax.random.key(0), population=4, interval=4, search=SEARCH)


def test_the_pbt_command_writes_the_run_folder_and_names_the_best_member(tmp_path, capsys):
    from ppojax.cli.commands import main
    from ppojax.ppo.summary import final_return
    from ppojax.runs import folder

    flags = ["--total-timesteps", "384", "--num-envs", "4", "--num-steps", "16"]
    flags += ["--update-epochs", "1", "--num-minibatches", "2", "--hidden-sizes", "8"]
    search = ["--search", "learning_rate=1e-4:3e-3:log", "ent_coef=0:0.05"]
    argv = ["pbt", "CartPole-v1", "--population", "4", "--interval", "2", *search, *flags]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    (run_dir,) = tmp_path.iterdir()
    names = {path.name for path in run_dir.iterdir()}
    assert {"config.json", "pbt.json", "metrics.csv", "pbt.csv", "pbt.png", "summary.json"} <= names
    _, metrics = folder.read_metrics(run_dir / folder.METRICS_FILE)
    finals = final_return(metrics["episode_return"])
    summary = folder.read_json(run_dir / folder.SUMMARY_FILE)
    assert summary["best_member"] == int(np.nanargmax(finals))
    np.testing.assert_allclose(summary["best_final_return"], np.nanmax(finals), rtol=1e-6)
    assert summary["num_updates"] == 6 and summary["timed_updates"] == 6
    assert summary["resumed_from_update"] is None and summary["versions"]["jax"]
    rows = (run_dir / "pbt.csv").read_text().splitlines()
    assert rows[0] == "member,interval,ent_coef,learning_rate,score,copied_from"
    assert len(rows) == 1 + 4 * 3  # 6 updates in intervals of 2
    assert f"best member {summary['best_member']}" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main(["pbt", "--interval", "2", "--search", "num_envs=2:8", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "fixes the program's shapes" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [run_dir]  # the refused search left no folder


@pytest.mark.heavy
def test_a_stopped_pbt_run_resumes_to_the_same_files(tmp_path, capsys):
    import shutil

    from ppojax.cli.commands import main
    from ppojax.runs import folder

    flags = ["--total-timesteps", "384", "--num-envs", "4", "--num-steps", "16"]
    flags += ["--update-epochs", "1", "--num-minibatches", "2", "--hidden-sizes", "8"]
    search = ["--search", "learning_rate=1e-4:3e-3:log", "ent_coef=0:0.05"]
    argv = ["pbt", "CartPole-v1", "--population", "4", "--interval", "2", *search, *flags]
    pieces = ["--checkpoint-every", "2", "--keep-checkpoints", "0", "--no-progress"]
    assert main([*argv, *pieces, "--out", str(tmp_path)]) == 0
    (run_dir,) = tmp_path.iterdir()
    assert sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir()) == [1, 2, 3]
    whole = {name: (run_dir / name).read_text() for name in ("metrics.csv", "pbt.csv")}
    best = folder.read_json(run_dir / folder.SUMMARY_FILE)["best_final_return"]
    # as if killed after the first interval: later checkpoints and the summary never written
    for step in ("2", "3"):
        shutil.rmtree(run_dir / "checkpoints" / step)
    (run_dir / folder.SUMMARY_FILE).unlink()
    capsys.readouterr()
    assert main(["pbt", "--resume", str(run_dir), "--no-progress"]) == 0
    assert f"final return {best:.1f}" in capsys.readouterr().out
    for name, text in whole.items():
        assert (run_dir / name).read_text() == text, name
    summary = folder.read_json(run_dir / folder.SUMMARY_FILE)
    assert summary["best_final_return"] == best
    # the updates of the first interval came from its checkpoint: 4 of the 6 trained here
    assert summary["resumed_from_update"] == 2 and summary["timed_updates"] == 4
    with pytest.raises(SystemExit):
        main(["pbt", "--resume", str(run_dir), "--interval", "2"])
    assert "drop --interval" in capsys.readouterr().err


@pytest.mark.heavy
def test_one_interval_is_the_vmapped_sweep_of_the_drawn_configs():
    """interval = num_updates: nobody is replaced, so PBT is ``vmap(train)`` over the drawn
    configurations and the member keys (benchmarks/pbt.py's random search relies on this).
    Both programs run the same float32 operations in the same order: equal bit for bit."""
    from ppojax.ppo.pbt import population_configs

    key = jax.random.key(3)
    out = jax.jit(
        functools.partial(ppojax.pbt, population=4, interval=TINY.num_updates, search=SEARCH)
    )(TINY, key)
    init_key, _, _ = jax.random.split(key, 3)
    configs = population_configs(TINY, {k: v[:, 0] for k, v in out.hyperparams.items()})
    sweep = jax.jit(jax.vmap(ppojax.train))(configs, jax.random.split(init_key, 4))
    np.testing.assert_array_equal(out.lineage, np.zeros((4, 1)) + np.arange(4)[:, None])
    for a, b in zip(jax.tree.leaves(out.metrics), jax.tree.leaves(sweep.metrics), strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(
        jax.tree.leaves(out.state.params), jax.tree.leaves(sweep.state.params), strict=True
    ):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    ("options", "error", "names"),
    [
        ({"tensorboard": True}, "ConfigError", "RunOptions.tensorboard"),
        (
            {"checkpoint_every": 3},
            "ValueError",
            "checkpoint_every=3 must be a multiple of interval",
        ),
    ],
)
def test_a_pbt_run_takes_run_options_and_names_one_it_cannot_honour(
    tmp_path, options, error, names
):
    """``run_pbt`` takes the ``RunOptions`` every driver takes; one a PBT run cannot honour is
    an error naming it, before the run folder is made."""
    from ppojax.checks import ConfigError
    from ppojax.runs.options import RunOptions
    from ppojax.runs.pbt_folder import run_pbt

    kind = {"ConfigError": ConfigError, "ValueError": ValueError}[error]
    with pytest.raises(kind, match=names):
        run_pbt(TINY, SEARCH, 4, 2, tmp_path / "pbt", options=RunOptions(**options))
    assert not (tmp_path / "pbt").exists()
