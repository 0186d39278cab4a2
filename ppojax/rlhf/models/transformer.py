"""A small causal transformer LM with a value head and a KV cache, in the library's contract.

``transformer(...)`` returns the pieces ``make_trainer`` takes: ``policy_apply(params, tokens,
mask) -> logits`` (a ``SplitPolicy``: its hidden states and head apart too),
``critic_apply(params, tokens, mask) -> values`` (the value head, on the policy's own params
or on a copy) and the ``KVCacheHook`` for fast sampling. It respects the mask: positions
count real tokens only and padded keys are never attended to, so a prompt left-padded to any
width gives the same logits at its real tokens.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from ppojax.rlhf.core.logprobs import SplitPolicy
from ppojax.rlhf.core.sampling import KVCacheHook
from ppojax.rlhf.models.decoder import MASKED_SCORE, KVCache, Slot


def empty_cache(batch_size: int, length: int, num_layers: int, d_model: int, heads: int) -> KVCache:
    """An all-zero cache of ``length`` positions."""
    shape = (num_layers, batch_size, length, heads, d_model // heads)
    zeros = jnp.zeros(shape, jnp.float32)
    return KVCache(zeros, zeros, jnp.zeros((batch_size, length), bool), jnp.zeros(batch_size, int))


class LayerKV(NamedTuple):
    """One layer's slice of the cache: keys and values [B, L, H, Dh], which travel together."""

    keys: jax.Array
    values: jax.Array


class CausalSelfAttention(nn.Module):
    """Multi-head attention of the chunk x [B, S, D] (at ``slot``) over the cache."""

    num_heads: int

    @nn.compact
    def __call__(self, x: jax.Array, kv: LayerKV, slot: Slot) -> tuple[jax.Array, LayerKV]:
        start, key_mask = slot.start, slot.key_mask
        batch_size, chunk, d_model = x.shape
        head_dim = d_model // self.num_heads
        qkv = nn.Dense(3 * d_model, use_bias=False, name="qkv")(x)
        qkv = qkv.reshape(batch_size, chunk, 3, self.num_heads, head_dim)
        keys = jax.lax.dynamic_update_slice(kv.keys, qkv[:, :, 1], (0, start, 0, 0))
        values = jax.lax.dynamic_update_slice(kv.values, qkv[:, :, 2], (0, start, 0, 0))
        query_index = (start + jnp.arange(chunk))[:, None]
        key_index = jnp.arange(keys.shape[1])[None, :]
        # Each query sees its own key too, so a padded query has a finite, unused output.
        visible = ((key_index <= query_index) & key_mask[:, None, None, :]) | (
            key_index == query_index
        )
        scores = jnp.einsum("bshd,blhd->bhsl", qkv[:, :, 0], keys) / math.sqrt(head_dim)
        weights = jax.nn.softmax(jnp.where(visible, scores, MASKED_SCORE), axis=-1)
        attended = jnp.einsum("bhsl,blhd->bshd", weights, values)
        out = nn.Dense(d_model, name="out")(attended.reshape(batch_size, chunk, d_model))
        return out, LayerKV(keys, values)


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(LN x), then x + MLP(LN x)."""

    num_heads: int

    @nn.compact
    def __call__(self, x: jax.Array, kv: LayerKV, slot: Slot) -> tuple[jax.Array, LayerKV]:
        attended, kv = CausalSelfAttention(self.num_heads)(nn.LayerNorm()(x), kv, slot)
        x = x + attended
        hidden = nn.gelu(nn.Dense(4 * x.shape[-1], name="mlp_in")(nn.LayerNorm()(x)))
        return x + nn.Dense(x.shape[-1], name="mlp_out")(hidden), kv


class TransformerLM(nn.Module):
    """tokens [B, S], mask [B, S] -> logits [B, S, V] (the final hidden states [B, S, D] with
    ``logits=False``), values [B, S], the updated cache.

    Without a cache the call is a full forward pass; with one, the chunk is written at
    ``start`` and attends over every real cached position up to its own."""

    vocab_size: int
    max_len: int
    d_model: int
    num_heads: int
    num_layers: int

    @nn.compact
    def __call__(
        self,
        tokens: jax.Array,
        mask: jax.Array,
        cache: KVCache | None = None,
        start: Any = 0,
        logits: bool = True,
    ) -> tuple[jax.Array, jax.Array, KVCache]:
        batch_size, chunk = tokens.shape
        mask = mask.astype(bool)
        if cache is None:
            cache = empty_cache(batch_size, chunk, self.num_layers, self.d_model, self.num_heads)
        key_mask = jax.lax.dynamic_update_slice(cache.mask, mask, (0, start))
        position_ids = cache.count[:, None] + jnp.cumsum(mask, axis=1) - 1
        position_ids = jnp.clip(position_ids, 0, self.max_len - 1)
        positions = self.param(
            "position_embedding", nn.initializers.normal(0.02), (self.max_len, self.d_model)
        )
        x = nn.Embed(self.vocab_size, self.d_model)(tokens) + positions[position_ids]
        slot = Slot(start, key_mask, position_ids)
        layers = []
        for layer in range(self.num_layers):
            kv = LayerKV(cache.keys[layer], cache.values[layer])
            x, kv = Block(self.num_heads)(x, kv, slot)
            layers.append(kv)
        x = nn.LayerNorm()(x)
        value = nn.Dense(1, kernel_init=nn.initializers.zeros, name="value_head")(x)[..., 0]
        count = cache.count + mask.sum(axis=1)
        keys, values = jax.tree.map(lambda *per_layer: jnp.stack(per_layer), *layers)
        out = nn.Dense(self.vocab_size, name="lm_head")(x) if logits else x
        return out, value, KVCache(keys, values, key_mask, count)


class LanguageModel(NamedTuple):
    """The built-in transformer in ``make_trainer``'s contract."""

    module: TransformerLM
    policy_apply: Any
    critic_apply: Any
    kv_cache: KVCacheHook

    def init(self, key: jax.Array) -> dict:
        """Fresh parameters (value head at 0)."""
        tokens = jnp.zeros((1, self.module.max_len), jnp.int32)
        return self.module.init(key, tokens, jnp.ones_like(tokens, bool))


