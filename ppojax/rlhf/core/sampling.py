"""Sampling responses from any causal LM, and the log-probs the loss recomputes.

A policy is ``policy_apply(params, tokens [B, L], mask [B, L]) -> logits [B, L, V]``, causal:
logits at position i depend on tokens[: i + 1] only. Sequences are a left-padded prompt [B, P]
followed by the response [B, R], so the logits at P - 1 + t predict response token t for
every row. ``sample_responses`` decodes in one of two ways, which give the same tokens for
the same key:

- full recomputation (``model`` a ``policy_apply``): at each of the R steps one forward pass
  over the whole [B, P + R] buffer (not yet sampled positions hold pad_id with mask 0;
  causality keeps them out). Correct for every model, at R full passes.
- through the KV cache (``model`` a ``KVCacheHook`` the model provides): ``prefill`` once
  over the prompt and ``decode`` one token per step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ppojax.rlhf.core import sharding

PolicyApply = Callable[[Any, jax.Array, jax.Array], jax.Array]


class KVCacheHook(NamedTuple):
    """A model's fast path for sampling.

    ``prefill(params, prompts [B, P], prompt_mask [B, P], total_len) -> (logits [B, V], cache)``
    gives the next-token logits after the prompt; ``decode(params, cache, tokens [B],
    index) -> (logits [B, V], cache)`` feeds the token at sequence position ``index``.
    ``extend(params, cache, tokens [B, S], mask [B, S], start) -> (logits [B, S, V], cache)``
    (optional, for multi-turn episodes) feeds a chunk at positions ``start`` + [0, S), only
    its real tokens (mask True) becoming keys later positions attend to. Every leaf of a
    cache has the batch as its first axis: a group of responses to one prompt copies the
    prompt's prefilled rows (``sample_responses``'s ``group_size``).
    """

    prefill: Callable[..., tuple[jax.Array, Any]]
    decode: Callable[..., tuple[jax.Array, Any]]
    extend: Callable[..., tuple[jax.Array, Any]] | None = None


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
    """What a sampler draws: ``response_len`` tokens at ``temperature`` (may be traced), a
    response ending at its first ``eos_id`` and ``pad_id`` after it."""

    response_len: int
    temperature: Any
    pad_id: int
    eos_id: int


class Samples(NamedTuple):
    """Responses [B, R] (pad_id after EOS), their sampling log-probs [B, R] (0 off the mask)
    and the response mask [B, R] (True up to and including the first EOS)."""

    tokens: jax.Array
    log_probs: jax.Array
    mask: jax.Array


def choose(
    logits: jax.Array, key: jax.Array, done: jax.Array, settings: SamplingSettings
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """token ~ softmax(logits [B, V] / temperature), pad_id where ``done``; its log-prob (0
    where done) and whether it is real, each [B]."""
    scaled = jax.nn.log_softmax(logits / settings.temperature, axis=-1)
    token = jax.random.categorical(key, scaled)
    log_prob = jnp.take_along_axis(scaled, token[:, None], axis=1)[:, 0]
    real = ~done
    return jnp.where(real, token, settings.pad_id), jnp.where(real, log_prob, 0.0), real


def sample_loop(
    logits_of: Callable[[Any, jax.Array], jax.Array],
    feed: Callable[[Any, jax.Array, jax.Array, jax.Array], Any],
    state: Any,
    key: jax.Array,
    batch_size: int,
    settings: SamplingSettings,
) -> Samples:
    """R = ``response_len`` tokens, one per step t: ``logits_of(state, t)`` [B, V] is the
    next-token distribution, ``choose`` draws from it with step t's key, and ``state =
    feed(state, t, token, real)``. Both decodings run this loop, so for the same key they draw
    from the same keys and stop at the same EOS."""

    def step(carry, inputs):
        state, done = carry
        index, step_key = inputs
        token, log_prob, real = choose(logits_of(state, index), step_key, done, settings)
        state = feed(state, index, token, real)
        return (state, done | (token == settings.eos_id)), (token, log_prob, real)

    start = (state, jnp.zeros((batch_size,), bool))
    steps = settings.response_len
    inputs = (jnp.arange(steps), jax.random.split(key, steps))
    _, (sampled, log_probs, real) = jax.lax.scan(step, start, inputs)
    return Samples(sampled.T, log_probs.T, real.T)


def sample_responses(
    model: KVCacheHook | PolicyApply,
    params: Any,
    prompts: jax.Array,
    prompt_mask: jax.Array,
    key: jax.Array,
    settings: SamplingSettings,
    group_size: int = 1,
) -> Samples:
    """Responses [B * group_size, R] to prompts [B, P], each prompt answered ``group_size``
    times (its rows adjacent): through the model's KV cache when ``model`` is a
    ``KVCacheHook`` (one prefill, then R one-token decodes), else by full recomputation with
    ``model`` as the ``policy_apply`` (R forward passes over [B * group_size, P + R]).

    Through the cache a prompt is prefilled once and its cache and next-token logits copied to
    its group's rows, where repeating the prompt first ran it through the model group_size
    times; the rows are the same, so the responses for a key are too."""
    if isinstance(model, KVCacheHook):
        hook = model
        prompt_len = prompts.shape[1]
        total_len = prompt_len + settings.response_len
        start = hook.prefill(params, prompts, prompt_mask, total_len)
        if group_size > 1:
            start = jax.tree.map(lambda x: jnp.repeat(x, group_size, axis=0), start)
            start = sharding.rows_split(start)  # over a mesh, as the prompts' rows are
        batch_size = prompts.shape[0] * group_size

        def logits_of(state, index):
            return state[0]

        def feed(state, index, token, real):
            return hook.decode(params, state[1], token, prompt_len + index)

        return sample_loop(logits_of, feed, start, key, batch_size, settings)

    if group_size > 1:
        prompts = jnp.repeat(prompts, group_size, axis=0)
        prompt_mask = jnp.repeat(prompt_mask, group_size, axis=0)
    batch_size, prompt_len = prompts.shape
    response = (batch_size, settings.response_len)
    tokens = jnp.concatenate([prompts, jnp.full(response, settings.pad_id, prompts.dtype)], axis=1)
    mask = jnp.concatenate([prompt_mask.astype(bool), jnp.zeros(response, bool)], axis=1)

    def recomputed_logits(buffer: tuple[jax.Array, jax.Array], index: jax.Array) -> jax.Array:
        logits = model(params, *buffer)
        return jax.lax.dynamic_index_in_dim(logits, prompt_len - 1 + index, 1, keepdims=False)

    def write(buffer, index, token, real):
        tokens, mask = buffer
        tokens = jax.lax.dynamic_update_index_in_dim(tokens, token, prompt_len + index, 1)
        mask = jax.lax.dynamic_update_index_in_dim(mask, real, prompt_len + index, 1)
        return tokens, mask

    return sample_loop(recomputed_logits, write, (tokens, mask), key, batch_size, settings)


class Sequences(NamedTuple):
    """What a model reads to judge responses: prompts [B, P] left-padded and their mask, each
    followed by its response [B, R] and the response mask (True on its real tokens). A
    pytree, so it crosses jit and vmap as one argument."""

    prompts: jax.Array
    prompt_mask: jax.Array
    responses: jax.Array
    response_mask: jax.Array

    def model_input(self) -> tuple[jax.Array, jax.Array]:
        """The model's input: tokens [B, P + R] and mask [B, P + R]."""
        prompts, prompt_mask, responses, response_mask = self
        tokens = jnp.concatenate([prompts, responses.astype(prompts.dtype)], axis=1)
        mask = jnp.concatenate([prompt_mask.astype(bool), response_mask.astype(bool)], axis=1)
        return tokens, mask

    def response_positions(self, values: jax.Array) -> jax.Array:
        """``values`` [B, P + R, ...] at the positions P - 1 + t that predict response token t."""
        prompt_len, response_len = self.prompts.shape[1], self.responses.shape[1]
        return values[:, prompt_len - 1 : prompt_len - 1 + response_len]


