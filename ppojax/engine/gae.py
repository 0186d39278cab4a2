"""Truncation-aware generalised advantage estimation, time-major [T, B]."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def compute_gae(
    rewards: jax.Array,
    values: jax.Array,
    next_values: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    *,
    gamma: float | jax.Array,
    gae_lambda: float | jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """Advantages and returns, all [T, B].

    ``next_values[t]`` is V of the true next observation (the final observation where the
    episode ended at t), so truncation bootstraps from it and termination does not:

        delta_t = r_t + gamma * (1 - terminated_t) * next_values_t - values_t
        A_t = delta_t + gamma * gae_lambda * (1 - done_t) * A_{t+1},  done = terminated | truncated
        returns = A + values
    """
    not_terminated = 1.0 - terminated.astype(rewards.dtype)
    not_done = 1.0 - jnp.logical_or(terminated, truncated).astype(rewards.dtype)
    deltas = rewards + gamma * not_terminated * next_values - values
    decays = gamma * gae_lambda * not_done

    def backward(carry: jax.Array, step: tuple[jax.Array, jax.Array]):
        delta, decay = step
        advantage = delta + decay * carry
        return advantage, advantage

    _, advantages = jax.lax.scan(
        backward, jnp.zeros_like(deltas[0]), (deltas, decays), reverse=True
    )
    return advantages, advantages + values
