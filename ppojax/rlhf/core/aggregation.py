"""How the loss's per-token terms [N, R] become one scalar: ``AGGREGATIONS``, by the name
``RLHFConfig.loss_aggregation`` gives. "grpo" is the per-sequence mean (GRPO's 1/|o_i|),
"dapo" the per-token mean over the batch (DAPO), "dr_grpo" the sum over tokens /
(rows * response_len) (Dr. GRPO's constant)."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from ppojax.engine import losses


def token_mean(per_token: jax.Array, mask: jax.Array) -> jax.Array:
    """The sum over the real tokens / their count."""
    return losses.masked_mean(per_token, mask)


def sequence_mean(per_token: jax.Array, mask: jax.Array) -> jax.Array:
    """The mean over rows of (row sum / row length)."""
    lengths = jnp.maximum(mask.sum(axis=1), 1.0)
    return ((per_token * mask).sum(axis=1) / lengths).mean()


def constant_mean(per_token: jax.Array, mask: jax.Array) -> jax.Array:
    """The sum over the real tokens / (N * R), whatever the responses' lengths."""
    return (per_token * mask).sum() / per_token.size


# name -> (per_token [N, R], mask [N, R] in per_token's dtype) -> scalar
AGGREGATIONS: dict[str, Callable[[jax.Array, jax.Array], jax.Array]] = {
    "token": token_mean,
    "sequence": sequence_mean,
    "grpo": sequence_mean,
    "dapo": token_mean,
    "dr_grpo": constant_mean,
}


def aggregate(per_token: jax.Array, mask: jax.Array, mode: str) -> jax.Array:
    """A scalar from per-token terms [N, R] by the aggregation registered as ``mode``:
    "token"/"dapo" sum / real tokens; "sequence"/"grpo" mean over rows of (row sum / row
    length); "dr_grpo" sum / (N * R). An unknown ``mode`` is a ``ValueError`` naming the
    known ones."""
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {mode!r}; known: {', '.join(AGGREGATIONS)}")
    return AGGREGATIONS[mode](per_token, mask.astype(per_token.dtype))