class TokenStats(NamedTuple):
    """Per response token [B, R]: log pi(token) at the temperature, and the entropy of pi."""

    log_probs: jax.Array
    entropy: jax.Array


def response_stats(
    policy_apply: PolicyApply, params: Any, sequences: Sequences, temperature: Any
) -> TokenStats:
    """One forward pass over [prompt, response]: log softmax(logits / temperature) of each
    response token and its entropy, both [B, R] (the logits at P - 1 + t predict token t)."""
    logits = sequences.response_positions(policy_apply(params, *sequences.model_input()))
    return token_stats(logits, sequences.responses, temperature)


def token_stats(logits: jax.Array, tokens: jax.Array, temperature: Any) -> TokenStats:
    """log softmax(logits [..., V] / temperature) at ``tokens`` [...] and the entropy of
    that softmax, each [...]."""
    log_softmax = jax.nn.log_softmax(logits / temperature, axis=-1)
    log_probs = jnp.take_along_axis(log_softmax, tokens[..., None], axis=-1)[..., 0]
    entropy = -(jnp.exp(log_softmax) * log_softmax).sum(axis=-1)
    return TokenStats(log_probs, entropy)


def response_values(
    critic_apply: Callable[[Any, jax.Array, jax.Array], jax.Array],
    params: Any,
    sequences: Sequences,
) -> jax.Array:
    """V of the state before each response token [B, R]: the critic's values at P - 1 + t."""
    return sequences.response_positions(critic_apply(params, *sequences.model_input()))


def response_mask(responses: jax.Array, eos_id: int) -> jax.Array:
    """[B, R] bool: True up to and including the first eos_id (the tokens the policy chose)."""
    is_eos = responses == eos_id
    return (jnp.cumsum(is_eos, axis=1) - is_eos) == 0
