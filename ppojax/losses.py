"""PPO loss terms, each a small function of arrays of any shape (mean over all elements)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def normalize(advantages: jax.Array, eps: float = 1e-8) -> jax.Array:
    """(A - mean A) / (std A + eps)."""
    return (advantages - advantages.mean()) / (advantages.std() + eps)


def clipped_surrogate_loss(
    log_ratio: jax.Array, advantages: jax.Array, clip_eps: float | jax.Array
) -> jax.Array:
    """-E[min(r A, clip(r, 1 - eps, 1 + eps) A)] with r = exp(log_ratio): PPO-Clip, minimized."""
    ratio = jnp.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    return -jnp.minimum(unclipped, clipped).mean()


def value_loss(
    values: jax.Array,
    old_values: jax.Array,
    targets: jax.Array,
    vf_clip_eps: float | jax.Array | None,
) -> jax.Array:
    """0.5 E[(V - target)^2]; with vf_clip_eps, 0.5 E[max((V - t)^2, (V_clip - t)^2)] where
    V_clip = old_V + clip(V - old_V, -vf_clip_eps, vf_clip_eps)."""
    squared = jnp.square(values - targets)
    if vf_clip_eps is None:
        return 0.5 * squared.mean()
    clipped_values = old_values + jnp.clip(values - old_values, -vf_clip_eps, vf_clip_eps)
    return 0.5 * jnp.maximum(squared, jnp.square(clipped_values - targets)).mean()


def entropy_bonus(entropy: jax.Array) -> jax.Array:
    """H = E[entropy of the policy]."""
    return entropy.mean()


def total_loss(
    policy_loss: jax.Array,
    value_loss_: jax.Array,
    entropy: jax.Array,
    *,
    vf_coef: float | jax.Array,
    ent_coef: float | jax.Array,
) -> jax.Array:
    """-L_clip + vf_coef * L_value - ent_coef * H (``policy_loss`` is already -L_clip)."""
    return policy_loss + vf_coef * value_loss_ - ent_coef * entropy


def approx_kl(log_ratio: jax.Array) -> jax.Array:
    """E[(r - 1) - log r]: a low-variance, non-negative estimate of KL(pi_old || pi)."""
    return (jnp.expm1(log_ratio) - log_ratio).mean()


def clip_fraction(log_ratio: jax.Array, clip_eps: float | jax.Array) -> jax.Array:
    """Fraction of samples whose ratio lies outside [1 - eps, 1 + eps]."""
    return (jnp.abs(jnp.exp(log_ratio) - 1.0) > clip_eps).astype(jnp.float32).mean()


def explained_variance(predictions: jax.Array, targets: jax.Array) -> jax.Array:
    """1 - Var(targets - predictions) / Var(targets); NaN when the targets are constant."""
    target_var = targets.var()
    return jnp.where(target_var > 0, 1.0 - (targets - predictions).var() / target_var, jnp.nan)
