"""A small causal transformer LM with a value head and a KV cache, in the library's contract.

``transformer(...)`` returns the pieces ``make_trainer`` takes: ``policy_apply(params, tokens,
mask) -> logits`` (a ``SplitPolicy``: its hidden states and head apart too),
``critic_apply(params, tokens, mask) -> values`` (the value head, on the policy's own params
or on a copy) and the ``KVCacheHook`` for fast sampling. It respects the mask: positions
count real tokens only and padded keys are never attended to, so a prompt left-padded to any
width gives the same logits at its real tokens.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from ppojax.rlhf.core.logprobs import SplitPolicy
from ppojax.rlhf.core.sampling import KVCacheHook
from ppojax.rlhf.models import attention
from ppojax.rlhf.models.decoder import KVCache, Slot


def empty_cache(
    batch_size: int, length: int, num_layers: int, d_model: int, heads: int, dtype: Any
) -> KVCache:
    """An all-zero cache of ``length`` positions in the compute dtype: a [B, L, H, Dh] buffer
    per layer, batch first in every leaf (the decoder's layout; a group's rows copy it)."""
    shape = (batch_size, length, heads, d_model // heads)
    zeros = tuple(jnp.zeros(shape, dtype) for _ in range(num_layers))
    return KVCache(zeros, zeros, jnp.zeros((batch_size, length), bool), jnp.zeros(batch_size, int))


class LayerKV(NamedTuple):
    """One layer's slice of the cache: keys and values [B, L, H, Dh], which travel together."""

    keys: jax.Array
    values: jax.Array


def dense(features: int, name: str, dtype: Any, bias: bool = True, **kwargs: Any) -> nn.Dense:
    """A Dense layer computing and storing in ``dtype``."""
    return nn.Dense(features, use_bias=bias, dtype=dtype, param_dtype=dtype, name=name, **kwargs)


def layer_norm(dtype: Any) -> nn.LayerNorm:
    """LayerNorm in ``dtype`` (flax computes its statistics in float32)."""
    return nn.LayerNorm(dtype=dtype, param_dtype=dtype)


