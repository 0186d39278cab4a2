"""Learned reward models: the Bradley-Terry loss and a score read at the last real token."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from ppojax.ppo import losses
from ppojax.rlhf.core.sampling import Sequences


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
