"""PPO loss terms, each a small function of arrays of any shape.

Every term averages over all elements, or, given ``mask`` (1 = real sample, 0 = padding), over
the masked elements only, so padded tokens or steps never change a loss.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def masked_mean(values: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """sum(values * mask) / sum(mask); the plain mean when ``mask`` is None."""
    if mask is None:
        return values.mean()
    mask = mask.astype(values.dtype)
    return (values * mask).sum() / jnp.maximum(mask.sum(), 1.0)


def normalize(advantages: jax.Array, mask: jax.Array | None = None, eps: float = 1e-8) -> jax.Array:
    """(A - mean A) / (std A + eps), with mean and std over the masked elements."""
    mean = masked_mean(advantages, mask)
    std = jnp.sqrt(masked_mean(jnp.square(advantages - mean), mask))
    return (advantages - mean) / (std + eps)


def clipped_surrogate_loss(
    log_ratio: jax.Array,
    advantages: jax.Array,
    clip_eps: float | jax.Array,
    mask: jax.Array | None = None,
) -> jax.Array:
    """-E[min(r A, clip(r, 1 - eps, 1 + eps) A)] with r = exp(log_ratio): PPO-Clip, minimized."""
    return -masked_mean(clipped_objective(log_ratio, advantages, clip_eps, clip_eps), mask)


def clipped_objective(
    log_ratio: jax.Array,
    advantages: jax.Array,
    clip_low: float | jax.Array,
    clip_high: float | jax.Array,
) -> jax.Array:
    """Per element min(r A, clip(r, 1 - clip_low, 1 + clip_high) A), r = exp(log_ratio); the
    clip may be asymmetric (DAPO's clip-higher)."""
    ratio = jnp.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    return jnp.minimum(unclipped, clipped)


def unclipped_surrogate_loss(
    log_ratio: jax.Array, advantages: jax.Array, mask: jax.Array | None = None
) -> jax.Array:
    """-E[r A]: the plain importance-weighted policy-gradient surrogate, minimized."""
    return -masked_mean(jnp.exp(log_ratio) * advantages, mask)


def kl_penalty(
    kl: jax.Array, kl_coef: float | jax.Array, mask: jax.Array | None = None
) -> jax.Array:
    """beta E[KL(pi_old || pi)]: PPO-Penalty's term, added to the minimized surrogate."""
    return kl_coef * masked_mean(kl, mask)


def value_loss(
    values: jax.Array,
    old_values: jax.Array,
    targets: jax.Array,
    vf_clip_eps: float | jax.Array | None,
    mask: jax.Array | None = None,
) -> jax.Array:
    """0.5 E[(V - target)^2]; with vf_clip_eps, 0.5 E[max((V - t)^2, (V_clip - t)^2)] where
    V_clip = old_V + clip(V - old_V, -vf_clip_eps, vf_clip_eps)."""
    squared = jnp.square(values - targets)
    if vf_clip_eps is not None:
        clipped_values = old_values + jnp.clip(values - old_values, -vf_clip_eps, vf_clip_eps)
        squared = jnp.maximum(squared, jnp.square(clipped_values - targets))
    return 0.5 * masked_mean(squared, mask)


def entropy_bonus(entropy: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """H = E[entropy of the policy]."""
    return masked_mean(entropy, mask)


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


def approx_kl(log_ratio: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """E[(r - 1) - log r]: a low-variance, non-negative estimate of KL(pi_old || pi)."""
    return masked_mean(jnp.expm1(log_ratio) - log_ratio, mask)


def clip_fraction(
    log_ratio: jax.Array, clip_eps: float | jax.Array, mask: jax.Array | None = None
) -> jax.Array:
    """Fraction of samples whose ratio lies outside [1 - eps, 1 + eps]."""
    outside = (jnp.abs(jnp.exp(log_ratio) - 1.0) > clip_eps).astype(jnp.float32)
    return masked_mean(outside, mask)


def explained_variance(
    predictions: jax.Array, targets: jax.Array, mask: jax.Array | None = None
) -> jax.Array:
    """1 - Var(targets - predictions) / Var(targets); NaN when the targets are constant."""

    def variance(x: jax.Array) -> jax.Array:
        return masked_mean(jnp.square(x - masked_mean(x, mask)), mask)

    target_var = variance(targets)
    safe = jnp.where(target_var > 0, target_var, 1.0)
    return jnp.where(target_var > 0, 1.0 - variance(targets - predictions) / safe, jnp.nan)
