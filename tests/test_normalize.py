import jax.numpy as jnp
import numpy as np

from ppojax.envs.normalize import (
    RewardNormalizer,
    RunningStats,
    normalize_obs,
    normalize_reward,
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
