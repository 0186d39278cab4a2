"""The rollout of one RLHF step: sample, score, KL to the reference, advantages, metrics."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ppojax.engine import losses
from ppojax.rlhf.core import advantages as adv
from ppojax.rlhf.core.config import RLHFConfig
from ppojax.rlhf.core.kl import kl_estimate, reward_coef
from ppojax.rlhf.core.logprobs import policy_stats
from ppojax.rlhf.core.objective import RLHFBatch
from ppojax.rlhf.core.sampling import (
    KVCacheHook,
    PolicyApply,
    Samples,
    SamplingSettings,
    Sequences,
    response_values,
    sample_responses,
)


class Roles(NamedTuple):
    """The models one RLHF step runs, by role: the policy ``(params, tokens, mask) -> logits
    [B, L, V]``, the critic ``(params, tokens, mask) -> values [B, L]`` (None without one) and
    the policy's fast sampler (None: every token recomputes the whole sequence). Their params
    live in the state."""

    policy: PolicyApply
    critic: Callable[[Any, jax.Array, jax.Array], jax.Array] | None
    kv_cache: KVCacheHook | None


class Rollout(NamedTuple):
    """The update's batch [N, ...] and what the step logs about it."""

    batch: RLHFBatch
    rewards: jax.Array  # [num_reward_fns, N], unweighted
    scores: jax.Array  # [N]: weighted sum, minus missing_eos_penalty
    kl: jax.Array  # [N, R]: k1 log pi - log pi_ref on real tokens, 0 elsewhere
    penalty_kl: jax.Array  # [N, R]: config.kl_estimator's estimate on real tokens
    entropy: jax.Array  # [N, R]: of the sampling policy
    emitted_eos: jax.Array  # [N] bool


def sample(
    config: RLHFConfig,
    policy_apply: PolicyApply,
    kv_cache: KVCacheHook | None,
    params: Any,
    prompts: jax.Array,
    prompt_mask: jax.Array,
    key: jax.Array,
) -> Samples:
    """Responses [N, R] to prompts [B, P], ``config.group_size`` a prompt (N = B * group
    size), from the model's KV-cache hook if it has one (one prefill a prompt), else by
    recomputation."""
    settings = SamplingSettings(
        config.response_len, config.temperature, config.pad_id, config.eos_id
    )
    model = policy_apply if kv_cache is None else kv_cache
    return sample_responses(model, params, prompts, prompt_mask, key, settings, config.group_size)


