"""Supervised fine-tuning on text: prompt/completion data, the loss on completion tokens only.

    data = load_completions("sft.jsonl", lm.tokenizer)  # fields prompt, completion
    step = jax.jit(make_sft_step(lm.policy_apply, optax.adam(1e-4)))
    batch, _ = draw_batch(data, key, 16)
    params, opt_state, metrics = step(params, opt_state, batch)

The prompt is the model's context and never a target: ``sft.sft_loss`` reads the log-probs of
the completion's tokens (and its EOS) only, as TRL's ``completion_only_loss``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import optax

from ppojax.rlhf.core.sampling import PolicyApply, Sequences
from ppojax.rlhf.data import Encoding, encode_examples, labelled_rows
from ppojax.rlhf.post.sft import sft_loss


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


def make_sft_step(
    policy_apply: PolicyApply, optimizer: optax.GradientTransformation
) -> Callable[..., tuple[Any, optax.OptState, dict[str, jax.Array]]]:
    """``step(params, opt_state, batch: CompletionData) -> (params, opt_state, {"loss"})``:
    one optimizer step on the mean cross-entropy of the completion tokens. Pure; jit it."""

    def step(params: Any, opt_state: optax.OptState, batch: CompletionData):
        targets = Sequences(*batch)
        loss, grads = jax.value_and_grad(sft_loss, argnums=1)(policy_apply, params, targets)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, {"loss": loss}

    return step
