import chex
import jax
import numpy as np
import pytest
from tolerance import TRAINING_ULPS, assert_close

import ppojax
from ppojax.ppo import sweeps as sweep_module
from ppojax.ppo.sweeps import best_point, format_table, grid_arrays, sweep, sweep_table


@pytest.fixture(scope="module")
def small_sweep(tiny_config):
    keys = jax.random.split(jax.random.key(0), 2)
    out = sweep(tiny_config, keys, learning_rate=[1e-3, 3e-4], clip_eps=[0.1, 0.3])
    return keys, out


def test_sweep_has_point_and_seed_axes_and_carries_its_grid(tiny_config, small_sweep):
    _, out = small_sweep
    for name in ppojax.METRIC_NAMES:
        chex.assert_shape(out.metrics[name], (4, 2, tiny_config.num_updates))
    for leaf in jax.tree.leaves(out.state.params):
        assert leaf.shape[:2] == (4, 2)
    np.testing.assert_allclose(out.grid["learning_rate"], [1e-3, 1e-3, 3e-4, 3e-4])
    np.testing.assert_allclose(out.grid["clip_eps"], [0.1, 0.3, 0.1, 0.3])


def test_every_point_equals_a_separate_train_call(tiny_config, tiny_train, small_sweep):
    keys, out = small_sweep
    for point in range(4):
        config = tiny_config.replace(
            learning_rate=float(out.grid["learning_rate"][point]),
            clip_eps=float(out.grid["clip_eps"][point]),
        )
        for seed in range(2):
            single = tiny_train(config, keys[seed])
            # vmap(vmap(train)) with traced hyperparameters against train with constants: two
            # programs, so ulps of the per-sample terms (order 1; approx_kl and the policy loss
            # are means of such terms lying near zero), as in test_train's vmap test.
            for name in ("policy_loss", "value_loss", "approx_kl", "episode_return"):
                assert_close(
                    out.metrics[name][point, seed],
                    single.metrics[name],
                    ulps=TRAINING_ULPS,
                    err_msg=f"{name} point {point} seed {seed}",
                )
    # and the points differ from each other
    assert not np.allclose(out.metrics["policy_loss"][0], out.metrics["policy_loss"][3])


def test_sweep_traces_once_for_new_values(tiny_config, monkeypatch):
    traced = jax.jit(chex.assert_max_traces(sweep_module._train_grid, n=1))
    monkeypatch.setattr(sweep_module, "train_grid", traced)
    keys = jax.random.split(jax.random.key(1), 2)
    sweep(tiny_config, keys, learning_rate=[1e-3, 2e-3], clip_eps=[0.1, 0.2])
    sweep(tiny_config, keys, learning_rate=[5e-4, 1e-4], clip_eps=[0.3, 0.25])
    chex.clear_trace_counter()


def test_grid_points_product_and_zip(tiny_config):
    product = grid_arrays(tiny_config, {"learning_rate": [1e-3, 2e-3], "gamma": [0.9, 0.99, 1.0]})
    assert len(product["learning_rate"]) == 6
    np.testing.assert_allclose(product["gamma"], [0.9, 0.99, 1.0] * 2, rtol=1e-6)
    zipped = grid_arrays(
        tiny_config, {"learning_rate": [1e-3, 2e-3], "gamma": [0.9, 0.99]}, zipped=True
    )
    np.testing.assert_allclose(zipped["learning_rate"], [1e-3, 2e-3])
    np.testing.assert_allclose(zipped["gamma"], [0.9, 0.99], rtol=1e-6)


@pytest.mark.parametrize(
    "grid,zipped,message",
    [
        ({"num_envs": [4, 8]}, False, "cannot be swept with vmap"),
        ({"learning_rat": [1e-3]}, False, "Did you mean learning_rate"),
        ({"learning_rate": [1e-3, -1.0]}, False, "PPOConfig.learning_rate"),
        ({"learning_rate": []}, False, "one or more numbers"),
        ({"learning_rate": [1e-3, 2e-3], "gamma": [0.9]}, True, "equally long"),
    ],
)
def test_bad_grids_are_clear_errors(tiny_config, grid, zipped, message):
    with pytest.raises(ValueError, match=message):
        grid_arrays(tiny_config, grid, zipped=zipped)


def test_best_point_breaks_ties_by_the_other_metric():
    returns = np.array([[[10.0, 10.0]], [[5.0, 10.0]], [[0.0, 10.0]]])  # [points, seeds=1, U]
    out = ppojax.SweepOutput(None, {"episode_return": returns}, {"lr": np.array([1.0, 2.0, 3.0])})
    best = best_point(out, last=1)
    assert best["point"] == 0 and best["lr"] == 1.0 and best["auc"] == 10.0


def test_table_has_one_row_per_point_and_seed_and_best_point_is_the_max(small_sweep):
    _, out = small_sweep
    rows = sweep_table(out, last=2)
    assert len(rows) == 8
    assert set(rows[0]) == {"point", "seed", "learning_rate", "clip_eps", "final_return", "auc"}
    returns = np.asarray(out.metrics["episode_return"])
    np.testing.assert_allclose(rows[3]["final_return"], np.nanmean(returns[1, 1, -2:]))
    np.testing.assert_allclose(rows[3]["auc"], np.nanmean(returns[1, 1]))
    best = best_point(out, last=2)
    means = [np.mean([r["final_return"] for r in rows if r["point"] == p]) for p in range(4)]
    assert best["point"] == int(np.argmax(means))
    np.testing.assert_allclose(best["final_return"], max(means))
    by_auc = best_point(out, metric="auc")
    aucs = [np.mean([r["auc"] for r in rows if r["point"] == p]) for p in range(4)]
    assert by_auc["point"] == int(np.argmax(aucs))
    text = format_table(rows)
    assert text.count("\n") == 9 and "final_return" in text
