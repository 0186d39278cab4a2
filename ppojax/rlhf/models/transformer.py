"""The decoder in ``make_trainer``'s contract, and the built-in small transformer as one of its
configs.

``contract(module)`` gives the pieces ``make_trainer`` takes from any ``Decoder``:
``policy_apply(params, tokens, mask) -> logits`` (a ``SplitPolicy``: its hidden states and
head apart too), ``critic_apply(params, tokens, mask) -> values`` (a value head on the final
hidden states, ``params["params"]["value_head"]``, which the policy ignores) and the
``KVCacheHook`` for fast sampling. ``transformer(...)`` is the built-in LM trained from random
weights: GPT-2's layout (pre-LayerNorm, learned positions, a tanh-GELU MLP four times as wide)
with an untied output layer, as a ``DecoderConfig`` of the same decoder that loads Hugging Face
checkpoints, so one implementation of attention, caching and masking serves both.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ppojax.rlhf.core.logprobs import SplitPolicy
from ppojax.rlhf.core.sampling import KVCacheHook
from ppojax.rlhf.models import attention
from ppojax.rlhf.models.config import DecoderConfig, gpt2
from ppojax.rlhf.models.decoder import Decoder, KVCache, empty_cache, softcap

VALUE_HEAD = "value_head"


def decoder_params(params: dict) -> dict:
    """The decoder's params, without the value head."""
    inner = {name: leaf for name, leaf in params["params"].items() if name != VALUE_HEAD}
    return {"params": inner}


def lm_head(module: Decoder, params: dict, hidden: jax.Array) -> jax.Array:
    """Logits [..., V] of the decoder's final hidden states [..., D] (after its final norm):
    the ops of ``Decoder``'s head, the tied embedding table's or lm_head's kernel (and bias),
    then the family's final softcap."""
    config, inner, dtype = module.config, params["params"], module.dtype
    hidden = hidden.astype(dtype)
    if config.tie_embeddings:
        table = inner["wte" if config.model_type == "gpt2" else "embed"]["embedding"]
        out = jnp.dot(hidden, table.astype(dtype).T)
    else:
        out = jnp.dot(hidden, inner["lm_head"]["kernel"].astype(dtype))
        if config.head_bias:
            out = out + inner["lm_head"]["bias"].astype(dtype)
    return softcap(out, config.final_softcap)


def contract(module: Decoder) -> tuple[SplitPolicy, Any, KVCacheHook]:
    """``policy_apply`` (a ``SplitPolicy``: the logits, and the final hidden states and the
    head apart), ``critic_apply`` and the ``KVCacheHook`` of ``module``."""

    def logits(params: dict, tokens: jax.Array, mask: jax.Array) -> jax.Array:
        return module.apply(decoder_params(params), tokens, mask)[0]

    def hidden_states(params: dict, tokens: jax.Array, mask: jax.Array) -> jax.Array:
        return module.apply(decoder_params(params), tokens, mask, logits=False)[0]

    def head(params: dict, hidden: jax.Array) -> jax.Array:
        return lm_head(module, params, hidden)

    def critic_apply(params: dict, tokens: jax.Array, mask: jax.Array) -> jax.Array:
        hidden = hidden_states(params, tokens, mask)
        head = params["params"][VALUE_HEAD]
        return (hidden @ head["kernel"] + head["bias"])[..., 0].astype(jnp.float32)

    def prefill(
        params: dict, prompts: jax.Array, prompt_mask: jax.Array, total_len: int
    ) -> tuple[jax.Array, KVCache]:
        cache = empty_cache(module.config, prompts.shape[0], total_len, module.dtype)
        logits, cache = module.apply(decoder_params(params), prompts, prompt_mask, cache, 0)
        return logits[:, -1], cache

    def decode(
        params: dict, cache: KVCache, tokens: jax.Array, index: Any
    ) -> tuple[jax.Array, KVCache]:
        mask = jnp.ones((tokens.shape[0], 1), bool)
        logits, cache = module.apply(decoder_params(params), tokens[:, None], mask, cache, index)
        return logits[:, 0], cache

    def extend(
        params: dict, cache: KVCache, tokens: jax.Array, mask: jax.Array, start: Any
    ) -> tuple[jax.Array, KVCache]:
        return module.apply(decoder_params(params), tokens, mask, cache, start)

    policy_apply = SplitPolicy(logits, hidden_states, head)
    return policy_apply, critic_apply, KVCacheHook(prefill, decode, extend)


