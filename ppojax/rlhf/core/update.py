"""What the episode trainer's update reads: the batch of each episode's model tokens in
slots (``credit.Slots``, [N, M] with M = max_turns * response_len), its advantages (GRPO and
RLOO per episode or mixed with turn-level credit; PPO's GAE), and the loss over a minibatch.

For a one-turn episode the slots are the response's R columns, read from the logits by a
slice (``slot_outputs``), never a gather.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ppojax.engine import losses
from ppojax.rlhf.core import advantages as adv
from ppojax.rlhf.core import sharding
from ppojax.rlhf.core.config import RLHFConfig
from ppojax.rlhf.core.credit import (
    Slots,
    episode_token_rewards,
    mixed_advantages,
    model_slots,
    slot_gae,
    turn_advantages,
)
from ppojax.rlhf.core.episodes import Episodes, previous_real
from ppojax.rlhf.core.kl import kl_estimate, reward_coef
from ppojax.rlhf.core.logprobs import SplitPolicy, chunked_token_stats
from ppojax.rlhf.core.objective import LossParts, assemble_loss
from ppojax.rlhf.core.sampling import PolicyApply, TokenStats, token_stats
from ppojax.rlhf.core.trainer import RLHFState


class EpisodeBatch(NamedTuple):
    """The update's rows: the episodes' tokens and real-token mask [N, L] (the models'
    input), and per slot [N, M] (``credit.Slots``: the model's tokens in order) the column
    whose outputs predict its token (the previous real column), the token, whether the slot
    is filled, the sampling policy's and the reference's log-probs, the advantage, PPO's
    critic value at sampling time and GAE return (zeros without a critic)."""

    tokens: jax.Array
    mask: jax.Array
    positions: jax.Array
    targets: jax.Array
    slot_mask: jax.Array
    log_probs: jax.Array
    ref_log_probs: jax.Array
    advantages: jax.Array
    values: jax.Array
    returns: jax.Array


def at_positions(outputs: jax.Array, positions: jax.Array) -> jax.Array:
    """``outputs`` [N, L, ...] at ``positions`` [N, M]: [N, M, ...]."""
    index = positions.reshape(positions.shape + (1,) * (outputs.ndim - 2))
    return jnp.take_along_axis(outputs, index, axis=1)


def slot_outputs(outputs: jax.Array, batch: EpisodeBatch, start: int | None) -> jax.Array:
    """A model's outputs [N, L, ...] at the slots' positions: [N, M, ...]. ``start``: None,
    or for one-turn episodes the response's first column, whose M = R model tokens are the
    columns start + [0, R) (the prompt left-padded): there the positions are the slice
    start - 1 + [0, R), read as a slice (a gather's gradient would sum the rows in another
    order, and costs more)."""
    if start is None:
        return at_positions(outputs, batch.positions)
    return outputs[:, start - 1 : start - 1 + batch.positions.shape[1]]


def slot_stats(
    policy_apply: PolicyApply,
    params: Any,
    batch: EpisodeBatch,
    temperature: Any,
    start: int | None = None,
    logit_chunk: int = 0,
) -> TokenStats:
    """One forward pass over the episodes [N, L]: log softmax(logits / temperature) of each
    slot's token under the logits of its position (``slot_outputs``), and that softmax's
    entropy, both [N, M]. A ``SplitPolicy`` with ``logit_chunk`` > 0 is scored in chunks:
    the slots' hidden states through the LM head, never [N, L, V] logits at once."""
    if logit_chunk and isinstance(policy_apply, SplitPolicy):
        hidden = slot_outputs(policy_apply.hidden(params, batch.tokens, batch.mask), batch, start)
        return chunked_token_stats(
            policy_apply.head, params, hidden, batch.targets, temperature, logit_chunk
        )
    outputs = policy_apply(params, batch.tokens, batch.mask)
    logits = slot_outputs(outputs, batch, start)
    return token_stats(logits, batch.targets, temperature)


def episode_advantages(
    config: RLHFConfig,
    scores: jax.Array,
    penalty_kl: jax.Array,
    mask: jax.Array,
    kl_coef: jax.Array,
) -> jax.Array:
    """[N, M]: GRPO's or RLOO's group advantage [N] of score - beta * the sum of the KL
    [N, M] over the model's tokens (beta = 0 with kl_in="loss"), on every model token of
    ``mask``, 0 elsewhere."""
    beta = reward_coef(config, kl_coef)
    rewards = adv.sequence_rewards(scores, penalty_kl, mask, beta)
    per_row = adv.sequence_advantages(
        config.algorithm, rewards, config.group_size, config.group_std
    )
    return jnp.where(mask, per_row[:, None], 0.0)


def episode_loss(
    config: RLHFConfig,
    parts: LossParts,
    params: dict,
    batch: EpisodeBatch,
    start: int | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The loss over a minibatch's slots: policy_on * (-clipped
    surrogate (+ beta KL with kl_in="loss") - ent_coef H), aggregated by
    ``config.loss_aggregation``, plus for PPO (``parts.critic_apply``) vf_coef * the clipped
    value loss (the critic's own params, or the policy's when the critic is a value head on
    it); and its metrics. ``start``: see ``slot_outputs``."""
    # each device its own rows of the minibatch (over a mesh): left to itself XLA's
    # partitioner split the attention by heads and all-reduced its scores every block
    batch = sharding.rows_split(batch)
    policy = parts.policy_params(params)
    stats = slot_stats(
        parts.policy_apply, policy, batch, config.temperature, start, config.logit_chunk
    )

    def critic_values(critic_params: Any) -> jax.Array:
        values = parts.critic_apply(critic_params, batch.tokens, batch.mask)
        return slot_outputs(values, batch, start)

    return assemble_loss(config, parts, params, stats, batch, batch.slot_mask, critic_values)


def credit(
    config: RLHFConfig,
    episodes: Episodes,
    penalty_kl: jax.Array,
    slots: Slots,
    kl_coef: jax.Array,
    turn_weight: Any,
    turn_index: Any,
) -> jax.Array:
    """[N, M] in slots: each model token's advantage, (1 - w) * episode + w * turn-level
    (``credit``'s module), w = ``turn_weight``; the episode advantage alone when w is None.
    ``penalty_kl`` [N, M] in slots."""
    scores = episodes.rewards.sum(axis=1)
    episode = episode_advantages(config, scores, penalty_kl, slots.mask, kl_coef)
    if turn_weight is None:
        return episode
    beta = reward_coef(config, kl_coef)
    model_mask = episodes.model_mask
    turn = turn_advantages(
        config.algorithm,
        config.group_size,
        config.group_std,
        episodes.rewards,
        slots.scatter(penalty_kl, model_mask.shape[1]),
        beta,
        model_mask,
        turn_index,
    )
    return mixed_advantages(episode, slots.gather(turn), turn_weight)


def ppo_advantages(
    config: RLHFConfig,
    episodes: Episodes,
    penalty_kl: jax.Array,
    values: jax.Array,
    slots: Slots,
    kl_coef: jax.Array,
    turn_index: Any,
) -> tuple[jax.Array, jax.Array]:
    """PPO's advantages and returns [N, M] in slots (``credit.slot_gae``), whitened over the
    filled slots when ``config.whiten_advantages``: token rewards of -beta KL_t, each turn's
    reward at the turn's last model token (``credit.episode_token_rewards``)."""
    beta = reward_coef(config, kl_coef)
    model_mask = episodes.model_mask
    full_kl = slots.scatter(penalty_kl, model_mask.shape[1])
    rewards = episode_token_rewards(episodes.rewards, full_kl, model_mask, turn_index, beta)
    advantages, returns = slot_gae(
        slots.gather(rewards), values, slots, config.gamma, config.gae_lambda
    )
    if config.whiten_advantages:
        advantages = adv.whiten(advantages, slots.mask)
    return jnp.where(slots.mask, advantages, 0.0), returns


def collect_episodes(
    config: RLHFConfig,
    parts: LossParts,
    episodes: Episodes,
    state: RLHFState,
    num_slots: int,
    turn_weight: Any = None,
    turn_index: Any = None,
    start: int | None = None,
) -> tuple[EpisodeBatch, dict[str, jax.Array]]:
    """The update's batch and the rollout's metrics for episodes the current policy played
    (``parts``: the models and this step's coefficients, as the loss gets them; ``start``:
    see ``slot_outputs``)."""
    policy = parts.policy_params(state.params)
    tokens, mask = episodes.tokens, episodes.mask
    slots = model_slots(episodes.model_mask, num_slots)
    positions = jnp.take_along_axis(previous_real(mask), slots.columns, axis=1)
    zeros = jnp.zeros(slots.mask.shape, jnp.float32)
    batch = EpisodeBatch(
        tokens, mask, positions, slots.gather(tokens), slots.mask, zeros, zeros, zeros, zeros,
        zeros,
    )  # fmt: skip
    temperature = config.temperature
    chunk = config.logit_chunk
    stats = slot_stats(parts.policy_apply, policy, batch, temperature, start, chunk)
    reference = slot_stats(parts.policy_apply, state.reference, batch, temperature, start, chunk)
    estimate = kl_estimate(stats.log_probs, reference.log_probs, config.kl_estimator)
    penalty_kl = jnp.where(slots.mask, estimate, 0.0)
    scores = episodes.rewards.sum(axis=1)
    if parts.critic_apply is None:
        advantages = credit(
            config, episodes, penalty_kl, slots, state.kl_coef, turn_weight, turn_index
        )
        values = returns = zeros
    else:
        critic = state.params.get("critic", policy)
        values = slot_outputs(parts.critic_apply(critic, tokens, mask), batch, start)
        advantages, returns = ppo_advantages(
            config, episodes, penalty_kl, values, slots, state.kl_coef, turn_index
        )
    batch = batch._replace(
        log_probs=stats.log_probs,
        ref_log_probs=reference.log_probs,
        advantages=advantages,
        values=values,
        returns=returns,
    )
    kl = jnp.where(slots.mask, stats.log_probs - reference.log_probs, 0.0).sum(axis=1)
    non_score = -state.kl_coef * penalty_kl.sum(axis=1)
    metrics = {
        "objective/non_score_reward": non_score.mean(),
        "objective/rlhf_reward": (scores + non_score).mean(),
        "episodes/return": scores.mean(),
        "episodes/turns": episodes.num_turns.mean(),
        "episodes/terminated": episodes.terminated.mean(),
        "episodes/model_tokens": episodes.model_mask.sum(axis=1).mean(),
        "objective/kl": kl.mean(),
        "objective/entropy": losses.masked_mean(stats.entropy, slots.mask),
        "objective/kl_coef": state.kl_coef,
    }
    if parts.critic_apply is not None:
        metrics["val/explained_variance"] = losses.explained_variance(values, returns, slots.mask)
    return batch, metrics
