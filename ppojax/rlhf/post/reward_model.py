"""Learned reward models: a scalar head read at the last real token, trained with the
Bradley-Terry loss on chosen/rejected pairs or on every pair among K ranked responses to a
prompt (InstructGPT's comparisons), and the ``reward_fn`` a trained one becomes.

    step = jax.jit(make_reward_model_step(lm.critic_apply, optax.adam(1e-5)))
    batch, _ = draw_batch(pairs, key, 8)  # PairData
    params, opt_state, metrics = step(params, opt_state, batch)
    trainer = make_trainer(config, lm.policy_apply, reward_model(lm.critic_apply, params))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from ppojax.engine import losses
from ppojax.rlhf.core.sampling import Sequences
from ppojax.rlhf.post.pairs import PairData, preference_metrics


def bradley_terry_loss(
    chosen: jax.Array, rejected: jax.Array, mask: jax.Array | None = None
) -> jax.Array:
    """-E[log sigmoid(r_chosen - r_rejected)] over the pairs [N] with mask 1."""
    return losses.masked_mean(-jax.nn.log_sigmoid(chosen - rejected), mask)


def last_token_scores(
    value_apply: Callable[[Any, jax.Array, jax.Array], jax.Array],
    params: Any,
    sequences: Sequences,
) -> jax.Array:
    """Scores [B]: ``value_apply``'s output [B, P + R] at the last real response token (the
    last prompt position for an empty response)."""
    values = value_apply(params, *sequences.model_input())
    last = sequences.prompts.shape[1] + sequences.response_mask.sum(axis=1) - 1
    return jnp.take_along_axis(values, last[:, None].astype(jnp.int32), axis=1)[:, 0]


def reward_model(
    value_apply: Callable[[Any, jax.Array, jax.Array], jax.Array], params: Any
) -> Callable[[jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]:
    """A ``reward_fn`` from a trained reward model, its params closed over."""

    def reward_model_score(prompts, prompt_mask, responses, response_mask):
        sequences = Sequences(prompts, prompt_mask, responses, response_mask)
        return last_token_scores(value_apply, params, sequences)

    return reward_model_score


def pair_scores(
    value_apply: Callable[[Any, jax.Array, jax.Array], jax.Array], params: Any, pairs: PairData
) -> tuple[jax.Array, jax.Array]:
    """A reward model's scores at the last real token of chosen and rejected, [N] each."""
    chosen = last_token_scores(value_apply, params, pairs.chosen_sequences)
    rejected = last_token_scores(value_apply, params, pairs.rejected_sequences)
    return chosen, rejected


def pair_accuracy(
    value_apply: Callable[[Any, jax.Array, jax.Array], jax.Array], params: Any, pairs: PairData
) -> jax.Array:
    """The fraction of pairs whose chosen response the reward model scores higher."""
    chosen, rejected = pair_scores(value_apply, params, pairs)
    return (chosen > rejected).mean()


def make_reward_model_step(
    value_apply: Callable[[Any, jax.Array, jax.Array], jax.Array],
    optimizer: optax.GradientTransformation,
) -> Callable[..., tuple[Any, optax.OptState, dict[str, jax.Array]]]:
    """``step(params, opt_state, batch: PairData) -> (params, opt_state, metrics)``: one
    optimizer step on the Bradley-Terry loss of ``value_apply``'s last-token scores (a
    scalar head on a backbone, such as ``from_pretrained``'s ``critic_apply``). Metrics:
    ``loss`` and the score ``rewards/*`` of ``preference_metrics``."""

    def loss_fn(params: Any, batch: PairData):
        chosen, rejected = pair_scores(value_apply, params, batch)
        loss = bradley_terry_loss(chosen, rejected)
        return loss, {"loss": loss, **preference_metrics(chosen, rejected)}

    def step(params: Any, opt_state: optax.OptState, batch: PairData):
        grads, metrics = jax.grad(loss_fn, has_aux=True)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, metrics

    return step


class RankedSamples(NamedTuple):
    """K responses to each of B prompts and the scores that rank them: ``prompts`` [B, P],
    ``prompt_mask``, ``responses`` [B, K, R], ``response_mask`` [B, K, R] and ``ranking``
    [B, K] (higher is preferred; equal scores carry no preference)."""

    prompts: jax.Array
    prompt_mask: jax.Array
    responses: jax.Array
    response_mask: jax.Array
    ranking: jax.Array


def pair_margins(scores: jax.Array, ranking: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Every pair i < j of a prompt's K samples, from scores and ranking [B, K]: the margin
    [B, K(K-1)/2] (reward-model score of the preferred sample minus the other's) and which
    pairs count (their ranking differs: a tie carries no preference)."""
    first, second = jnp.triu_indices(scores.shape[1], k=1)
    order = jnp.sign(ranking[:, first] - ranking[:, second])
    return order * (scores[:, first] - scores[:, second]), order != 0


def ranking_loss(
    value_apply: Callable[[Any, jax.Array, jax.Array], jax.Array],
    params: Any,
    ranked: RankedSamples,
) -> tuple[jax.Array, jax.Array]:
    """Bradley-Terry loss over every counted pair of samples of a prompt, and (as aux) the
    fraction of those pairs the reward model orders as ``ranked.ranking`` does."""
    batch_size, samples, response_len = ranked.responses.shape
    repeated, repeated_mask = (
        jnp.repeat(x, samples, axis=0) for x in (ranked.prompts, ranked.prompt_mask)
    )
    flat = (
        x.reshape(batch_size * samples, response_len)
        for x in (ranked.responses, ranked.response_mask)
    )
    sequences = Sequences(repeated, repeated_mask, *flat)
    scores = last_token_scores(value_apply, params, sequences)
    margins, counted = pair_margins(scores.reshape(batch_size, samples), ranked.ranking)
    accuracy = losses.masked_mean((margins > 0).astype(jnp.float32), counted)
    return bradley_terry_loss(margins, jnp.zeros_like(margins), counted), accuracy
