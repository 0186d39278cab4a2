"""KL estimates, rewards and advantages of PPO (token-level GAE), GRPO and RLOO.

Responses are rows [N, R] with a mask of real tokens; for GRPO and RLOO the N rows are
``N / G`` prompts times ``G = group_size`` samples, the samples of one prompt adjacent.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ppojax.engine import losses
from ppojax.engine.gae import compute_gae


def kl_estimate(log_probs: jax.Array, ref_log_probs: jax.Array, estimator: str) -> jax.Array:
    """Per-token KL(pi || pi_ref) estimate from samples of pi, any shape; log_rho = ref - pi:
    k1 = -log_rho;  k2 = 0.5 log_rho^2;  k3 = (rho - 1) - log_rho."""
    log_rho = ref_log_probs - log_probs
    if estimator == "k1":
        return -log_rho
    if estimator == "k2":
        return 0.5 * jnp.square(log_rho)
    return jnp.expm1(log_rho) - log_rho


def last_token(mask: jax.Array) -> jax.Array:
    """[N, R] float: 1 at the last real token of each response."""
    following = jnp.concatenate([mask[:, 1:], jnp.zeros_like(mask[:, :1])], axis=1)
    return (mask & ~following).astype(jnp.float32)


def token_rewards(
    scores: jax.Array, kl: jax.Array, mask: jax.Array, kl_coef: jax.Array | float
) -> jax.Array:
    """r_t = -beta * KL_t on real tokens plus the score [N] at the last real token; [N, R].
    With the KL in the loss, pass beta = 0."""
    return jnp.where(mask, -kl_coef * kl, 0.0) + scores[:, None] * last_token(mask)


def token_advantages(
    rewards: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    gamma: jax.Array | float,
    gae_lambda: jax.Array | float,
) -> tuple[jax.Array, jax.Array]:
    """Token-level GAE with ``compute_gae`` (time = response position), all [N, R]: every
    position at or after the last real token is terminal, so no value leaks past the end."""
    terminated = ~mask | last_token(mask).astype(bool)
    next_values = jnp.concatenate([values[:, 1:], jnp.zeros_like(values[:, :1])], axis=1)
    advantages, returns = compute_gae(
        rewards.T,
        values.T,
        next_values.T,
        terminated.T,
        jnp.zeros_like(terminated.T),
        gamma=gamma,
        gae_lambda=gae_lambda,
    )
    return advantages.T, returns.T


def group_advantages(
    rewards: jax.Array, group_size: int, divide_by_std: bool, eps: float = 1e-6
) -> jax.Array:
    """GRPO: (r_i - mean of its group) / (std of its group + eps) for rewards [N]; [N].
    The std is the population std (ddof 0); without ``divide_by_std`` (Dr. GRPO) only the
    mean is removed."""
    groups = rewards.reshape(-1, group_size)
    centered = groups - groups.mean(axis=1, keepdims=True)
    if divide_by_std:
        centered = centered / (groups.std(axis=1, keepdims=True) + eps)
    return centered.reshape(-1)


def leave_one_out_advantages(rewards: jax.Array, group_size: int) -> jax.Array:
    """RLOO: r_i - mean_{j != i} r_j over the other samples of the same prompt; [N]."""
    groups = rewards.reshape(-1, group_size)
    others = (groups.sum(axis=1, keepdims=True) - groups) / (group_size - 1)
    return (groups - others).reshape(-1)


def sequence_rewards(
    scores: jax.Array, kl: jax.Array, mask: jax.Array, kl_coef: jax.Array | float
) -> jax.Array:
    """score - beta * the sum of the KL [N, R] over the real tokens; [N]. The product is
    rounded to float32 before the subtraction in every program, so the one-turn trainer and
    the episode trainer give the same bits (see ``rounded``)."""
    return scores - rounded(kl_coef * jnp.where(mask, kl, 0.0).sum(axis=1))


def rounded(x: jax.Array) -> jax.Array:
    """``x`` itself, kept a rounded value: XLA's CPU backend contracts a product and the sum
    that reads it into one fused multiply-add (one rounding, not two) when both land in one
    fused loop, which differs between programs; an optimization barrier does not stop it, a
    select on the value does (NaN stays NaN)."""
    return jnp.where(jnp.isnan(x), jnp.nan, x)


def sequence_advantages(
    algorithm: str, rewards: jax.Array, group_size: int, divide_by_std: bool
) -> jax.Array:
    """The critic-free advantage [N] of each response: GRPO's or RLOO's."""
    if algorithm == "grpo":
        return group_advantages(rewards, group_size, divide_by_std)
    return leave_one_out_advantages(rewards, group_size)


def whiten(advantages: jax.Array, mask: jax.Array) -> jax.Array:
    """Advantages normalized over the real tokens (``engine.losses.normalize``), 0 elsewhere."""
    return jnp.where(mask, losses.normalize(advantages, mask), 0.0)


def update_kl_coef(
    kl_coef: jax.Array,
    kl: jax.Array,
    kl_target: jax.Array | float,
    horizon: jax.Array | float,
    batch_size: int,
) -> jax.Array:
    """Adaptive KL controller: e = clip(KL / target - 1, -0.2, 0.2); beta *= 1 + e * n / horizon."""
    error = jnp.clip(kl / kl_target - 1.0, -0.2, 0.2)
    return kl_coef * (1.0 + error * batch_size / horizon)
