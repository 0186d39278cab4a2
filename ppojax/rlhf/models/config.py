"""A Hugging Face config.json read into one ``DecoderConfig`` for every supported architecture.

Two layouts are in the wild: transformers 4.x writes ``rope_theta`` and ``rope_scaling`` at the
top level, transformers 5 writes them together as ``rope_parameters``. Both read to the same
config. GPT-2 names its fields differently (``n_embd``, ``n_layer``, ...) and has learned
positions instead of RoPE.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from ppojax.checks import ConfigError, is_int, show

LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3")
GEMMA = ("gemma2", "gemma3_text")
SUPPORTED = (*LLAMA_LIKE, *GEMMA, "gpt2")
ACTIVATIONS = ("silu", "gelu", "gelu_new", "gelu_pytorch_tanh")
ROPE_TYPES = ("default", "linear", "llama3")


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """The shape and the options of a decoder-only LM, whatever its family.

    ``norm``: "rms" (Llama, Qwen), "gemma" (RMSNorm times 1 + w) or "layer" (GPT-2);
    ``positions``: "rope" or "learned"; ``rope``: the RoPE parameters (``rope_type``,
    ``rope_theta`` and the scaling's fields), ``local_rope`` those of the sliding layers where
    they differ (Gemma 3); ``sliding_window``: keys each query sees, on every layer or, with
    ``sliding_layers``, on the layers marked True; ``query_scale``: the attention scores'
    factor (default head_dim ** -0.5); ``attn_softcap``/``final_softcap``: cap * tanh(x / cap)
    of the attention scores and the logits (Gemma 2); ``embed_scale``: embeddings times
    sqrt(hidden_size); ``head_bias``: a bias on the untied output layer (the built-in
    transformer's); ``sandwich_norms``: norms after each sublayer too (Gemma); ``raw``: the
    config.json as read (JSON text, so the config stays hashable), written back on save."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_positions: int
    norm_eps: float
    activation: str
    tie_embeddings: bool
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    head_bias: bool = False
    qk_norm: bool = False
    norm: str = "rms"
    positions: str = "rope"
    rope: tuple[tuple[str, Any], ...] = ()
    sliding_window: int | None = None
    sliding_layers: tuple[bool, ...] = ()
    local_rope: tuple[tuple[str, Any], ...] = ()
    query_scale: float | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    embed_scale: bool = False
    sandwich_norms: bool = False
    bos_id: int | None = None
    eos_ids: tuple[int, ...] = ()
    raw: str = "{}"

    @property
    def rope_parameters(self) -> dict[str, Any]:
        """The RoPE parameters as a dict."""
        return dict(self.rope)

    def layer_window(self, index: int) -> int | None:
        """The sliding window of layer ``index``, None where it attends to every key."""
        if self.sliding_layers and not self.sliding_layers[index]:
            return None
        return self.sliding_window

    def layer_rope(self, index: int) -> dict[str, Any]:
        """The RoPE parameters of layer ``index``."""
        if self.local_rope and self.layer_window(index) is not None:
            return dict(self.local_rope)
        return self.rope_parameters

    def to_json(self) -> dict[str, Any]:
        """config.json's content: the fields read, as they were."""
        return json.loads(self.raw)


def need(raw: dict[str, Any], field: str, source: str) -> Any:
    """raw[field], or a ConfigError naming the field and the file."""
    if field not in raw or raw[field] is None:
        raise ConfigError(
            field,
            f"{source} has no {field!r}, which a {raw.get('model_type')} model needs; "
            "add it (transformers writes it in every config.json it saves).",
        )
    return raw[field]


def count(raw: dict[str, Any], field: str, source: str, default: int | None = None) -> int:
    """raw[field] as a positive int (``default`` where it is absent or null, required where
    ``default`` is None): a ConfigError naming the field and the file otherwise, so that a
    string, a float or a zero stops here instead of in a reshape or a plan of nothing."""
    value = raw.get(field)
    if value is None:
        return need(raw, field, source) if default is None else default
    if is_int(value) and value > 0:
        return int(value)
    hint = ""
    if isinstance(value, float) and value.is_integer() and value > 0:
        hint = f"; write {int(value)}"
    elif isinstance(value, str) and value.strip().isdigit() and int(value) > 0:
        hint = f"; write {value.strip()} without quotes"
    raise ConfigError(
        field, f"{source}: {field!r} must be a positive int, got {show(value, (int,))}{hint}."
    )


def positive_number(raw: dict[str, Any], field: str, source: str, default: float) -> float:
    """raw[field] as a finite number > 0 (``default`` where absent or null)."""
    value = raw.get(field)
    if value is None:
        return default
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf:
        return value
    raise ConfigError(field, f"{source}: {field!r} must be a number > 0, got {show(value)}.")


def divides(raw: dict[str, Any], part: str, whole: str, source: str, why: str) -> None:
    """ConfigError naming ``part`` unless raw[part] divides raw[whole] (both read by
    ``count`` first; an absent ``part`` defaults to ``whole`` and divides it)."""
    value, total = raw.get(part) or raw[whole], raw[whole]
    if total % value:
        raise ConfigError(
            part, f"{source}: {part!r} {value} must divide {whole!r} {total} ({why})."
        )


HEAD_DIM = "without 'head_dim', each head is hidden_size / num_attention_heads wide"
GROUPS = "each KV head serves a whole group of query heads"


def rope_parameters(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """The RoPE parameters from either layout: ``rope_parameters`` (transformers 5) or
    ``rope_theta`` + ``rope_scaling`` (transformers 4.x)."""
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    params.setdefault("rope_type", params.pop("type", "default"))
    params.setdefault("rope_theta", raw.get("rope_theta", 10000.0))
    rope_type = params["rope_type"]
    if rope_type not in ROPE_TYPES:
        raise ValueError(
            f"{source}: rope type {rope_type!r} is not supported; ppojax reads {ROPE_TYPES}."
        )
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"{source}: partial_rotary_factor != 1 is not supported.")
    if rope_type == "llama3":
        for field in ("factor", "low_freq_factor", "high_freq_factor"):
            need(params, field, f"{source} (rope type llama3)")
        original = need(raw, "max_position_embeddings", source)
        params.setdefault("original_max_position_embeddings", original)
    if rope_type == "linear":
        need(params, "factor", f"{source} (rope type linear)")
    return params


def token_ids(value: Any) -> tuple[int, ...]:
    """An id or a list of ids (``eos_token_id`` is either) as a tuple."""
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (int(value),)


def llama_like(raw: dict[str, Any], source: str) -> DecoderConfig:
    """Llama, Mistral, Qwen2 and Qwen3: RMSNorm, SwiGLU, RoPE, grouped-query attention."""
    model_type = raw["model_type"]
    hidden = count(raw, "hidden_size", source)
    heads = count(raw, "num_attention_heads", source)
    kv_heads = count(raw, "num_key_value_heads", source, heads)
    given_head_dim = model_type == "qwen3" or raw.get("head_dim") is not None
    if not given_head_dim:
        divides(raw, "num_attention_heads", "hidden_size", source, HEAD_DIM)
    divides(raw, "num_key_value_heads", "num_attention_heads", source, GROUPS)
    default_head_dim = 128 if model_type == "qwen3" else hidden // heads
    activation = raw.get("hidden_act", "silu")
    if activation != "silu":
        raise ValueError(f"{source}: hidden_act {activation!r} is not supported; use 'silu'.")
    # Mistral windows every layer; Qwen2/3 only when use_sliding_window (default false), and
    # then only the layers from max_window_layers on, which the decoder does not model.
    window = (count(raw, "sliding_window", source, 0) or None) if model_type == "mistral" else None
    if model_type != "mistral" and raw.get("use_sliding_window", False):
        raise ValueError(
            f"{source}: use_sliding_window is true; ppojax's decoder applies {model_type}'s "
            "attention over the whole sequence only. Set use_sliding_window to false (the "
            "published Qwen checkpoints have it false)."
        )
    return DecoderConfig(
        model_type=model_type,
        vocab_size=count(raw, "vocab_size", source),
        hidden_size=hidden,
        intermediate_size=count(raw, "intermediate_size", source),
        num_layers=count(raw, "num_hidden_layers", source),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=count(raw, "head_dim", source, default_head_dim),
        max_positions=count(raw, "max_position_embeddings", source, 2048),
        norm_eps=positive_number(raw, "rms_norm_eps", source, 1e-6),
        activation="silu",
        tie_embeddings=raw.get("tie_word_embeddings", model_type == "qwen2"),
        qkv_bias=model_type == "qwen2" or bool(raw.get("attention_bias", False)),
        out_bias=model_type != "qwen2" and bool(raw.get("attention_bias", False)),
        mlp_bias=bool(raw.get("mlp_bias", False)),
        qk_norm=model_type == "qwen3",
        rope=tuple(sorted(rope_parameters(raw, source).items())),
        sliding_window=window,
        bos_id=raw.get("bos_token_id"),
        eos_ids=token_ids(raw.get("eos_token_id")),
        raw=json.dumps(raw),
    )


def gpt2(raw: dict[str, Any], source: str) -> DecoderConfig:
    """GPT-2: LayerNorm, GELU MLP, learned positions, tied embeddings."""
    hidden = count(raw, "n_embd", source)
    heads = count(raw, "n_head", source)
    divides(raw, "n_head", "n_embd", source, "each head is n_embd / n_head wide")
    activation = raw.get("activation_function", "gelu_new")
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"{source}: activation_function {activation!r} is not supported; use one of "
            f"{ACTIVATIONS}."
        )
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if raw.get(flag):
            raise ValueError(f"{source}: {flag}=true is not supported; set it to false.")
    return DecoderConfig(
        model_type="gpt2",
        vocab_size=count(raw, "vocab_size", source),
        hidden_size=hidden,
        intermediate_size=count(raw, "n_inner", source, 4 * hidden),
        num_layers=count(raw, "n_layer", source),
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=hidden // heads,
        max_positions=count(raw, "n_positions", source),
        norm_eps=positive_number(raw, "layer_norm_epsilon", source, 1e-5),
        activation=activation,
        tie_embeddings=True,
        qkv_bias=True,
        out_bias=True,
        mlp_bias=True,
        norm="layer",
        positions="learned",
        bos_id=raw.get("bos_token_id"),
        eos_ids=token_ids(raw.get("eos_token_id")),
        raw=json.dumps(raw),
    )


def layer_types(raw: dict[str, Any], layers: int) -> list[str]:
    """Each layer's "sliding_attention" or "full_attention": ``layer_types`` (transformers 5),
    else the older rule: Gemma 2 alternates from a sliding first layer, Gemma 3 makes every
    ``sliding_window_pattern``-th layer full."""
    if raw.get("layer_types"):
        return list(raw["layer_types"])
    if raw["model_type"] == "gemma2":
        return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    pattern = raw.get("sliding_window_pattern") or raw.get("_sliding_window_pattern") or 6
    return [
        "full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers)
    ]


def gemma(raw: dict[str, Any], source: str) -> DecoderConfig:
    """Gemma 2 and Gemma 3 (text): scaled embeddings, (1 + w) RMSNorms before and after each
    sublayer, GeGLU, sliding and full layers; Gemma 3 adds q/k norms and a RoPE base per
    layer type, Gemma 2 caps attention scores and logits."""
    model_type = raw["model_type"]
    layers = count(raw, "num_hidden_layers", source)
    heads = count(raw, "num_attention_heads", source)
    kv_heads = count(raw, "num_key_value_heads", source, heads)
    divides(raw, "num_key_value_heads", "num_attention_heads", source, GROUPS)
    head_dim = count(raw, "head_dim", source, 256)
    activation = raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"
    if activation not in ("gelu_pytorch_tanh", "gelu_new"):
        raise ValueError(f"{source}: hidden_activation {activation!r} is not supported for Gemma.")
    if raw.get("use_bidirectional_attention"):
        raise ValueError(f"{source}: use_bidirectional_attention is not supported (causal only).")
    types = layer_types(raw, layers)
    unknown = set(types) - {"sliding_attention", "full_attention"}
    if len(types) != layers or unknown:
        raise ValueError(
            f"{source}: layer_types must name {layers} layers as sliding_attention "
            f"or full_attention, got {types}"
        )
    by_type = raw.get("rope_parameters") or {}
    if "full_attention" in by_type:  # transformers 5: RoPE parameters per layer type
        full = rope_parameters({**raw, "rope_parameters": by_type["full_attention"]}, source)
        local_raw = by_type.get("sliding_attention", by_type["full_attention"])
        local = rope_parameters({**raw, "rope_parameters": local_raw}, source)
    else:
        full = rope_parameters(raw, source)
        local_theta = raw.get("rope_local_base_freq", full["rope_theta"])
        local = {"rope_type": "default", "rope_theta": local_theta}
    bias = bool(raw.get("attention_bias", False))
    return DecoderConfig(
        model_type=model_type,
        vocab_size=count(raw, "vocab_size", source),
        hidden_size=count(raw, "hidden_size", source),
        intermediate_size=count(raw, "intermediate_size", source),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        max_positions=count(raw, "max_position_embeddings", source, 8192),
        norm_eps=positive_number(raw, "rms_norm_eps", source, 1e-6),
        activation="gelu_pytorch_tanh",
        tie_embeddings=raw.get("tie_word_embeddings", True),
        qkv_bias=bias,
        out_bias=bias,
        qk_norm=model_type == "gemma3_text",
        norm="gemma",
        rope=tuple(sorted(full.items())),
        local_rope=tuple(sorted(local.items())) if local != full else (),
        sliding_window=count(raw, "sliding_window", source, 0) or None,
        sliding_layers=tuple(kind == "sliding_attention" for kind in types),
        query_scale=float(raw.get("query_pre_attn_scalar") or head_dim) ** -0.5,
        attn_softcap=raw.get("attn_logit_softcapping"),
        final_softcap=raw.get("final_logit_softcapping"),
        embed_scale=True,
        sandwich_norms=True,
        bos_id=raw.get("bos_token_id"),
        eos_ids=token_ids(raw.get("eos_token_id")),
        raw=json.dumps(raw),
    )


def parse_config(raw: dict[str, Any], source: str = "config.json") -> DecoderConfig:
    """A config.json's dict as a ``DecoderConfig``; ConfigError (a ValueError) naming the
    field and what it must be where a field is missing, unsupported or out of range (counts
    positive ints, heads dividing evenly), so every value is checked before a model is built."""
    if not isinstance(raw, dict):
        raise ConfigError(
            None,
            f"{source} must hold a JSON object of the model's fields, got a {type(raw).__name__}.",
        )
    model_type = raw.get("model_type")
    if model_type is None:
        raise ConfigError(
            "model_type",
            f"{source} has no 'model_type'; add the model's family, one of {', '.join(SUPPORTED)} "
            "(transformers writes it in every config.json it saves).",
        )
    if model_type not in SUPPORTED:
        raise ConfigError(
            "model_type",
            f"{source}: model_type {model_type!r} is not supported; ppojax loads {SUPPORTED}.",
        )
    if model_type == "gpt2":
        return gpt2(raw, source)
    return gemma(raw, source) if model_type in GEMMA else llama_like(raw, source)


def read_config(folder: str | Path) -> DecoderConfig:
    """``folder``/config.json as a ``DecoderConfig``; FileNotFoundError when it is missing."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: a Hugging Face model folder needs config.json beside its "
            "*.safetensors and tokenizer.json."
        )
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{path}, line {error.lineno}: not valid JSON ({error.msg}); fix or download it again."
        ) from None
    return parse_config(raw, str(path))
