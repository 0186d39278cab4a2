"""Supervised fine-tuning of any LM in the library's contract: the usual SFT start for RL."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import optax

from ppojax.ppo import losses
from ppojax.rlhf.core.sampling import PolicyApply, Sequences, response_stats


def sft_loss(policy_apply: PolicyApply, params: Any, targets: Sequences) -> jax.Array:
    """Masked next-token cross-entropy: -mean over real target tokens [B, R] (the responses of
    ``targets``) of log pi(token)."""
    stats = response_stats(policy_apply, params, targets, 1.0)
    return -losses.masked_mean(stats.log_probs, targets.response_mask)


def make_adam(learning_rate: Any, max_grad_norm: Any) -> optax.GradientTransformation:
    """Global-norm gradient clipping, then Adam."""
    return optax.chain(optax.clip_by_global_norm(max_grad_norm), optax.adam(learning_rate))


def train_sft(
    policy_apply: PolicyApply,
    params: Any,
    data: Callable[[jax.Array], Sequences],
    key: jax.Array,
    *,
    steps: int,
    learning_rate: Any = 1e-3,
    max_grad_norm: Any = 1.0,
) -> tuple[Any, jax.Array]:
    """``steps`` Adam steps of ``sft_loss`` on ``data(key) -> Sequences`` (or the same four
    arrays as a tuple) of prompts and their targets, one fresh batch per step (``lax.scan``);
    the params and the loss [steps]."""
    optimizer = make_adam(learning_rate, max_grad_norm)

    def step(carry: tuple[Any, optax.OptState], step_key: jax.Array):
        params, opt_state = carry
        targets = Sequences(*data(step_key))
        loss, grads = jax.value_and_grad(sft_loss, argnums=1)(policy_apply, params, targets)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    keys = jax.random.split(key, steps)
    (params, _), loss_curve = jax.lax.scan(step, (params, optimizer.init(params)), keys)
    return params, loss_curve
