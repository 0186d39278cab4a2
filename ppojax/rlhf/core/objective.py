"""The loss of one RLHF minibatch: clipped surrogate (asymmetric clip), KL in the loss when
asked, entropy, and for PPO the clipped value loss; aggregated per token or per sequence."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp

from ppojax.engine import losses
from ppojax.rlhf.core.aggregation import aggregate
from ppojax.rlhf.core.config import RLHFConfig
from ppojax.rlhf.core.kl import loss_penalty
from ppojax.rlhf.core.sampling import PolicyApply, TokenStats


class LossParts(NamedTuple):
    """What the loss needs besides the minibatch: the models, the coefficients of this step."""

    policy_apply: PolicyApply
    critic_apply: Callable[[Any, jax.Array, jax.Array], jax.Array] | None
    policy_params: Callable[[dict], Any]  # trained params -> the policy's full params
    kl_coef: jax.Array
    policy_on: jax.Array  # 0.0 during critic warm-up, else 1.0


def clipped_policy_loss(
    config: RLHFConfig,
    kl_coef: jax.Array,
    log_probs: jax.Array,
    entropy: jax.Array,
    batch_log_probs: jax.Array,
    ref_log_probs: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """-clipped surrogate (+ beta KL with kl_in="loss") - ent_coef H over the tokens of
    ``mask`` (all arrays [B, L]: the new log-probs and entropy, the sampled log-probs, the
    reference's, the advantages), aggregated by ``config.loss_aggregation``; and its metrics.
    """
    log_ratio = jnp.where(mask, log_probs - batch_log_probs, 0.0)
    per_token = -losses.clipped_objective(
        log_ratio, advantages, config.clip_eps, config.upper_clip_eps
    )
    penalty = loss_penalty(config, kl_coef, log_probs, ref_log_probs)
    if penalty is not None:
        per_token = per_token + penalty
    policy_loss = aggregate(per_token, mask, config.loss_aggregation)
    mean_entropy = losses.entropy_bonus(entropy, mask)
    ratio = jnp.exp(log_ratio)
    clipped = (ratio < 1.0 - config.clip_eps) | (ratio > 1.0 + config.upper_clip_eps)
    metrics = {
        "loss/policy_avg": policy_loss,
        "policy/entropy_avg": mean_entropy,
        "policy/approxkl_avg": jax.lax.stop_gradient(losses.approx_kl(log_ratio, mask)),
        "policy/clipfrac_avg": losses.masked_mean(clipped.astype(jnp.float32), mask),
        "val/ratio": jax.lax.stop_gradient(losses.masked_mean(ratio, mask)),
    }
    return policy_loss - config.ent_coef * mean_entropy, metrics


class Targets(Protocol):
    """What a minibatch holds for the loss beside its tokens ([N, X] each: X the response's
    positions, or an episode's slots): the sampling policy's and the reference's log-probs,
    the advantages, the critic's values at sampling time and the returns."""

    log_probs: jax.Array
    ref_log_probs: jax.Array
    advantages: jax.Array
    values: jax.Array
    returns: jax.Array


def assemble_loss(
    config: RLHFConfig,
    parts: LossParts,
    params: dict,
    stats: TokenStats,
    batch: Targets,
    mask: jax.Array,
    critic_values: Callable[[Any], jax.Array],
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The loss of a minibatch from the policy's ``stats`` over the tokens of
    ``mask``: policy_on * ``clipped_policy_loss``, plus for PPO (``parts.critic_apply``)
    vf_coef * the clipped value loss of ``critic_values(critic params)`` (the critic's own
    params, or the policy's when the critic is a value head on it); and its metrics."""
    loss, metrics = clipped_policy_loss(
        config,
        parts.kl_coef,
        stats.log_probs,
        stats.entropy,
        batch.log_probs,
        batch.ref_log_probs,
        batch.advantages,
        mask,
    )
    total = parts.policy_on * loss
    if parts.critic_apply is None:
        return total, metrics
    critic_params = params["critic"] if "critic" in params else parts.policy_params(params)
    values = critic_values(critic_params)
    value_loss = losses.value_loss(values, batch.values, batch.returns, config.vf_clip_eps, mask)
    return total + config.vf_coef * value_loss, {**metrics, "loss/value_avg": value_loss}
