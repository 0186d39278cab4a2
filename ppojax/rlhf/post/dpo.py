"""Learning from chosen/rejected pairs: DPO (sigmoid or IPO loss) and Bradley-Terry reward
models, each as a pure step ``(params, opt_state, batch, ...) -> (params, opt_state,
metrics)`` for any LM in the library's contract.

    pairs = load_pairs("pairs.jsonl", lm.tokenizer)  # fields prompt, chosen, rejected
    step = jax.jit(make_dpo_step(lm.policy_apply, optax.adam(1e-6)))
    batch, _ = draw_batch(pairs, key, 8)
    params, opt_state, metrics = step(params, opt_state, batch, reference, beta)

DPO (Rafailov et al.): with h = (log pi(y_c) - log ref(y_c)) - (log pi(y_r) - log ref(y_r))
summed over response tokens, the sigmoid loss is -log sigmoid(beta h); IPO (Azar et al.)
is (h - 1 / (2 beta))^2 on per-token mean log-probs, as TRL computes it. ``beta`` is a
traced argument, so ``jax.vmap`` sweeps it in one program.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from ppojax.rlhf.core.sampling import PolicyApply, Sequences, response_stats
from ppojax.rlhf.data import Encoding, encode_examples, labelled_rows
from ppojax.rlhf.post.reward_model import bradley_terry_loss, last_token_scores

LOSS_TYPES = ("sigmoid", "ipo")
PAIR_FIELDS = ("prompt", "chosen", "rejected")


class PairData(NamedTuple):
    """Preference pairs as arrays: ``prompts`` [N, P] left-padded and ``prompt_mask``; the
    chosen and rejected responses [N, R] right-padded with pad_id, each with its mask (True
    on the text and its EOS)."""

    prompts: jax.Array
    prompt_mask: jax.Array
    chosen: jax.Array
    chosen_mask: jax.Array
    rejected: jax.Array
    rejected_mask: jax.Array

    @property
    def chosen_sequences(self) -> Sequences:
        return Sequences(self.prompts, self.prompt_mask, self.chosen, self.chosen_mask)

    @property
    def rejected_sequences(self) -> Sequences:
        return Sequences(self.prompts, self.prompt_mask, self.rejected, self.rejected_mask)


def load_pairs(
    source: Any,
    tokenizer: Any,
    *,
    fields: tuple[str, str, str] = PAIR_FIELDS,
    chat: bool = False,
    max_len: int | None = None,
    max_response_len: int | None = None,
    overflow: str = "truncate",
) -> PairData:
    """Pairs from a JSONL path or a list of dicts with the (prompt, chosen, rejected)
    ``fields``; ``ValueError`` naming the line for identical chosen and rejected texts (they
    carry no preference). Encoding and length limits as ``data.encode_examples``."""
    labelled = labelled_rows(source, fields)
    _, chosen, rejected = fields
    for where, row in labelled:
        if row[chosen] == row[rejected]:
            raise ValueError(
                f"{where}: {chosen!r} and {rejected!r} are the same text; a pair must differ."
            )
    encoding = Encoding(chat, max_len, max_response_len, overflow)
    return PairData(*encode_examples(labelled, tokenizer, fields, encoding))


def sequence_log_probs(
    policy_apply: PolicyApply, params: Any, sequences: Sequences, average: bool = False
) -> jax.Array:
    """log pi(response | prompt) [N]: the sum over real response tokens, or their mean."""
    stats = response_stats(policy_apply, params, sequences, 1.0)
    response_mask = sequences.response_mask
    total = jnp.where(response_mask, stats.log_probs, 0.0).sum(axis=1)
    return total / jnp.maximum(response_mask.sum(axis=1), 1) if average else total


def pair_log_probs(
    policy_apply: PolicyApply, params: Any, pairs: PairData, average: bool = False
) -> tuple[jax.Array, jax.Array]:
    """(chosen [N], rejected [N]) sequence log-probs from one forward pass over 2N rows."""
    rows = pairs.prompts.shape[0]
    both = jax.tree.map(
        lambda chosen, rejected: jnp.concatenate([chosen, rejected]),
        pairs.chosen_sequences,
        pairs.rejected_sequences,
    )
    log_probs = sequence_log_probs(policy_apply, params, both, average)
    return log_probs[:rows], log_probs[rows:]


def preference_metrics(chosen: jax.Array, rejected: jax.Array) -> dict[str, jax.Array]:
    """TRL's names: the implicit rewards' means, their margin and how often chosen wins."""
    return {
        "rewards/chosen": chosen.mean(),
        "rewards/rejected": rejected.mean(),
        "rewards/margins": (chosen - rejected).mean(),
        "rewards/accuracies": (chosen > rejected).mean(),
    }


def dpo_loss(
    chosen: jax.Array,
    rejected: jax.Array,
    ref_chosen: jax.Array,
    ref_rejected: jax.Array,
    beta: Any,
    loss_type: str = "sigmoid",
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The DPO loss over N pairs of log-probs [N] (see the module) and its metrics: the
    implicit rewards beta (log pi - log ref) of chosen and rejected, their margin, accuracy."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type={loss_type!r} must be one of {LOSS_TYPES}.")
    chosen_reward = chosen - ref_chosen
    rejected_reward = rejected - ref_rejected
    h = chosen_reward - rejected_reward
    if loss_type == "sigmoid":
        losses = -jax.nn.log_sigmoid(beta * h)
    else:
        losses = (h - 1.0 / (2.0 * beta)) ** 2
    metrics = preference_metrics(beta * chosen_reward, beta * rejected_reward)
    return losses.mean(), {"loss": losses.mean(), **metrics}


def make_dpo_step(
    policy_apply: PolicyApply, optimizer: optax.GradientTransformation, loss_type: str = "sigmoid"
) -> Callable[..., tuple[Any, optax.OptState, dict[str, jax.Array]]]:
    """``step(params, opt_state, batch: PairData, reference, beta) -> (params, opt_state,
    metrics)``: one optimizer step on the DPO loss, ``reference`` the frozen params (its
    log-probs recomputed each step, no gradient). Pure; jit it, vmap it over ``beta``."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type={loss_type!r} must be one of {LOSS_TYPES}.")
    average = loss_type == "ipo"

    def loss_fn(params: Any, batch: PairData, reference: Any, beta: Any):
        ref_chosen, ref_rejected = jax.lax.stop_gradient(
            pair_log_probs(policy_apply, reference, batch, average)
        )
        chosen, rejected = pair_log_probs(policy_apply, params, batch, average)
        return dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta, loss_type)

    def step(params: Any, opt_state: optax.OptState, batch: PairData, reference: Any, beta: Any):
        grads, metrics = jax.grad(loss_fn, has_aux=True)(params, batch, reference, beta)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, metrics

    return step


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
