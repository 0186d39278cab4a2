"""Sampling with a KV cache (``lax.scan``) and the matching full-forward log-probabilities."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ppojax.rlhf.model import KVCache, TransformerLM, init_cache
from ppojax.rlhf.task import EOS, PAD


class Samples(NamedTuple):
    """Sampled responses [B, R], their log-probs [B, R] (0 on padding) and mask [B, R]."""

    tokens: jax.Array
    log_probs: jax.Array
    mask: jax.Array


class DecodeCarry(NamedTuple):
    cache: KVCache
    logits: jax.Array  # [B, V], next-token logits at the last fed position
    done: jax.Array  # [B] bool, EOS already emitted
    position: jax.Array  # where the next fed token goes


def decode_step(
    model: TransformerLM,
    params: dict,
    temperature: float | jax.Array,
    carry: DecodeCarry,
    key: jax.Array,
) -> tuple[DecodeCarry, tuple[jax.Array, jax.Array, jax.Array]]:
    """Draw token ~ softmax(logits / temperature), PAD once done, then feed it to the cache."""
    scaled = jax.nn.log_softmax(carry.logits / temperature, axis=-1)
    token = jax.random.categorical(key, scaled)
    log_prob = jnp.take_along_axis(scaled, token[:, None], axis=1)[:, 0]
    real = ~carry.done
    token = jnp.where(real, token, PAD)
    log_prob = jnp.where(real, log_prob, 0.0)
    logits, _, cache = model.apply(params, token[:, None], carry.cache, carry.position)
    done = carry.done | (token == EOS)
    return DecodeCarry(cache, logits[:, 0], done, carry.position + 1), (token, log_prob, real)


def sample_responses(
    model: TransformerLM,
    params: dict,
    prompts: jax.Array,
    key: jax.Array,
    response_len: int,
    temperature: float | jax.Array,
) -> Samples:
    """Responses [B, R] sampled autoregressively after prompts [B, P]; PAD after EOS."""
    batch_size, prompt_len = prompts.shape
    cache = init_cache(
        batch_size, prompt_len + response_len, model.num_layers, model.d_model, model.num_heads
    )
    logits, _, cache = model.apply(params, prompts, cache, 0)
    carry = DecodeCarry(
        cache, logits[:, -1], jnp.zeros((batch_size,), bool), jnp.asarray(prompt_len)
    )

    def step(carry: DecodeCarry, step_key: jax.Array):
        return decode_step(model, params, temperature, carry, step_key)

    _, (tokens, log_probs, mask) = jax.lax.scan(step, carry, jax.random.split(key, response_len))
    return Samples(tokens.T, log_probs.T, mask.T)


class TokenStats(NamedTuple):
    """Per response token [B, R]: log pi(token), entropy of pi, value of the state before it."""

    log_probs: jax.Array
    entropy: jax.Array
    values: jax.Array


def response_stats(
    model: TransformerLM,
    params: dict,
    prompts: jax.Array,
    responses: jax.Array,
    temperature: float | jax.Array,
) -> TokenStats:
    """One full forward pass over [prompt, response]: log softmax(logits / temperature) of each
    response token, its entropy, and V at the position that predicts it, all [B, R]."""
    prompt_len = prompts.shape[1]
    tokens = jnp.concatenate([prompts, responses[:, :-1]], axis=1)
    logits, values, _ = model.apply(params, tokens)
    log_softmax = jax.nn.log_softmax(logits[:, prompt_len - 1 :] / temperature, axis=-1)
    log_probs = jnp.take_along_axis(log_softmax, responses[..., None], axis=-1)[..., 0]
    entropy = -(jnp.exp(log_softmax) * log_softmax).sum(axis=-1)
    return TokenStats(log_probs, entropy, values[:, prompt_len - 1 :])
