"""``generate``: new tokens for a left-padded batch through the model's KV cache, jittable.

Each row stops at its first EOS and is padded with pad_id after it. ``temperature=0`` is
greedy; ``top_k`` keeps the k likeliest tokens and ``top_p`` the smallest set whose
probability reaches p (the likeliest token always stays).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

# Logits of the tokens top-k or top-p removes: finite, so softmax never sees -inf - -inf.
REMOVED = -1e30


def filter_logits(logits: jax.Array, top_k: int | None, top_p: float | None) -> jax.Array:
    """logits [B, V] with the tokens outside the top k / the top-p nucleus set to REMOVED."""
    if top_k is not None:
        kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
        logits = jnp.where(logits < kth, REMOVED, logits)
    if top_p is not None:
        ordered = jnp.sort(logits, axis=-1)[:, ::-1]
        probs = jax.nn.softmax(ordered, axis=-1)
        # A token stays while the probability of the tokens above it is below p.
        above = jnp.cumsum(probs, axis=-1) - probs
        kept = jnp.where(above < top_p, ordered, jnp.inf).min(axis=-1, keepdims=True)
        logits = jnp.where(logits < kept, REMOVED, logits)
    return logits


def pick(
    logits: jax.Array, key: jax.Array, temperature: float, top_k: int | None, top_p: float | None
) -> jax.Array:
    """The next token [B]: argmax at temperature 0, else a sample of the filtered softmax."""
    logits = logits.astype(jnp.float32)
    if temperature == 0:
        return jnp.argmax(logits, axis=-1)
    return jax.random.categorical(key, filter_logits(logits / temperature, top_k, top_p))


def generate(
    lm: Any,
    params: dict,
    tokens: jax.Array,
    mask: jax.Array,
    key: jax.Array,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> jax.Array:
    """New tokens [B, max_new_tokens] after the left-padded prompts tokens [B, P] (mask
    [B, P]); after a row's first EOS (any of the config's eos ids) it holds the pad id.
    ``temperature``, ``top_k``, ``top_p`` and ``max_new_tokens`` are static under jit."""
    batch_size, prompt_len = tokens.shape
    eos_ids = jnp.asarray(lm.config.eos_ids or (lm.tokenizer.eos_id,), jnp.int32)
    pad_id = lm.tokenizer.pad_id
    logits, cache = lm.kv_cache.prefill(params, tokens, mask, prompt_len + max_new_tokens)

    def step(carry: tuple, inputs: tuple) -> tuple[tuple, jax.Array]:
        logits, cache, done = carry
        index, step_key = inputs
        token = jnp.where(done, pad_id, pick(logits, step_key, temperature, top_k, top_p))
        logits, cache = lm.kv_cache.decode(params, cache, token, prompt_len + index)
        return (logits, cache, done | jnp.isin(token, eos_ids)), token

    start = (logits, cache, jnp.zeros((batch_size,), bool))
    inputs = (jnp.arange(max_new_tokens), jax.random.split(key, max_new_tokens))
    _, new_tokens = jax.lax.scan(step, start, inputs)
    return new_tokens.T.astype(tokens.dtype)