class CausalSelfAttention(nn.Module):
    """Multi-head attention of the chunk x [B, S, D] (at ``slot``) over the cache."""

    num_heads: int
    dtype: Any = jnp.float32
    block: int = attention.DEFAULT_BLOCK

    @nn.compact
    def __call__(self, x: jax.Array, kv: LayerKV, slot: Slot) -> tuple[jax.Array, LayerKV]:
        start, dtype = slot.start, self.dtype
        batch_size, chunk, d_model = x.shape
        head_dim = d_model // self.num_heads
        qkv = dense(3 * d_model, "qkv", dtype, bias=False)(x)
        qkv = qkv.reshape(batch_size, chunk, 3, self.num_heads, head_dim)
        keys = jax.lax.dynamic_update_slice(kv.keys, qkv[:, :, 1], (0, start, 0, 0))
        values = jax.lax.dynamic_update_slice(kv.values, qkv[:, :, 2], (0, start, 0, 0))
        scores = attention.Scores(attention.default_scale(head_dim), block=self.block)
        attended = attention.attend(qkv[:, :, 0], keys, values, slot.key_mask, start, scores)
        return dense(d_model, "out", dtype)(attended), LayerKV(keys, values)


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(LN x), then x + MLP(LN x)."""

    num_heads: int
    dtype: Any = jnp.float32
    block: int = attention.DEFAULT_BLOCK

    @nn.compact
    def __call__(self, x: jax.Array, kv: LayerKV, slot: Slot) -> tuple[jax.Array, LayerKV]:
        dtype = self.dtype
        attention_ = CausalSelfAttention(self.num_heads, dtype, self.block)
        attended, kv = attention_(layer_norm(dtype)(x), kv, slot)
        x = x + attended
        hidden = nn.gelu(dense(4 * x.shape[-1], "mlp_in", dtype)(layer_norm(dtype)(x)))
        return x + dense(x.shape[-1], "mlp_out", dtype)(hidden), kv


class TransformerLM(nn.Module):
    """tokens [B, S], mask [B, S] -> logits [B, S, V] (the final hidden states [B, S, D] with
    ``logits=False``), values [B, S], the updated cache.

    Without a cache the call is a full forward pass; with one, the chunk is written at
    ``start`` and attends over every real cached position up to its own. ``dtype``: the
    params' and the compute's (a trainer keeps float32 masters of bf16 params);
    ``attention_block``: see ``ppojax.rlhf.models.attention`` (0: the whole score matrix)."""

    vocab_size: int
    max_len: int
    d_model: int
    num_heads: int
    num_layers: int
    dtype: Any = jnp.float32
    attention_block: int = attention.DEFAULT_BLOCK

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
        dtype = self.dtype
        if cache is None:
            cache = empty_cache(
                batch_size, chunk, self.num_layers, self.d_model, self.num_heads, dtype
            )
        key_mask = jax.lax.dynamic_update_slice(cache.mask, mask, (0, start))
        position_ids = cache.count[:, None] + jnp.cumsum(mask, axis=1) - 1
        position_ids = jnp.clip(position_ids, 0, self.max_len - 1)
        positions = self.param(
            "position_embedding", nn.initializers.normal(0.02), (self.max_len, self.d_model), dtype
        )
        embed = nn.Embed(self.vocab_size, self.d_model, dtype=dtype, param_dtype=dtype)
        x = embed(tokens) + positions[position_ids].astype(dtype)
        slot = Slot(start, key_mask, position_ids)
        layers = []
        for layer in range(self.num_layers):
            kv = LayerKV(cache.keys[layer], cache.values[layer])
            x, kv = Block(self.num_heads, dtype, self.attention_block)(x, kv, slot)
            layers.append(kv)
        x = layer_norm(dtype)(x)
        value = dense(1, "value_head", dtype, kernel_init=nn.initializers.zeros)(x)[..., 0]
        count = cache.count + mask.sum(axis=1)
        keys, values = tuple(kv.keys for kv in layers), tuple(kv.values for kv in layers)
        out = dense(self.vocab_size, "lm_head", dtype)(x) if logits else x
        return out, value.astype(jnp.float32), KVCache(keys, values, key_mask, count)


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
    vocab_size: int,
    max_len: int,
    d_model: int = 64,
    num_heads: int = 4,
    num_layers: int = 2,
    dtype: Any = jnp.float32,
    attention_block: int = attention.DEFAULT_BLOCK,
) -> LanguageModel:
    """The built-in LM: ``policy_apply``, ``critic_apply`` (value head), ``kv_cache``; params
    and compute in ``dtype`` ("bfloat16" or a jnp dtype)."""
    dtype = jnp.dtype(dtype)
    module = TransformerLM(
        vocab_size, max_len, d_model, num_heads, num_layers, dtype, attention_block
    )

    def logits(params: dict, tokens: jax.Array, mask: jax.Array) -> jax.Array:
        return module.apply(params, tokens, mask)[0]

    def hidden(params: dict, tokens: jax.Array, mask: jax.Array) -> jax.Array:
        return module.apply(params, tokens, mask, logits=False)[0]

    def head(params: dict, hidden: jax.Array) -> jax.Array:
        dense = params["params"]["lm_head"]
        return jnp.dot(hidden, dense["kernel"].astype(hidden.dtype)) + dense["bias"].astype(
            hidden.dtype
        )

    def critic_apply(params: dict, tokens: jax.Array, mask: jax.Array) -> jax.Array:
        return module.apply(params, tokens, mask)[1]

    def prefill(
        params: dict, prompts: jax.Array, prompt_mask: jax.Array, total_len: int
    ) -> tuple[jax.Array, KVCache]:
        cache = empty_cache(prompts.shape[0], total_len, num_layers, d_model, num_heads, dtype)
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
