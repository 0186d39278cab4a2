"""ppojax.ppo.summary: the one definition of a run's final return, its latest evaluation and a
grid's points, against hand-computed values."""

import numpy as np
import pytest

from ppojax.ppo.summary import final_return, grid_points, latest_finite, point_label


def test_final_return_is_the_mean_of_the_finite_values_of_the_last_window():
    returns = np.array([[np.nan, 2.0, np.nan, 4.0, 6.0], [1.0, 1.0, 1.0, np.nan, np.nan]])
    np.testing.assert_allclose(final_return(returns, last=3), [5.0, 1.0])
    np.testing.assert_allclose(final_return(returns, last=2), [5.0, np.nan])
    np.testing.assert_allclose(final_return(np.arange(20.0)), np.mean(np.arange(10.0, 20.0)))
    assert final_return(returns).shape == (2,)


def test_latest_finite_is_the_last_evaluation():
    evals = np.array([[np.nan, 3.0, np.nan, 7.0, np.nan], [np.nan] * 5])
    np.testing.assert_allclose(latest_finite(evals), [7.0, np.nan])
    np.testing.assert_allclose(latest_finite(evals[0]), 7.0)


def test_grid_points_product_zip_and_label():
    grid = {"learning_rate": (1e-3, 3e-4), "clip_eps": (0.1, 0.2, 0.3)}
    points = grid_points(grid)
    assert len(points) == 6 and points[1] == {"learning_rate": 1e-3, "clip_eps": 0.2}
    assert grid_points({}) == [{}]
    zipped = grid_points({"learning_rate": (1e-3, 3e-4), "gamma": (0.9, 0.99)}, zipped=True)
    assert zipped == [{"learning_rate": 1e-3, "gamma": 0.9}, {"learning_rate": 3e-4, "gamma": 0.99}]
    with pytest.raises(ValueError, match="equally long"):
        grid_points({"learning_rate": (1e-3,), "gamma": (0.9, 0.99)}, zipped=True)
    assert point_label(points[1]) == "learning_rate=0.001, clip_eps=0.2"
    assert point_label({}) == ""
