"""How a model reads an episode's columns left to right, for the rollout: through its KV
cache (a prefill, then ``extend`` chunks, the cache carried across turns) or by full forward
passes over a [B, L] buffer of every column (any ``policy_apply``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ppojax.rlhf.core.sampling import KVCacheHook, PolicyApply
from ppojax.rlhf.envs.env import Tokens


class Context(NamedTuple):
    """A model reading an episode's columns left to right: ``start(prompt) -> (state, logits
    [B, V])`` after the prompt; ``feed(state, tokens [B, S], mask [B, S], column) -> (state,
    logits [B, S, V])`` for S tokens at ``column`` + [0, S)."""

    start: Callable[[Tokens], tuple[Any, jax.Array]]
    feed: Callable[[Any, jax.Array, jax.Array, Any], tuple[Any, jax.Array]]


def cached_context(hook: KVCacheHook, params: Any, length: int, replies: bool = True) -> Context:
    """Reading through the KV cache: a prefill, then ``extend`` chunks. Without an env's
    ``replies`` (a one-turn episode) a hook without ``extend`` (``prefill`` and ``decode``
    only) will do: every feed is one sampled token, fed by ``decode``."""
    if hook.extend is None and replies:
        raise ValueError(
            "multi-turn rollouts through the KV cache need KVCacheHook.extend (feeding a "
            "masked chunk); pass the model's policy_apply to recompute instead"
        )

    def start(prompt: Tokens) -> tuple[Any, jax.Array]:
        logits, cache = hook.prefill(params, prompt.tokens, prompt.mask, length)
        return cache, logits

    def feed(cache: Any, tokens: jax.Array, mask: jax.Array, column: Any):
        if hook.extend is not None:
            logits, cache = hook.extend(params, cache, tokens, mask, column)
            return cache, logits
        # a token after a row's end is fed too: nothing reads that row's logits again
        logits, cache = hook.decode(params, cache, tokens[:, 0], column)
        return cache, logits[:, None]

    return Context(start, feed)


def episode_context(
    model: KVCacheHook | PolicyApply, params: Any, length: int, pad_id: int, replies: bool = True
) -> Context:
    """Reading through the KV cache where ``model`` is a ``KVCacheHook`` (``cached_context``),
    else by recomputation with ``model`` as the ``policy_apply`` (``recomputed_context``)."""
    if isinstance(model, KVCacheHook):
        return cached_context(model, params, length, replies)
    return recomputed_context(model, params, length, pad_id)


def recomputed_context(policy_apply: PolicyApply, params: Any, length: int, pad_id: int):
    """Reading by full forward passes over a [B, L] buffer of tokens and mask."""

    def start(prompt: Tokens) -> tuple[Any, jax.Array]:
        batch_size, prompt_len = prompt.tokens.shape
        rest = (batch_size, length - prompt_len)
        tokens = jnp.concatenate([prompt.tokens, jnp.full(rest, pad_id, jnp.int32)], axis=1)
        mask = jnp.concatenate([prompt.mask, jnp.zeros(rest, bool)], axis=1)
        return (tokens, mask), policy_apply(params, tokens, mask)[:, prompt_len - 1]

    def feed(buffer: Any, tokens: jax.Array, mask: jax.Array, column: Any):
        buffer = tuple(
            jax.lax.dynamic_update_slice_in_dim(whole, part, column, axis=1)
            for whole, part in zip(buffer, (tokens, mask), strict=True)
        )
        logits = policy_apply(params, *buffer)
        return buffer, jax.lax.dynamic_slice_in_dim(logits, column, tokens.shape[1], axis=1)

    return Context(start, feed)
