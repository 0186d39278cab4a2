"""Env PPO's advantage estimators, time-major [T, B], truncation-aware: generalised advantage
estimation (the default) and Monte-Carlo returns, in a registry that ``PPOConfig``'s
``advantage_estimator`` names (``ADVANTAGE_ESTIMATORS``)."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from ppojax.runtime import kernels


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

    The recurrence is ``reverse_scan`` (T steps in order), or in programs lowered for CUDA
    ``associative_reverse_scan`` (the kernels candidate "associative_gae", a CUDA default).
    """
    not_terminated = 1.0 - terminated.astype(rewards.dtype)
    not_done = 1.0 - jnp.logical_or(terminated, truncated).astype(rewards.dtype)
    deltas = rewards + gamma * not_terminated * next_values - values
    decays = gamma * gae_lambda * not_done
    recurrence = kernels.by_platform("associative_gae", reverse_scan, associative_reverse_scan)
    advantages = recurrence(deltas, decays)
    return advantages, advantages + values


def reverse_scan(deltas: jax.Array, decays: jax.Array) -> jax.Array:
    """A [T, ...] with A_t = deltas_t + decays_t * A_{t+1} and A_T = 0, one step at a time
    from the last: the reference form."""

    def backward(carry: jax.Array, step: tuple[jax.Array, jax.Array]):
        delta, decay = step
        advantage = delta + decay * carry
        return advantage, advantage

    _, advantages = jax.lax.scan(
        backward, jnp.zeros_like(deltas[0]), (deltas, decays), reverse=True
    )
    return advantages


def associative_reverse_scan(deltas: jax.Array, decays: jax.Array) -> jax.Array:
    """``reverse_scan``'s A in log2(T) levels of ``jax.lax.associative_scan``: step t is the
    map x -> deltas_t + decays_t * x, A_t is the maps t, t+1, ..., T-1 composed, applied to 0.
    The same sum of products, added in another order (a tree instead of a chain)."""

    def compose(later: tuple[jax.Array, jax.Array], earlier: tuple[jax.Array, jax.Array]):
        # ``later`` composes the steps after ``earlier``'s: earlier(later(x))
        later_decay, later_delta = later
        decay, delta = earlier
        return decay * later_decay, delta + decay * later_delta

    _, advantages = jax.lax.associative_scan(compose, (decays, deltas), reverse=True)
    return advantages


# the registry's signature, compute_gae's, on three lines: the two share an API, not code
def monte_carlo_advantages(
    rewards: jax.Array, values: jax.Array, next_values: jax.Array, terminated: jax.Array,
    truncated: jax.Array, *, gamma: float | jax.Array, gae_lambda: float | jax.Array,
) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """Advantages G - values and returns G, all [T, B], from the rewards actually received
    (``gae_lambda`` is unused):

        G_t = r_t + gamma * (1 - terminated_t) * (next_values_t if done_t or t = T - 1
                                                  else G_{t+1})

    The value function enters only where an episode leaves the rollout, truncated or cut by
    its end: an unbiased return of higher variance than GAE's (GAE with lambda 1 where
    ``next_values_t`` is V(obs_{t+1}), as in a rollout).

    G is ``compute_gae``'s A with lambda 1 over values 0, the episode cut at every done step
    and at the rollout's end, and next_values read only there: the same recurrence."""
    cut = jnp.logical_or(terminated, truncated).at[-1].set(True)
    bootstrap = jnp.where(cut, next_values, jnp.zeros_like(next_values))
    returns, _ = compute_gae(
        rewards, jnp.zeros_like(values), bootstrap, terminated, cut, gamma=gamma, gae_lambda=1.0
    )
    return returns - values, returns


AdvantageEstimator = Callable[..., tuple[jax.Array, jax.Array]]

# Name -> estimator: (rewards, values, next_values, terminated, truncated, *, gamma,
# gae_lambda) -> (advantages, returns), all [T, B]. ``PPOConfig.advantage_estimator`` names
# one; a new entry here is a new name the config accepts.
ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {
    "gae": compute_gae,
    "monte_carlo": monte_carlo_advantages,
}
