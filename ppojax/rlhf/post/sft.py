"""Supervised fine-tuning of any LM in the library's contract, the usual start for RL: the
loss on completion tokens only, prompt/completion data, one optimizer step, and steps on
fresh batches in one ``lax.scan``.

    data = load_completions("sft.jsonl", lm.tokenizer)  # fields prompt, completion
    step = jax.jit(make_sft_step(lm.policy_apply, optax.adam(1e-4)))
    batch, _ = draw_batch(data, key, 16)
    params, opt_state, metrics = step(params, opt_state, batch)

The prompt is the model's context and never a target: ``sft_loss`` reads the log-probs of
the completion's tokens (and its EOS) only, as TRL's ``completion_only_loss``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import optax

from ppojax.engine import losses
from ppojax.engine.optim import clipped_adam
from ppojax.rlhf.core.sampling import PolicyApply, Sequences, response_stats
from ppojax.rlhf.data import Encoding, encode_examples, labelled_rows


class CompletionData(NamedTuple):
    """SFT examples as arrays: ``prompts`` [N, P] left-padded, ``prompt_mask`` [N, P]; the
    ``targets`` [N, R] (completion ids then EOS, right-padded) and ``target_mask`` [N, R]."""

    prompts: jax.Array
    prompt_mask: jax.Array
    targets: jax.Array
    target_mask: jax.Array


def load_completions(
    source: Any,
    tokenizer: Any,
    *,
    fields: tuple[str, str] = ("prompt", "completion"),
    chat: bool = False,
    max_len: int | None = None,
    max_response_len: int | None = None,
    overflow: str = "truncate",
) -> CompletionData:
    """Examples from a JSONL path or a list of dicts with the (prompt, completion) ``fields``;
    encoding and length limits as ``data.encode_examples``."""
    labelled = labelled_rows(source, fields)
    encoding = Encoding(chat, max_len, max_response_len, overflow)
    return CompletionData(*encode_examples(labelled, tokenizer, fields, encoding))


def sft_loss(policy_apply: PolicyApply, params: Any, targets: Sequences) -> jax.Array:
    """Masked next-token cross-entropy: -mean over real target tokens [B, R] (the responses of
    ``targets``) of log pi(token)."""
    stats = response_stats(policy_apply, params, targets, 1.0)
    return -losses.masked_mean(stats.log_probs, targets.response_mask)


def completion_loss(policy_apply: PolicyApply, params: Any, batch: Any) -> jax.Array:
    """``sft_loss`` on a ``CompletionData``, a ``Sequences`` or their four arrays."""
    return sft_loss(policy_apply, params, Sequences(*batch))


SFTLoss = Callable[[PolicyApply, Any, Any], jax.Array]


def make_sft_step(
    policy_apply: PolicyApply,
    optimizer: optax.GradientTransformation,
    loss: SFTLoss = completion_loss,
) -> Callable[..., tuple[Any, optax.OptState, dict[str, jax.Array]]]:
    """``step(params, opt_state, batch) -> (params, opt_state, {"loss"})``: one optimizer step
    on ``loss(policy_apply, params, batch)``, by default the mean cross-entropy of the
    completion tokens (``batch`` a ``CompletionData``, a ``Sequences`` or their four arrays;
    ``demos.demo_loss`` reads episodes instead). Pure; jit it."""

    def step(params: Any, opt_state: optax.OptState, batch: Any):
        value, grads = jax.value_and_grad(loss, argnums=1)(policy_apply, params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, {"loss": value}

    return step


def train_sft(
    policy_apply: PolicyApply,
    params: Any,
    data: Callable[[jax.Array], Any],
    key: jax.Array,
    *,
    steps: int,
    learning_rate: Any = 1e-3,
    max_grad_norm: Any = 1.0,
    loss: SFTLoss = completion_loss,
) -> tuple[Any, jax.Array]:
    """``steps`` Adam steps of ``loss`` (default ``sft_loss``) on ``data(key)`` (for the
    default, a ``Sequences`` or the same four arrays of prompts and their targets), one fresh
    batch per step (``lax.scan``); the params and the loss [steps]."""
    optimizer = clipped_adam(learning_rate, max_grad_norm)
    update = make_sft_step(policy_apply, optimizer, loss)

    def step(carry: tuple[Any, optax.OptState], step_key: jax.Array):
        params, opt_state, metrics = update(*carry, data(step_key))
        return (params, opt_state), metrics["loss"]

    keys = jax.random.split(key, steps)
    (params, _), loss_curve = jax.lax.scan(step, (params, optimizer.init(params)), keys)
    return params, loss_curve
