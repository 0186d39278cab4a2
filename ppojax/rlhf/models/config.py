"""A Hugging Face config.json read into one ``DecoderConfig`` for every supported architecture.

Two layouts are in the wild: transformers 4.x writes ``rope_theta`` and ``rope_scaling`` at the
top level, transformers 5 writes them together as ``rope_parameters``. Both read to the same
config. GPT-2 names its fields differently (``n_embd``, ``n_layer``, ...) and has learned
positions instead of RoPE.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED = (*LLAMA_LIKE, "gpt2")
ACTIVATIONS = ("silu", "gelu", "gelu_new", "gelu_pytorch_tanh")
ROPE_TYPES = ("default", "linear", "llama3")


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """The shape and the options of a decoder-only LM, whatever its family.

    ``norm``: "rms" (Llama, Qwen) or "layer" (GPT-2); ``positions``: "rope" or "learned";
    ``rope``: the RoPE parameters (``rope_type``, ``rope_theta`` and the scaling's fields);
    ``raw``: the config.json as read (JSON text, so the config stays hashable), written back
    on save."""

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
    qk_norm: bool = False
    norm: str = "rms"
    positions: str = "rope"
    rope: tuple[tuple[str, Any], ...] = ()
    sliding_window: int | None = None
    bos_id: int | None = None
    eos_ids: tuple[int, ...] = ()
    raw: str = "{}"

    @property
    def rope_parameters(self) -> dict[str, Any]:
        """The RoPE parameters as a dict."""
        return dict(self.rope)

    def to_json(self) -> dict[str, Any]:
        """config.json's content: the fields read, as they were."""
        return json.loads(self.raw)


def need(raw: dict[str, Any], field: str, source: str) -> Any:
    """raw[field], or a ValueError naming the field and the file."""
    if field not in raw or raw[field] is None:
        raise ValueError(
            f"{source} has no {field!r}, which a {raw.get('model_type')} model needs; "
            "add it (transformers writes it in every config.json it saves)."
        )
    return raw[field]


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
        params.setdefault("original_max_position_embeddings", raw["max_position_embeddings"])
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
    hidden = need(raw, "hidden_size", source)
    heads = need(raw, "num_attention_heads", source)
    default_head_dim = 128 if model_type == "qwen3" else hidden // heads
    activation = raw.get("hidden_act", "silu")
    if activation != "silu":
        raise ValueError(f"{source}: hidden_act {activation!r} is not supported; use 'silu'.")
    # Mistral windows every layer; Qwen2/3 only when use_sliding_window (default false), and
    # then only the layers from max_window_layers on, which the decoder does not model.
    window = raw.get("sliding_window") if model_type == "mistral" else None
    if model_type != "mistral" and raw.get("use_sliding_window", False):
        raise ValueError(
            f"{source}: use_sliding_window is true; ppojax's decoder applies {model_type}'s "
            "attention over the whole sequence only. Set use_sliding_window to false (the "
            "published Qwen checkpoints have it false)."
        )
    return DecoderConfig(
        model_type=model_type,
        vocab_size=need(raw, "vocab_size", source),
        hidden_size=hidden,
        intermediate_size=need(raw, "intermediate_size", source),
        num_layers=need(raw, "num_hidden_layers", source),
        num_heads=heads,
        num_kv_heads=raw.get("num_key_value_heads") or heads,
        head_dim=raw.get("head_dim") or default_head_dim,
        max_positions=raw.get("max_position_embeddings", 2048),
        norm_eps=raw.get("rms_norm_eps", 1e-6),
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
    hidden = need(raw, "n_embd", source)
    heads = need(raw, "n_head", source)
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
        vocab_size=need(raw, "vocab_size", source),
        hidden_size=hidden,
        intermediate_size=raw.get("n_inner") or 4 * hidden,
        num_layers=need(raw, "n_layer", source),
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=hidden // heads,
        max_positions=need(raw, "n_positions", source),
        norm_eps=raw.get("layer_norm_epsilon", 1e-5),
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


def parse_config(raw: dict[str, Any], source: str = "config.json") -> DecoderConfig:
    """A config.json's dict as a ``DecoderConfig``; ValueError naming the unsupported
    ``model_type`` or the missing field."""
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED:
        raise ValueError(
            f"{source}: model_type {model_type!r} is not supported; ppojax loads {SUPPORTED}."
        )
    return gpt2(raw, source) if model_type == "gpt2" else llama_like(raw, source)


def read_config(folder: str | Path) -> DecoderConfig:
    """``folder``/config.json as a ``DecoderConfig``; FileNotFoundError when it is missing."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: a Hugging Face model folder needs config.json beside its "
            "*.safetensors and tokenizer.json."
        )
    return parse_config(json.loads(path.read_text()), str(path))