def value_head(hidden_size: int, dtype: Any) -> dict:
    """A value head [D] -> 1 at 0 (V starts at 0)."""
    return {"kernel": jnp.zeros((hidden_size, 1), dtype), "bias": jnp.zeros((1,), dtype)}


def builtin_config(
    vocab_size: int, max_len: int, d_model: int, num_heads: int, num_layers: int
) -> DecoderConfig:
    """The built-in transformer's shape as a ``DecoderConfig``: GPT-2's layout with fused
    query/key/value projections without bias and an untied output layer with one."""
    if d_model % num_heads:
        raise ValueError(f"d_model={d_model} must be a multiple of num_heads={num_heads}.")
    shape = {"vocab_size": vocab_size, "n_positions": max_len, "n_embd": d_model}
    shape.update(n_head=num_heads, n_layer=num_layers, layer_norm_epsilon=1e-6)
    layout = gpt2(shape, "the built-in transformer")
    return dataclasses.replace(layout, tie_embeddings=False, qkv_bias=False, head_bias=True)


class LanguageModel(NamedTuple):
    """The built-in transformer in ``make_trainer``'s contract."""

    module: Decoder
    policy_apply: Any
    critic_apply: Any
    kv_cache: KVCacheHook
    config: DecoderConfig

    def init(self, key: jax.Array) -> dict:
        """Fresh parameters, with a value head at 0."""
        tokens = jnp.zeros((1, self.config.max_positions), jnp.int32)
        params = self.module.init(key, tokens, jnp.ones_like(tokens, bool))
        head = value_head(self.config.hidden_size, self.module.dtype)
        return {"params": {**params["params"], VALUE_HEAD: head}}


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
    and compute in ``dtype`` ("bfloat16" or a jnp dtype); ``max_len`` positions."""
    config = builtin_config(vocab_size, max_len, d_model, num_heads, num_layers)
    module = Decoder(config, jnp.dtype(dtype), attention_block)
    return LanguageModel(module, *contract(module), config)


def TransformerLM(  # noqa: N802 - the class name it stands in for
    vocab_size: int,
    max_len: int,
    d_model: int,
    num_heads: int,
    num_layers: int,
    dtype: Any = jnp.float32,
    attention_block: int = attention.DEFAULT_BLOCK,
) -> Decoder:
    """Deprecated: the built-in transformer's module is a ``Decoder`` of ``builtin_config``
    (``transformer(...).module``); it returns (logits, cache), the values coming from
    ``critic_apply``."""
    warnings.warn(
        "TransformerLM is deprecated: use transformer(...).module, a Decoder of "
        "builtin_config(...)",
        DeprecationWarning,
        stacklevel=2,
    )
    return transformer(
        vocab_size, max_len, d_model, num_heads, num_layers, dtype, attention_block
    ).module


def zero_value_head(params: dict) -> dict:
    """``params`` with the value head reset to 0, so a critic copied from it starts at V = 0."""
    head = params["params"][VALUE_HEAD]
    return {"params": {**params["params"], VALUE_HEAD: jax.tree.map(jnp.zeros_like, head)}}


# The built-in transformer's parameter names before it was a DecoderConfig, for run folders an
# earlier ppojax wrote: each name of a layer's part, and of its attention's projections.
LEGACY_PARTS = {"LayerNorm_0": ("ln_1",), "LayerNorm_1": ("ln_2",), "mlp_in": ("mlp", "c_fc")}
LEGACY_PARTS["mlp_out"] = ("mlp", "c_proj")
LEGACY_ATTENTION = {"qkv": "c_attn", "out": "c_proj"}
LEGACY_TOP = {"Embed_0": "wte", "LayerNorm_0": "ln_f"}


def from_legacy_path(path: tuple[str, ...]) -> tuple[str, ...]:
    """A parameter path (below "params") of the earlier built-in transformer, as the decoder
    names it."""
    head, rest = path[0], path[1:]
    if head == "position_embedding":
        return ("wpe", "embedding")
    if head in LEGACY_TOP:
        return (LEGACY_TOP[head], *rest)
    if head.startswith("Block_"):
        layer = "layers_" + head.removeprefix("Block_")
        if rest[0] == "CausalSelfAttention_0":
            return (layer, "attn", LEGACY_ATTENTION[rest[1]], *rest[2:])
        return (layer, *LEGACY_PARTS[rest[0]], *rest[1:])
    return path


def to_legacy_path(path: tuple[str, ...]) -> tuple[str, ...]:
    """``from_legacy_path`` undone."""
    head, rest = path[0], path[1:]
    if head == "wpe":
        return ("position_embedding",)
    top = {new: old for old, new in LEGACY_TOP.items()}
    if head in top:
        return (top[head], *rest)
    if head.startswith("layers_"):
        block = "Block_" + head.removeprefix("layers_")
        if rest[0] == "attn":
            names = {new: old for old, new in LEGACY_ATTENTION.items()}
            return (block, "CausalSelfAttention_0", names[rest[1]], *rest[2:])
        parts = {new: old for old, new in LEGACY_PARTS.items()}
        width = 2 if rest[0] == "mlp" else 1
        return (block, parts[rest[:width]], *rest[width:])
    return path


def rename_params(
    tree: Any, rename: Any, marks: tuple[str, str], adapter_heads: tuple[str, ...]
) -> Any:
    """``tree`` (a whole state: params, optimizer moments, LoRA adapters keyed by path
    strings) with every parameter path of the built-in transformer renamed by ``rename``: a
    dict holding both ``marks`` is a params dict, a dict keyed "params-<one of
    adapter_heads>..." an adapters dict."""

    def is_params(node: Any) -> bool:
        return isinstance(node, dict) and all(mark in node for mark in marks)

    def is_adapters(node: Any) -> bool:
        prefixes = tuple(f"params-{head}" for head in adapter_heads)
        return isinstance(node, dict) and any(
            isinstance(key, str) and key.startswith(prefixes) for key in node
        )

    def renamed(node: Any) -> Any:
        if is_params(node):
            flat = {}
            for path, leaf in jax.tree_util.tree_flatten_with_path(node)[0]:
                flat[rename(tuple(part.key for part in path))] = leaf
            return unflatten(flat)
        if is_adapters(node):
            return {
                "-".join(("params", *rename(tuple(key.split("-")[1:])))): value
                for key, value in node.items()
            }
        return node

    return jax.tree.map(renamed, tree, is_leaf=lambda node: is_params(node) or is_adapters(node))


def unflatten(flat: dict[tuple[str, ...], Any]) -> dict:
    """Nested dicts of {path: leaf}."""
    tree: dict = {}
    for path, leaf in flat.items():
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = leaf
    return tree


def to_legacy(tree: Any) -> Any:
    """A state of the built-in transformer in the earlier parameter names (a checkpoint's
    template)."""
    return rename_params(tree, to_legacy_path, ("wte", "wpe"), ("layers_", "lm_head"))


def from_legacy(tree: Any) -> Any:
    """A state read back under the earlier parameter names, in the decoder's."""
    heads = ("Block_", "lm_head")
    return rename_params(tree, from_legacy_path, ("Embed_0", "position_embedding"), heads)
