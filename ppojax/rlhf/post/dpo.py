"""DPO (Rafailov et al.) and IPO (Azar et al.) on chosen/rejected pairs, as a pure step
``(params, opt_state, batch, reference, beta) -> (params, opt_state, metrics)`` for any LM in
the library's contract.

    pairs = load_pairs("pairs.jsonl", lm.tokenizer)  # fields prompt, chosen, rejected
    step = jax.jit(make_dpo_step(lm.policy_apply, optax.adam(1e-6)))
    batch, _ = draw_batch(pairs, key, 8)
    params, opt_state, metrics = step(params, opt_state, batch, reference, beta)

With h = (log pi(y_c) - log ref(y_c)) - (log pi(y_r) - log ref(y_r)) summed over response
tokens, DPO's sigmoid loss is -log sigmoid(beta h); IPO's is (h - 1 / (2 beta))^2 on per-token
mean log-probs, as TRL computes it. ``beta`` is a traced argument, so ``jax.vmap`` sweeps it
in one program.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from ppojax.rlhf.core.sampling import PolicyApply, Sequences, response_stats
from ppojax.rlhf.post.pairs import PairData, preference_metrics

LOSS_TYPES = ("sigmoid", "ipo")


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
