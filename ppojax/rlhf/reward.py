"""The reward model: the transformer's value head read at the last real response token,
trained with the Bradley-Terry loss on response pairs ranked by the gold scorer.

Pairs are two samples of the reference (SFT) policy for the same prompt, so the reward model
only knows that policy's distribution, the way a learned reward model does in practice; far
from it the proxy can be wrong, and an unconstrained policy can exploit it.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from ppojax import losses
from ppojax.rlhf.config import RLHFConfig
from ppojax.rlhf.model import TransformerLM, build_model
from ppojax.rlhf.sampling import sample_responses
from ppojax.rlhf.sft import make_adam, zero_value_head
from ppojax.rlhf.task import gold_score, response_mask, sample_prompts


def bradley_terry_loss(
    chosen: jax.Array, rejected: jax.Array, mask: jax.Array | None = None
) -> jax.Array:
    """-E[log sigmoid(r_chosen - r_rejected)] over the pairs [N] with mask 1."""
    return losses.masked_mean(-jax.nn.log_sigmoid(chosen - rejected), mask)


def reward_scores(
    model: TransformerLM, params: dict, prompts: jax.Array, responses: jax.Array
) -> jax.Array:
    """Scores [B]: the value head at the last real token of [prompt, response] ([B, P + R])."""
    tokens = jnp.concatenate([prompts, responses], axis=1)
    _, values, _ = model.apply(params, tokens)
    last = prompts.shape[1] + response_mask(responses).sum(axis=1) - 1
    return jnp.take_along_axis(values, last[:, None], axis=1)[:, 0]


class PreferencePairs(NamedTuple):
    """Prompts [N, P], chosen and rejected responses [N, R], mask [N] (0 for gold ties)."""

    prompts: jax.Array
    chosen: jax.Array
    rejected: jax.Array
    mask: jax.Array


def preference_pairs(config: RLHFConfig, sft_params: dict, key: jax.Array) -> PreferencePairs:
    """Two reference-policy samples per prompt, ordered by gold score; ties are masked out."""
    model = build_model(config)
    prompt_key, first_key, second_key = jax.random.split(key, 3)
    prompts = sample_prompts(prompt_key, config.rm_batch_size, config.prompt_len, config.num_digits)
    first = sample_responses(
        model, sft_params, prompts, first_key, config.response_len, config.temperature
    ).tokens
    second = sample_responses(
        model, sft_params, prompts, second_key, config.response_len, config.temperature
    ).tokens
    first_gold, second_gold = gold_score(prompts, first), gold_score(prompts, second)
    first_wins = (first_gold > second_gold)[:, None]
    chosen = jnp.where(first_wins, first, second)
    rejected = jnp.where(first_wins, second, first)
    return PreferencePairs(prompts, chosen, rejected, first_gold != second_gold)


def pair_loss(
    model: TransformerLM, params: dict, pairs: PreferencePairs
) -> tuple[jax.Array, jax.Array]:
    """Bradley-Terry loss on ``pairs`` and the accuracy (chosen scored higher) on real pairs."""
    chosen = reward_scores(model, params, pairs.prompts, pairs.chosen)
    rejected = reward_scores(model, params, pairs.prompts, pairs.rejected)
    accuracy = losses.masked_mean((chosen > rejected).astype(jnp.float32), pairs.mask)
    return bradley_terry_loss(chosen, rejected, pairs.mask), accuracy


def train_reward_model(
    config: RLHFConfig, sft_params: dict, key: jax.Array
) -> tuple[dict, dict[str, jax.Array]]:
    """``config.rm_steps`` Adam steps of the Bradley-Terry loss on fresh preference pairs,
    starting from the SFT weights; returns the reward parameters and per-step loss / accuracy
    plus the accuracy on held-out pairs."""
    model = build_model(config)
    optimizer = make_adam(config.rm_learning_rate, config.max_grad_norm)
    params = zero_value_head(sft_params)

    def step(carry: tuple[dict, optax.OptState], step_key: jax.Array):
        params, opt_state = carry
        pairs = preference_pairs(config, sft_params, step_key)
        grads, (loss, accuracy) = jax.grad(_loss_and_aux, argnums=1, has_aux=True)(
            model, params, pairs
        )
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), (loss, accuracy)

    train_key, eval_key = jax.random.split(key)
    keys = jax.random.split(train_key, config.rm_steps)
    (params, _), (loss_curve, accuracy_curve) = jax.lax.scan(
        step, (params, optimizer.init(params)), keys
    )
    _, held_out = pair_loss(model, params, preference_pairs(config, sft_params, eval_key))
    metrics = {"loss": loss_curve, "accuracy": accuracy_curve, "held_out_accuracy": held_out}
    return params, metrics


def _loss_and_aux(
    model: TransformerLM, params: dict, pairs: PreferencePairs
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    loss, accuracy = pair_loss(model, params, pairs)
    return loss, (loss, accuracy)
