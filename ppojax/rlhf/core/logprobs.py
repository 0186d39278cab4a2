"""Per-token log-probs and entropy of responses without materializing [B, L, V] logits.

A policy that gives its final hidden states and its LM head apart (``SplitPolicy``) is scored
in chunks of response positions: each chunk's head matmul and log-softmax run under
``jax.checkpoint`` inside ``lax.map``, so one chunk's logits [B, c, V] live at a time and the
backward pass recomputes a chunk's logits instead of keeping every chunk's. With a vocabulary
of 151,936 and 64 responses of 1,024 tokens the full logits are 20 GB in bfloat16; a chunk
of 4,096 tokens is 1.2 GB. Any other ``policy_apply`` is scored from its full logits
(``sampling.response_stats``), as is every policy with ``logit_chunk`` 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from ppojax.engine import precision
from ppojax.rlhf.core import sharding
from ppojax.rlhf.core.sampling import (
    PolicyApply,
    Sequences,
    TokenStats,
    response_stats,
    token_stats,
)


@dataclasses.dataclass(frozen=True)
class SplitPolicy:
    """A ``policy_apply`` that also gives its two halves: calling it is ``logits(params,
    tokens, mask) -> [B, L, V]``; ``hidden(params, tokens, mask) -> [B, L, D]`` is the final
    hidden states (after the final norm) and ``head(params, hidden [..., D]) -> [..., V]`` the
    LM head, with logits = head(params, hidden(params, tokens, mask)). Not a pytree: a
    function, as any ``policy_apply`` is."""

    logits: PolicyApply
    hidden: Callable[[Any, jax.Array, jax.Array], jax.Array]
    head: Callable[[Any, jax.Array], jax.Array]

    def __call__(self, params: Any, tokens: jax.Array, mask: jax.Array) -> jax.Array:
        return self.logits(params, tokens, mask)


def computing(apply: Any, dtype: Any) -> Any:
    """``apply(params, ...)`` on params cast to ``dtype`` first (a ``SplitPolicy`` stays one):
    inside a loss, float32 master params get float32 gradients of a ``dtype`` forward
    (``ppojax.engine.precision``)."""
    if isinstance(apply, SplitPolicy):
        parts = (apply.logits, apply.hidden, apply.head)
        return SplitPolicy(*(computing(fn, dtype) for fn in parts))
    # the cast copy split as the masters are: a sharded step gathers it, not them
    return lambda params, *args: apply(sharding.for_training(precision.cast(params, dtype)), *args)


def chunk_positions(rows: int, length: int, logit_chunk: int) -> int:
    """Response positions per chunk: ``logit_chunk`` tokens spread over ``rows`` rows, at
    least 1 and at most ``length``."""
    return max(1, min(length, logit_chunk // rows))


def chunked_stats(
    policy: SplitPolicy, params: Any, sequences: Sequences, temperature: Any, logit_chunk: int
) -> TokenStats:
    """``response_stats`` of ``policy`` ([B, R] log-probs and entropy), the head and softmax
    run over chunks of ``chunk_positions(B, R, logit_chunk)`` positions (the last padded)."""
    hidden = sequences.response_positions(policy.hidden(params, *sequences.model_input()))
    return chunked_token_stats(
        policy.head, params, hidden, sequences.responses, temperature, logit_chunk
    )


def chunked_token_stats(
    head: Callable[[Any, jax.Array], jax.Array],
    params: Any,
    hidden: jax.Array,
    targets: jax.Array,
    temperature: Any,
    logit_chunk: int,
) -> TokenStats:
    """``token_stats`` of ``head(params, hidden)`` [B, M, V] at ``targets`` [B, M], the head
    and softmax run over chunks of ``chunk_positions(B, M, logit_chunk)`` positions (the last
    padded): the hidden states [B, M, D] of whichever positions predict the targets (a
    response's, an episode's model tokens)."""
    rows, length = targets.shape
    size = chunk_positions(rows, length, logit_chunk)
    count = -(-length // size)
    pad = count * size - length
    # chunks lead, rows stay whole: a batch sharded over devices stays sharded in each chunk
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    hidden = hidden.reshape(rows, count, size, hidden.shape[-1]).swapaxes(0, 1)
    targets = jnp.pad(targets, ((0, 0), (0, pad))).reshape(rows, count, size).swapaxes(0, 1)

    @jax.checkpoint
    def chunk_stats(chunk: tuple[jax.Array, jax.Array]) -> TokenStats:
        chunk_hidden, chunk_targets = chunk
        return token_stats(head(params, chunk_hidden), chunk_targets, temperature)

    stats = jax.lax.map(chunk_stats, (hidden, targets))
    return TokenStats(
        *(part.swapaxes(0, 1).reshape(rows, count * size)[:, :length] for part in stats)
    )


def policy_stats(
    policy_apply: PolicyApply,
    params: Any,
    sequences: Sequences,
    temperature: Any,
    logit_chunk: int,
) -> TokenStats:
    """Log-probs and entropy [B, R] of the responses under ``policy_apply``: in chunks of
    ``logit_chunk`` tokens when it is a ``SplitPolicy`` and ``logit_chunk`` > 0, else from
    the full logits."""
    if logit_chunk and isinstance(policy_apply, SplitPolicy):
        return chunked_stats(policy_apply, params, sequences, temperature, logit_chunk)
    return response_stats(policy_apply, params, sequences, temperature)
