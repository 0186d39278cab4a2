"""Running statistics for observation and reward normalization (pure functions).

Statistics are shared over all environments and merged batch by batch with the parallel
variance formula (Chan et al.), so the result equals the mean and variance of everything seen.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class RunningStats:
    """Mean and (population) variance of all samples seen so far, and their count."""

    mean: jax.Array
    var: jax.Array
    count: jax.Array

    @classmethod
    def zeros(cls, shape: tuple[int, ...] = ()) -> RunningStats:
        return cls(jnp.zeros(shape), jnp.ones(shape), jnp.float32(0.0))


def update_stats(stats: RunningStats, batch: jax.Array) -> RunningStats:
    """Merge ``batch`` [N, *shape] into ``stats``:
    mean' = mean + d n/(c + n), M2' = var c + var_b n + d^2 c n/(c + n), with d = mean_b - mean.

    A batch holding a NaN or inf is left out (``stats`` returned unchanged): merged in, it
    would turn the statistics, and every normalized value after it, into NaN for good."""
    batch_count = batch.shape[0]
    batch_mean = batch.mean(axis=0)
    batch_var = batch.var(axis=0)
    delta = batch_mean - stats.mean
    total = stats.count + batch_count
    mean = stats.mean + delta * batch_count / total
    m2 = stats.var * stats.count + batch_var * batch_count
    m2 = m2 + jnp.square(delta) * stats.count * batch_count / total
    merged = RunningStats(mean, m2 / total, total)
    finite = jnp.isfinite(batch).all()
    return jax.tree.map(lambda new, old: jnp.where(finite, new, old), merged, stats)


def normalize_obs(
    stats: RunningStats, obs: jax.Array, clip: float | jax.Array, eps: float = 1e-8
) -> jax.Array:
    """clip((obs - mean) / sqrt(var + eps), -clip, clip)."""
    return jnp.clip((obs - stats.mean) / jnp.sqrt(stats.var + eps), -clip, clip)


@struct.dataclass
class RewardNormalizer:
    """Scales rewards by the running std of the discounted return of each env."""

    return_stats: RunningStats
    discounted_return: jax.Array  # [B], per env, reset at episode ends

    @classmethod
    def zeros(cls, num_envs: int) -> RewardNormalizer:
        return cls(RunningStats.zeros(), jnp.zeros((num_envs,)))


def normalize_reward(
    normalizer: RewardNormalizer,
    reward: jax.Array,
    done: jax.Array,
    gamma: float | jax.Array,
    eps: float = 1e-8,
) -> tuple[jax.Array, RewardNormalizer]:
    """reward [B] / sqrt(Var[G] + eps) with G_t = gamma G_{t-1} + r_t per env (G = 0 after an
    episode ends); the statistics of G include this step's returns. A NaN or inf reward stays
    in the scaled reward (the update guard then skips the update it reaches) but restarts that
    env's G at 0 and is left out of the statistics, so later rewards scale normally."""
    discounted = normalizer.discounted_return * gamma + reward
    stats = update_stats(normalizer.return_stats, discounted)
    scaled = reward / jnp.sqrt(stats.var + eps)
    restart = jnp.logical_or(done, ~jnp.isfinite(discounted))
    return scaled, RewardNormalizer(stats, jnp.where(restart, 0.0, discounted))


def _is_stats(node: object) -> bool:
    return isinstance(node, RunningStats)


def observation_stats(observation: Any) -> Any:
    """Fresh statistics for observations like ``observation`` (one env's, any pytree of
    arrays or shapes): one ``RunningStats`` of the leaf's shape ([H, W, C] for images) per
    leaf, so every element of the observation is normalized on its own."""
    return jax.tree.map(lambda leaf: RunningStats.zeros(tuple(leaf.shape)), observation)


def update_observation_stats(stats: Any, obs: Any) -> Any:
    """``update_stats`` of every leaf's statistics with that leaf's batch [N, ...]."""
    return jax.tree.map(update_stats, stats, obs, is_leaf=_is_stats)


def normalize_observation(stats: Any, obs: Any, clip: float | jax.Array) -> Any:
    """``normalize_obs`` of every leaf of ``obs`` with its own statistics."""
    return jax.tree.map(lambda s, x: normalize_obs(s, x, clip), stats, obs, is_leaf=_is_stats)
