"""One Flax decoder for Llama, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3 and GPT-2, with a KV
cache.

The parameter tree mirrors Hugging Face's names (``layers_0/self_attn/q_proj/kernel`` for
``model.layers.0.self_attn.q_proj.weight``), so LoRA targets read as PEFT's (``q_proj``,
``v_proj``, GPT-2's ``c_attn``). Left padding goes through the mask: padded keys are never
attended to and positions count real tokens only (position = cumsum(mask) - 1), so a prompt
padded to any width gives the same logits at its real tokens.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from ppojax.rlhf.core import remat
from ppojax.rlhf.models import attention, decode_attention
from ppojax.rlhf.models.config import DecoderConfig


class KVCache(NamedTuple):
    """Keys and values, one [B, L, KVH, Dh] array a layer, which positions hold real tokens
    [B, L] and how many real tokens were fed so far [B] (the next token's position id).

    A buffer per layer, not one [num_layers, ...] stack: in the sampling loop's carry XLA then
    writes each new token's keys in place, where slicing a layer out of a stack and stacking
    the layers again copied the whole cache several times a token (33.7 GiB a token against a
    1.2 GiB cache for Qwen2.5-0.5B, 64 rows of 1,536 tokens, compiled for an H100)."""

    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]
    mask: jax.Array
    count: jax.Array


class Slot(NamedTuple):
    """Where the S tokens of one call go in the cache: from position ``start``, the cache's key
    mask [B, L] with them written in, and their position ids [B, S]. The same for every
    layer."""

    start: Any
    key_mask: jax.Array
    positions: jax.Array


def empty_cache(config: DecoderConfig, batch_size: int, length: int, dtype: Any) -> KVCache:
    """An all-zero cache of ``length`` positions."""
    shape = (batch_size, length, config.num_kv_heads, config.head_dim)
    zeros = tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers))
    return KVCache(
        zeros, zeros, jnp.zeros((batch_size, length), bool), jnp.zeros(batch_size, jnp.int32)
    )


def inverse_frequencies(rope: dict[str, Any], dim: int) -> jax.Array:
    """RoPE's [dim / 2] angular frequencies, with linear or Llama 3 scaling."""
    inv_freq = 1.0 / (rope["rope_theta"] ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    if rope["rope_type"] == "linear":
        return inv_freq / rope["factor"]
    if rope["rope_type"] != "llama3":
        return inv_freq
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old_len = rope["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inv_freq
    # Long wavelengths are slowed down by ``factor``, short ones kept, those between blended.
    scaled = jnp.where(wavelength > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelength - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelength >= old_len / high) & (wavelength <= old_len / low)
    return jnp.where(medium, blended, scaled)


def rotate(x: jax.Array, positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
    """RoPE of x [B, S, H, Dh] at positions [B, S], in Hugging Face's half-split layout."""
    angles = positions[..., None].astype(jnp.float32) * inv_freq
    cos = jnp.cos(angles)[:, :, None, :].astype(x.dtype)
    sin = jnp.sin(angles)[:, :, None, :].astype(x.dtype)
    first, second = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


class RMSNorm(nn.Module):
    """x / rms(x) * scale, the statistics in float32 (as Hugging Face computes them); Gemma's
    (``plus_one``) multiplies by 1 + scale in float32, its scale starting at 0."""

    eps: float
    dtype: Any
    plus_one: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        init = nn.initializers.zeros if self.plus_one else nn.initializers.ones
        scale = self.param("scale", init, (x.shape[-1],), self.dtype)
        wide = x.astype(jnp.float32)
        normed = wide * jax.lax.rsqrt(jnp.mean(wide * wide, axis=-1, keepdims=True) + self.eps)
        if self.plus_one:
            return ((1.0 + scale.astype(jnp.float32)) * normed).astype(x.dtype)
        # the scale in x's dtype: float32 params under bf16 compute must not widen x
        return scale.astype(x.dtype) * normed.astype(x.dtype)


def norm(config: DecoderConfig, name: str, dtype: Any) -> nn.Module:
    """The family's normalization layer."""
    if config.norm == "layer":
        return nn.LayerNorm(config.norm_eps, dtype=dtype, param_dtype=dtype, name=name)
    return RMSNorm(config.norm_eps, dtype, plus_one=config.norm == "gemma", name=name)


def softcap(x: jax.Array, cap: float | None) -> jax.Array:
    """cap * tanh(x / cap) (Gemma 2's logit capping); x itself without a cap."""
    return x if cap is None else cap * jnp.tanh(x / cap)


def dense(features: int, bias: bool, name: str, dtype: Any) -> nn.Dense:
    """A Dense layer computing and storing in ``dtype``."""
    return nn.Dense(features, use_bias=bias, dtype=dtype, param_dtype=dtype, name=name)


def activation(config: DecoderConfig, x: jax.Array) -> jax.Array:
    """The MLP's nonlinearity: SiLU, exact GELU or its tanh approximation (GPT-2's gelu_new)."""
    if config.activation == "silu":
        return nn.silu(x)
    return nn.gelu(x, approximate=config.activation != "gelu")


def scores_of(config: DecoderConfig, index: int, block: int) -> attention.Scores:
    """How layer ``index`` makes its attention scores: the family's scale and softcap, the
    layer's window, ``block`` rows and columns at once (0: the plain form)."""
    scale = config.query_scale
    if scale is None:
        scale = attention.default_scale(config.head_dim)
    return attention.Scores(scale, config.attn_softcap, config.layer_window(index), block)


class Attention(nn.Module):
    """Self-attention of x [B, S, D] at ``slot``, writing its keys and values into the cache
    (keys and values None: no cache, the chunk attends over itself); ``index``: the layer's,
    for its window and RoPE."""

    config: DecoderConfig
    dtype: Any
    index: int = 0
    block: int = attention.DEFAULT_BLOCK

    def project(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Queries [B, S, H, Dh], keys and values [B, S, KVH, Dh]."""
        config, dtype = self.config, self.dtype
        batch_size, chunk, _ = x.shape
        q_width = config.num_heads * config.head_dim
        kv_width = config.num_kv_heads * config.head_dim
        if config.model_type == "gpt2":
            qkv = dense(q_width + 2 * kv_width, config.qkv_bias, "c_attn", dtype)(x)
            q, k, v = jnp.split(qkv, [q_width, q_width + kv_width], axis=-1)
        else:
            q = dense(q_width, config.qkv_bias, "q_proj", dtype)(x)
            k = dense(kv_width, config.qkv_bias, "k_proj", dtype)(x)
            v = dense(kv_width, config.qkv_bias, "v_proj", dtype)(x)
        q = q.reshape(batch_size, chunk, config.num_heads, config.head_dim)
        k = k.reshape(batch_size, chunk, config.num_kv_heads, config.head_dim)
        v = v.reshape(batch_size, chunk, config.num_kv_heads, config.head_dim)
        if config.qk_norm:
            q = norm(config, "q_norm", dtype)(q)
            k = norm(config, "k_norm", dtype)(k)
        return q, k, v

    @nn.compact
    def __call__(
        self, x: jax.Array, keys: jax.Array, values: jax.Array, slot: Slot
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        config, start = self.config, slot.start
        q, k, v = self.project(x)
        if config.positions == "rope":
            inv_freq = inverse_frequencies(config.layer_rope(self.index), config.head_dim)
            q, k = rotate(q, slot.positions, inv_freq), rotate(k, slot.positions, inv_freq)
        scores = scores_of(config, self.index, self.block)
        if keys is None:  # a full pass: the chunk's own keys are all there is
            keys, values = k.astype(self.dtype), v.astype(self.dtype)
            attended = attention.attend(q, keys, values, slot.key_mask, start, scores)
        else:
            # written into the cache and attended over it: a decoded token's in its kernel (a
            # kernels candidate), the cache updated in place there
            attended, keys, values = decode_attention.attend_cached(
                q, k, v, keys, values, slot.key_mask, start, scores
            )
        name = "c_proj" if config.model_type == "gpt2" else "o_proj"
        return dense(x.shape[-1], config.out_bias, name, self.dtype)(attended), keys, values


class MLP(nn.Module):
    """SwiGLU (Llama, Qwen) or a GELU MLP (GPT-2) of x [B, S, D]."""

    config: DecoderConfig
    dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        config, dtype = self.config, self.dtype
        width, bias = config.intermediate_size, config.mlp_bias
        if config.model_type == "gpt2":
            hidden = activation(config, dense(width, bias, "c_fc", dtype)(x))
            return dense(x.shape[-1], bias, "c_proj", dtype)(hidden)
        gate = activation(config, dense(width, bias, "gate_proj", dtype)(x))
        hidden = gate * dense(width, bias, "up_proj", dtype)(x)
        return dense(x.shape[-1], bias, "down_proj", dtype)(hidden)


class Layer(nn.Module):
    """Pre-norm block: x + attn(norm x), then x + mlp(norm x); with sandwich norms (Gemma)
    x + norm(attn(norm x)), then x + norm(mlp(norm x))."""

    config: DecoderConfig
    dtype: Any
    index: int = 0
    block: int = attention.DEFAULT_BLOCK

    @nn.compact
    def __call__(
        self, x: jax.Array, keys: jax.Array, values: jax.Array, slot: Slot
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        config, dtype = self.config, self.dtype
        gpt2 = config.model_type == "gpt2"
        normed = norm(config, "ln_1" if gpt2 else "input_layernorm", dtype)(x)
        name = "attn" if gpt2 else "self_attn"
        attended, keys, values = Attention(config, dtype, self.index, self.block, name=name)(
            normed, keys, values, slot
        )
        if config.sandwich_norms:
            attended = norm(config, "post_attention_layernorm", dtype)(attended)
            x = x + attended
            hidden = MLP(config, dtype, name="mlp")(
                norm(config, "pre_feedforward_layernorm", dtype)(x)
            )
            return x + norm(config, "post_feedforward_layernorm", dtype)(hidden), keys, values
        x = x + attended
        normed = norm(config, "ln_2" if gpt2 else "post_attention_layernorm", dtype)(x)
        return x + MLP(config, dtype, name="mlp")(normed), keys, values


class Decoder(nn.Module):
    """tokens [B, S], mask [B, S] -> logits [B, S, V] (or the final hidden states [B, S, D]
    with ``logits=False``) and the updated cache.

    Without a cache the call is a full forward pass; with one, the chunk is written at
    ``start`` and attends over every real cached position up to its own. ``attention_block``:
    rows and columns of attention scores held at once (``ppojax.rlhf.models.attention``); 0
    builds the whole score matrix (the reference)."""

    config: DecoderConfig
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
    ) -> tuple[jax.Array, KVCache]:
        config, dtype = self.config, self.dtype
        batch_size, chunk = tokens.shape
        mask = mask.astype(bool)
        if cache is None:
            # No buffers to write into: each layer attends over the chunk's own keys, which
            # become the returned cache (a zero cache copied every layer's keys once more).
            empty = (None,) * config.num_layers
            cache = KVCache(empty, empty, mask, jnp.zeros(batch_size, jnp.int32))
            key_mask = mask
        else:
            key_mask = jax.lax.dynamic_update_slice(cache.mask, mask, (0, start))
        positions = jnp.maximum(cache.count[:, None] + jnp.cumsum(mask, axis=1) - 1, 0)
        gpt2 = config.model_type == "gpt2"
        embed = nn.Embed(
            config.vocab_size, config.hidden_size, dtype, dtype, name="wte" if gpt2 else "embed"
        )
        x = embed(tokens)
        if config.embed_scale:
            # Gemma: sqrt(hidden_size), rounded to the compute dtype as Hugging Face does
            x = x * jnp.asarray(math.sqrt(config.hidden_size), dtype)
        if config.positions == "learned":
            # GPT-2's initialisation (a checkpoint's table replaces it)
            table = nn.Embed(
                config.max_positions,
                config.hidden_size,
                dtype,
                dtype,
                embedding_init=nn.initializers.normal(0.02),
                name="wpe",
            )
            x = x + table(jnp.minimum(positions, config.max_positions - 1))
        slot = Slot(start, key_mask, positions)
        layer, block = Layer, self.attention_block
        if remat.layers_rematerialized():
            # each layer's backward recomputes its own forward from its input (core.remat);
            # there a layer's [S, L] scores live only through its own backward, and the plain
            # form planned smaller than the blockwise one (Qwen2.5-1.5B GRPO on one H100:
            # 25.70 GiB against 47.73, docs/rlhf.md)
            layer, block = nn.remat(Layer, policy=remat.POLICY), 0
        new_keys, new_values = [], []
        for index in range(config.num_layers):
            x, keys, values = layer(config, dtype, index, block, name=f"layers_{index}")(
                x, cache.keys[index], cache.values[index], slot
            )
            new_keys.append(keys)
            new_values.append(values)
        x = norm(config, "ln_f" if gpt2 else "norm", dtype)(x)
        cache = KVCache(
            tuple(new_keys), tuple(new_values), key_mask, cache.count + mask.sum(axis=1)
        )
        if not logits:
            return x, cache
        if config.tie_embeddings:
            out = embed.attend(x)
        else:
            out = dense(config.vocab_size, config.head_bias, "lm_head", dtype)(x)
        return softcap(out, config.final_softcap), cache