def transformer(
    vocab_size: int, max_len: int, d_model: int = 64, num_heads: int = 4, num_layers: int = 2
) -> LanguageModel:
    """The built-in LM: ``policy_apply``, ``critic_apply`` (value head), ``kv_cache``."""
    module = TransformerLM(vocab_size, max_len, d_model, num_heads, num_layers)

    def logits(params: dict, tokens: jax.Array, mask: jax.Array) -> jax.Array:
        return module.apply(params, tokens, mask)[0]

    def hidden(params: dict, tokens: jax.Array, mask: jax.Array) -> jax.Array:
        return module.apply(params, tokens, mask, logits=False)[0]

    def head(params: dict, hidden: jax.Array) -> jax.Array:
        dense = params["params"]["lm_head"]
        return jnp.dot(hidden, dense["kernel"]) + dense["bias"]

    def critic_apply(params: dict, tokens: jax.Array, mask: jax.Array) -> jax.Array:
        return module.apply(params, tokens, mask)[1]

    def prefill(
        params: dict, prompts: jax.Array, prompt_mask: jax.Array, total_len: int
    ) -> tuple[jax.Array, KVCache]:
        cache = empty_cache(prompts.shape[0], total_len, num_layers, d_model, num_heads)
        logits, _, cache = module.apply(params, prompts, prompt_mask, cache, 0)
        return logits[:, -1], cache

    def decode(
        params: dict, cache: KVCache, tokens: jax.Array, index: Any
    ) -> tuple[jax.Array, KVCache]:
        mask = jnp.ones((tokens.shape[0], 1), bool)
        logits, _, cache = module.apply(params, tokens[:, None], mask, cache, index)
        return logits[:, 0], cache

    def extend(
        params: dict, cache: KVCache, tokens: jax.Array, mask: jax.Array, start: Any
    ) -> tuple[jax.Array, KVCache]:
        logits, _, cache = module.apply(params, tokens, mask, cache, start)
        return logits, cache

    hook = KVCacheHook(prefill, decode, extend)
    return LanguageModel(module, SplitPolicy(logits, hidden, head), critic_apply, hook)


def zero_value_head(params: dict) -> dict:
    """``params`` with the value head reset to 0, so a critic copied from it starts at V = 0."""
    head = params["params"]["value_head"]
    return {"params": {**params["params"], "value_head": jax.tree.map(jnp.zeros_like, head)}}
