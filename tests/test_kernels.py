"""ppojax.runtime.kernels: the stand-in computes what its plain form computes, and ``plain()``
really swaps the plain form in."""

import jax
import numpy as np
import pytest
from tolerance import assert_close

import ppojax
from ppojax.runtime import kernels


def test_plain_switches_the_stand_ins_off_and_back():
    with kernels.plain():
        assert not kernels.stand_ins_on() and not kernels.stand_in("noise")
    assert kernels.stand_ins_on()
    with kernels.plain("noise"):
        assert not kernels.stand_in("noise")
    with pytest.raises(ValueError, match="no stand-in named"):
        with kernels.plain("permutation"):
            pass


def test_scan_drawing_draws_ahead_or_per_step():
    def draw(key, steps):
        return {"u": jax.random.uniform(key, (steps, 3))}

    def step(total, noise):
        return total + noise["u"].sum(), noise["u"]

    key = jax.random.key(2)
    total, drawn = kernels.scan_drawing(step, 0.0, key, draw, 5)
    np.testing.assert_array_equal(drawn, draw(key, 5)["u"])  # all five drawn at once
    with kernels.plain():
        plain_total, per_step = kernels.scan_drawing(step, 0.0, key, draw, 5)
    step_keys = jax.random.split(key, 5)
    for i in range(5):  # each step drew its own, from its own key
        np.testing.assert_array_equal(per_step[i], draw(step_keys[i], 1)["u"][0])
    # 15 uniforms summed in another order: a few ulps of the total (~7.5)
    assert_close(plain_total, per_step.sum(), ulps=8, scale=8.0)
    assert_close(total, drawn.sum(), ulps=8, scale=8.0)


@pytest.mark.parametrize("reset_pool", [None, 2])
def test_rollouts_with_per_step_draws_run_and_restart_episodes(tiny_config, reset_pool):
    config = tiny_config.replace(reset_pool=reset_pool)
    with kernels.plain():
        out = jax.jit(lambda c, k: ppojax.train(c, k))(config, jax.random.key(1))
    finished = np.asarray(out.metrics["episodes_finished"])
    assert finished.sum() >= 3  # 192 steps of a random CartPole policy: episodes of ~20 steps
    returns = np.asarray(out.metrics["episode_return"])[finished > 0]
    assert np.isfinite(returns).all() and (returns >= 1).all()
