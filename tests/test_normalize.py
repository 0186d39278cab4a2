import jax.numpy as jnp
import numpy as np

from ppojax.envs.normalize import (
    RewardNormalizer,
    RunningStats,
    normalize_obs,
    normalize_observation,
    normalize_reward,
    observation_stats,
    update_observation_stats,
    update_stats,
)


def test_running_stats_equal_the_statistics_of_everything_seen():
    rng = np.random.default_rng(0)
    batches = [rng.normal(loc=3.0, scale=2.0, size=(n, 3)) for n in (4, 7, 1, 16, 5)]
    stats = RunningStats.zeros((3,))
    for i, batch in enumerate(batches):
        stats = update_stats(stats, jnp.asarray(batch, jnp.float32))
        seen = np.concatenate(batches[: i + 1])
        np.testing.assert_allclose(stats.mean, seen.mean(axis=0), rtol=1e-5)
        np.testing.assert_allclose(stats.var, seen.var(axis=0), rtol=1e-4)
        assert float(stats.count) == len(seen)


def test_image_and_pytree_observations_are_normalized_per_element():
    rng = np.random.default_rng(1)
    images = [rng.normal(2.0, 3.0, size=(n, 3, 2, 4)) for n in (5, 3)]
    vectors = [rng.normal(-1.0, 0.5, size=(n, 2)) for n in (5, 3)]
    template = {"image": jnp.zeros((3, 2, 4)), "vector": jnp.zeros(2)}
    stats = observation_stats(template)
    assert stats["image"].mean.shape == (3, 2, 4) and stats["vector"].mean.shape == (2,)
    for image, vector in zip(images, vectors, strict=True):
        batch = {"image": jnp.asarray(image, jnp.float32), "vector": jnp.asarray(vector)}
        stats = update_observation_stats(stats, batch)
    seen = {"image": np.concatenate(images), "vector": np.concatenate(vectors)}
    normalized = normalize_observation(stats, batch, 10.0)
    for name, values in seen.items():
        np.testing.assert_allclose(stats[name].mean, values.mean(axis=0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(stats[name].var, values.var(axis=0), rtol=1e-4)
        want = (batch[name] - values.mean(0)) / np.sqrt(values.var(0) + 1e-8)
        np.testing.assert_allclose(normalized[name], want, rtol=1e-4, atol=1e-5)


def test_normalize_obs_standardizes_and_clips():
    stats = RunningStats(jnp.array([1.0, -2.0]), jnp.array([4.0, 0.25]), jnp.float32(10))
    obs = jnp.array([[3.0, -2.5], [1.0, 100.0]])
    np.testing.assert_allclose(
        normalize_obs(stats, obs, 10.0), [[1.0, -1.0], [0.0, 10.0]], rtol=1e-6
    )


def reward_normalizer_reference(rewards, dones, gamma):
    """Running std of the per-env discounted return, from the definition, in NumPy float64."""
    returns = np.zeros(rewards.shape[1])
    seen, scaled = [], []
    for reward, done in zip(rewards, dones, strict=True):
        returns = returns * gamma + reward
        seen.extend(returns)
        scaled.append(reward / np.sqrt(np.var(seen) + 1e-8))
        returns = np.where(done, 0.0, returns)
    return np.array(scaled)


def test_reward_normalization_matches_a_numpy_running_computation():
    rng = np.random.default_rng(1)
    rewards = rng.normal(loc=-5.0, scale=3.0, size=(30, 4))
    dones = rng.random((30, 4)) < 0.1
    normalizer = RewardNormalizer.zeros(4)
    scaled = []
    for reward, done in zip(rewards, dones, strict=True):
        out, normalizer = normalize_reward(
            normalizer, jnp.asarray(reward, jnp.float32), jnp.asarray(done), 0.9
        )
        scaled.append(out)
    expected = reward_normalizer_reference(rewards, dones, 0.9)
    np.testing.assert_allclose(np.array(scaled)[1:], expected[1:], rtol=1e-4)


def test_a_batch_with_nan_or_inf_is_left_out_of_the_statistics():
    stats = update_stats(RunningStats.zeros((2,)), jnp.array([[1.0, 2.0], [3.0, 4.0]]))
    for bad in (jnp.nan, jnp.inf):
        unchanged = update_stats(stats, jnp.array([[bad, 0.0], [5.0, 6.0]]))
        for name in ("mean", "var", "count"):
            np.testing.assert_array_equal(getattr(unchanged, name), getattr(stats, name))


def test_a_nan_reward_passes_through_but_leaves_the_normalizer_usable():
    """The NaN reaches the loss (where the update guard skips it) but neither the statistics
    nor the env's discounted return keep it, so later rewards scale as if it never came."""
    rewards = np.array([[1.0, 2.0], [np.nan, 1.0], [0.5, -1.0], [2.0, 0.0]], np.float32)
    normalizer = RewardNormalizer.zeros(2)
    scaled = []
    for reward in rewards:
        out, normalizer = normalize_reward(normalizer, jnp.asarray(reward), jnp.zeros(2, bool), 0.9)
        scaled.append(np.asarray(out))
    assert np.isnan(scaled[1][0]) and np.isfinite(scaled[1][1])
    assert np.isfinite(scaled[2]).all() and np.isfinite(scaled[3]).all()
    assert float(normalizer.return_stats.count) == 6  # the batch holding the NaN left out
    assert float(normalizer.discounted_return[0]) == np.float32(0.5 * 0.9 + 2.0)  # restarted
