"""The synthetic sorting task and its programmatic gold scorer.

A prompt is ``BOS`` followed by ``prompt_len - 1`` distinct digit tokens in random order. The
ideal response is the same digits in ascending order, then ``EOS``. The gold score of a
response (the tokens before its first EOS, or all of them when there is none) is

    gold = #{i < min(n, K) : response_i = sorted(prompt)_i} / max(n, K),

with n the response length and K the number of prompt digits: 1 only for the exact sorted
answer closed by EOS, lower for every wrong, missing or extra token. The RL stage never sees
this score; it only logs it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

PAD = 0
BOS = 1
EOS = 2
FIRST_DIGIT = 3


def sample_prompts(key: jax.Array, batch_size: int, prompt_len: int, num_digits: int) -> jax.Array:
    """Prompts [B, prompt_len]: BOS then prompt_len - 1 distinct digits in random order."""
    keys = jax.random.split(key, batch_size)
    digits = jax.vmap(lambda k: jax.random.permutation(k, num_digits)[: prompt_len - 1])(keys)
    bos = jnp.full((batch_size, 1), BOS, jnp.int32)
    return jnp.concatenate([bos, digits.astype(jnp.int32) + FIRST_DIGIT], axis=1)


def target_responses(prompts: jax.Array, response_len: int) -> jax.Array:
    """Ideal responses [B, response_len]: sorted prompt digits, EOS, then PAD."""
    batch_size, prompt_len = prompts.shape
    sorted_digits = jnp.sort(prompts[:, 1:], axis=1)
    eos = jnp.full((batch_size, 1), EOS, jnp.int32)
    pad = jnp.full((batch_size, response_len - prompt_len), PAD, jnp.int32)
    return jnp.concatenate([sorted_digits, eos, pad], axis=1)


def response_mask(responses: jax.Array) -> jax.Array:
    """[B, R] bool: True up to and including the first EOS (the tokens the policy chose)."""
    is_eos = responses == EOS
    eos_before = jnp.cumsum(is_eos, axis=1) - is_eos
    return eos_before == 0


def has_eos(responses: jax.Array) -> jax.Array:
    """[B] bool: the response contains EOS."""
    return (responses == EOS).any(axis=1)


def content_length(responses: jax.Array) -> jax.Array:
    """[B] int: tokens before the first EOS (all R when there is none)."""
    is_eos = responses == EOS
    return jnp.where(is_eos.any(axis=1), jnp.argmax(is_eos, axis=1), responses.shape[1])


def gold_score(prompts: jax.Array, responses: jax.Array) -> jax.Array:
    """Gold score [B] in [0, 1]: matches with the sorted prompt digits / max(n, K)."""
    num_prompt_digits = prompts.shape[1] - 1
    sorted_digits = jnp.sort(prompts[:, 1:], axis=1)
    lengths = content_length(responses)
    inside = jnp.arange(num_prompt_digits)[None, :] < lengths[:, None]
    matches = ((responses[:, :num_prompt_digits] == sorted_digits) & inside).sum(axis=1)
    return matches / jnp.maximum(lengths, num_prompt_digits)
