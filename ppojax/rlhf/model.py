"""A small causal transformer language model with a scalar value head and a KV cache.

One code path serves training and sampling: ``TransformerLM(tokens, cache, start)`` writes the
keys and values of the chunk ``tokens`` [B, S] (at positions start..start+S-1) into the cache
and attends over every cached position up to its own. A full forward pass is the call with an
empty cache of length S and start 0; sampling prefills the prompt and then feeds one token per
step, so cached and uncached log-probabilities agree to float rounding.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from ppojax.rlhf.config import RLHFConfig

# A large finite number instead of -inf keeps softmax free of NaN while giving masked keys a
# weight of exactly 0.
MASKED_SCORE = -1e30


class KVCache(NamedTuple):
    """Cached attention keys and values, each [num_layers, B, L, num_heads, head_dim]."""

    keys: jax.Array
    values: jax.Array


def init_cache(
    batch_size: int, length: int, num_layers: int, d_model: int, num_heads: int
) -> KVCache:
    """An all-zero cache [num_layers, B, length, H, d_model / H]."""
    shape = (num_layers, batch_size, length, num_heads, d_model // num_heads)
    return KVCache(jnp.zeros(shape, jnp.float32), jnp.zeros(shape, jnp.float32))


class CausalSelfAttention(nn.Module):
    """Multi-head attention of the chunk x [B, S, D] over the cache [B, L, H, Dh]."""

    num_heads: int

    @nn.compact
    def __call__(
        self, x: jax.Array, keys: jax.Array, values: jax.Array, start: jax.Array | int
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        batch_size, chunk, d_model = x.shape
        head_dim = d_model // self.num_heads
        qkv = nn.Dense(3 * d_model, use_bias=False, name="qkv")(x)
        qkv = qkv.reshape(batch_size, chunk, 3, self.num_heads, head_dim)
        keys = jax.lax.dynamic_update_slice(keys, qkv[:, :, 1], (0, start, 0, 0))
        values = jax.lax.dynamic_update_slice(values, qkv[:, :, 2], (0, start, 0, 0))
        query_positions = start + jnp.arange(chunk)
        visible = jnp.arange(keys.shape[1])[None, :] <= query_positions[:, None]
        scores = jnp.einsum("bshd,blhd->bhsl", qkv[:, :, 0], keys) / math.sqrt(head_dim)
        weights = jax.nn.softmax(jnp.where(visible, scores, MASKED_SCORE), axis=-1)
        attended = jnp.einsum("bhsl,blhd->bshd", weights, values)
        out = nn.Dense(d_model, name="out")(attended.reshape(batch_size, chunk, d_model))
        return out, keys, values


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(LN x), then x + MLP(LN x)."""

    num_heads: int

    @nn.compact
    def __call__(
        self, x: jax.Array, keys: jax.Array, values: jax.Array, start: jax.Array | int
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        d_model = x.shape[-1]
        attended, keys, values = CausalSelfAttention(self.num_heads)(
            nn.LayerNorm()(x), keys, values, start
        )
        x = x + attended
        hidden = nn.gelu(nn.Dense(4 * d_model)(nn.LayerNorm()(x)))
        return x + nn.Dense(d_model)(hidden), keys, values


class TransformerLM(nn.Module):
    """Causal LM: tokens [B, S] -> next-token logits [B, S, V], values [B, S], updated cache."""

    vocab_size: int
    max_len: int
    d_model: int
    num_heads: int
    num_layers: int

    @nn.compact
    def __call__(
        self, tokens: jax.Array, cache: KVCache | None = None, start: jax.Array | int = 0
    ) -> tuple[jax.Array, jax.Array, KVCache]:
        batch_size, chunk = tokens.shape
        if cache is None:
            cache = init_cache(batch_size, chunk, self.num_layers, self.d_model, self.num_heads)
        positions = self.param(
            "position_embedding", nn.initializers.normal(0.02), (self.max_len, self.d_model)
        )
        x = nn.Embed(self.vocab_size, self.d_model)(tokens)
        x = x + jax.lax.dynamic_slice_in_dim(positions, start, chunk)[None]
        new_keys, new_values = [], []
        for layer in range(self.num_layers):
            x, keys, values = Block(self.num_heads)(
                x, cache.keys[layer], cache.values[layer], start
            )
            new_keys.append(keys)
            new_values.append(values)
        x = nn.LayerNorm()(x)
        logits = nn.Dense(self.vocab_size, name="lm_head")(x)
        value = nn.Dense(1, kernel_init=nn.initializers.zeros, name="value_head")(x)[..., 0]
        return logits, value, KVCache(jnp.stack(new_keys), jnp.stack(new_values))


def build_model(config: RLHFConfig) -> TransformerLM:
    """The policy / reference / reward / critic architecture that ``config`` describes."""
    return TransformerLM(
        vocab_size=config.vocab_size,
        max_len=config.max_len,
        d_model=config.d_model,
        num_heads=config.num_heads,
        num_layers=config.num_layers,
    )


def init_model_params(config: RLHFConfig, key: jax.Array) -> dict:
    """Fresh parameters of ``build_model(config)``."""
    tokens = jnp.zeros((1, config.max_len), jnp.int32)
    return build_model(config).init(key, tokens)