def score(
    config: RLHFConfig, reward_fns: tuple[Callable[..., jax.Array], ...], sequences: Sequences
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Unweighted rewards [F, N], the weighted score minus the missing-EOS penalty [N], and
    which responses emitted EOS [N]."""
    rewards = jnp.stack([reward_column(fn, sequences) for fn in reward_fns])
    weights = config.reward_weights or (1.0,) * len(reward_fns)
    emitted_eos = ((sequences.responses == config.eos_id) & sequences.response_mask).any(axis=1)
    penalty = jnp.where(emitted_eos, 0.0, config.missing_eos_penalty)
    return rewards, jnp.asarray(weights, jnp.float32) @ rewards - penalty, emitted_eos


def reward_column(fn: Callable[..., jax.Array], sequences: Sequences) -> jax.Array:
    """``fn``'s rewards [N] as float32, ``fn`` called with the four arrays of ``sequences``
    (the reward contract); a ``ValueError`` naming ``fn`` at trace time for any other shape
    (a scalar would be broadcast to every response)."""
    rewards = jnp.asarray(fn(*sequences), jnp.float32)
    rows = sequences.responses.shape[0]
    if rewards.shape != (rows,):
        name = getattr(fn, "__name__", repr(fn))
        raise ValueError(
            f"reward function {name} returned an array of shape {rewards.shape}; it must "
            f"return one reward per response, shape [B] = ({rows},)"
        )
    return rewards


def advantages_and_returns(
    config: RLHFConfig,
    scores: jax.Array,
    penalty_kl: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    kl_coef: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """[N, R] each. PPO: GAE of r_t = -beta KL_t (kl_in="reward") + score at the end, then
    whitened when asked. GRPO / RLOO: the sequence advantage of score - beta sum_t KL_t (or of
    the score alone with kl_in="loss") on every real token; returns are unused (0)."""
    beta = reward_coef(config, kl_coef)
    if config.needs_critic:
        rewards = adv.token_rewards(scores, penalty_kl, mask, beta)
        advantages, returns = adv.token_advantages(
            rewards, values, mask, config.gamma, config.gae_lambda
        )
        if config.whiten_advantages:
            advantages = adv.whiten(advantages, mask)
        return jnp.where(mask, advantages, 0.0), returns
    advantages = critic_free_advantages(config, scores, penalty_kl, mask, kl_coef)
    return advantages, jnp.zeros_like(values)


def critic_free_advantages(
    config: RLHFConfig,
    scores: jax.Array,
    penalty_kl: jax.Array,
    mask: jax.Array,
    kl_coef: jax.Array,
) -> jax.Array:
    """[N, X]: GRPO's or RLOO's group advantage [N] of score - beta * the sum of the KL
    [N, X] over the real tokens (beta = 0 with kl_in="loss"), on every real token, 0
    elsewhere; X is a response's positions, or an episode's columns or slots (the episode
    trainer calls this too, so a one-turn episode gets the same bits)."""
    beta = reward_coef(config, kl_coef)
    rewards = adv.sequence_rewards(scores, penalty_kl, mask, beta)
    per_row = adv.sequence_advantages(
        config.algorithm, rewards, config.group_size, config.group_std
    )
    return jnp.where(mask, per_row[:, None], 0.0)


def collect(
    config: RLHFConfig,
    roles: Roles,
    reward_fns: tuple[Callable[..., jax.Array], ...],
    full_policy: Callable[[dict], Any],
    state: Any,
    prompts: jax.Array,
    prompt_mask: jax.Array,
    key: jax.Array,
) -> Rollout:
    """Each prompt [B, P] repeated group_size times (rows of one prompt adjacent), answered,
    scored and turned into an ``RLHFBatch`` of N = B * group_size rows. The old log-probs come
    from the same full forward pass the loss uses, so the first ratio is 1."""
    policy_apply, critic_apply, kv_cache = roles.policy, roles.critic, roles.kv_cache
    policy = full_policy(state.params)
    prompt_mask = prompt_mask.astype(bool)
    samples = sample(config, policy_apply, kv_cache, policy, prompts, prompt_mask, key)
    prompts = jnp.repeat(prompts, config.group_size, axis=0)
    prompt_mask = jnp.repeat(prompt_mask, config.group_size, axis=0)
    sequences = Sequences(prompts, prompt_mask, samples.tokens, samples.mask)
    mask = samples.mask
    temperature, chunk = config.temperature, config.logit_chunk
    stats = policy_stats(policy_apply, policy, sequences, temperature, chunk)
    reference = policy_stats(policy_apply, state.reference, sequences, temperature, chunk)
    if critic_apply is not None:
        critic = state.params.get("critic", policy)
        values = response_values(critic_apply, critic, sequences)
    else:
        values = jnp.zeros(mask.shape, jnp.float32)
    rewards, scores, emitted_eos = score(config, reward_fns, sequences)
    penalty_kl = jnp.where(
        mask, kl_estimate(stats.log_probs, reference.log_probs, config.kl_estimator), 0.0
    )
    advantages, returns = advantages_and_returns(
        config, scores, penalty_kl, values, mask, state.kl_coef
    )
    batch = RLHFBatch(*sequences, stats.log_probs, reference.log_probs, advantages, values, returns)
    kl = jnp.where(mask, stats.log_probs - reference.log_probs, 0.0)
    return Rollout(batch, rewards, scores, kl, penalty_kl, stats.entropy, emitted_eos)


def rollout_metrics(
    config: RLHFConfig, rollout: Rollout, kl_coef: jax.Array, names: tuple[str, ...]
) -> dict[str, jax.Array]:
    """Scalars named as TRL names them where they mean the same (see ``METRICS``)."""
    batch = rollout.batch
    kl = rollout.kl.sum(axis=1)
    non_score = -kl_coef * rollout.penalty_kl.sum(axis=1)
    metrics = {
        "objective/scores": rollout.scores.mean(),
        "objective/kl": kl.mean(),
        "objective/entropy": losses.masked_mean(rollout.entropy, batch.mask),
        "objective/non_score_reward": non_score.mean(),
        "objective/rlhf_reward": (rollout.scores + non_score).mean(),
        "objective/kl_coef": kl_coef,
        "completions/mean_length": batch.mask.sum(axis=1).mean(),
        "completions/eos_fraction": rollout.emitted_eos.mean(),
    }
    for name, values in zip(names, rollout.rewards, strict=True):
        metrics[f"rewards/{name}/mean"] = values.mean()
    if config.needs_critic:
        metrics["val/explained_variance"] = losses.explained_variance(
            batch.values, batch.returns, batch.mask
        )
    return metrics
