"""Model shapes without weights: a config.json file, a model folder holding one, or a few
published configs built in (their config.json values, the fields the decoder reads), so that
a model can be sized (``ppojax.plan.planner``) on a machine that cannot reach the Hub.

    config = model_config("qwen2.5-0.5b")          # built in
    config = model_config("path/to/folder")        # folder/config.json
    shapes = abstract_params(config, "bfloat16")   # ShapeDtypeStructs, nothing allocated
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from ppojax.rlhf.models.config import DecoderConfig, parse_config, read_config

QWEN2 = {
    "model_type": "qwen2",
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
}
LLAMA3 = {
    "model_type": "llama",
    "hidden_act": "silu",
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}


def llama3_rope(factor: float) -> dict[str, Any]:
    """Llama 3's rope_scaling, whose models differ in its ``factor`` alone."""
    return {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }


# From the config.json of each model's Hugging Face repo (Qwen/Qwen2.5-0.5B, Qwen/Qwen2.5-1.5B,
# Qwen/Qwen2.5-7B, meta-llama/Llama-3.1-8B, meta-llama/Llama-3.2-1B, google/gemma-2-2b).
PUBLISHED: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": {
        **QWEN2,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
    },
    "qwen2.5-1.5b": {
        **QWEN2,
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
    },
    "qwen2.5-7b": {
        **QWEN2,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
    },
    "llama-3.1-8b": {
        **LLAMA3,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "rope_scaling": llama3_rope(8.0),
        "tie_word_embeddings": False,
    },
    "llama-3.2-1b": {
        **LLAMA3,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "head_dim": 64,
        "rope_scaling": llama3_rope(32.0),
        "tie_word_embeddings": True,
    },
    "gemma-2-2b": {
        "model_type": "gemma2",
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "vocab_size": 256000,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "tie_word_embeddings": True,
        "bos_token_id": 2,
        "eos_token_id": 1,
        "pad_token_id": 0,
    },
}


def model_config(model: str | Path) -> DecoderConfig:
    """The ``DecoderConfig`` of ``model``: a built-in name (PUBLISHED), a config.json file or a
    folder holding one. ValueError naming the choices otherwise."""
    if str(model).lower() in PUBLISHED:
        return parse_config(PUBLISHED[str(model).lower()], f"built-in {str(model).lower()}")
    path = Path(model)
    if path.is_dir():
        return read_config(path)
    if path.is_file():
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}, line {error.lineno}: not valid JSON ({error.msg})") from None
        return parse_config(raw, str(path))
    raise ValueError(
        f"model {str(model)!r} is neither a config.json, a folder holding one, nor a built-in "
        f"shape ({', '.join(PUBLISHED)}); Hub ids are not fetched: download the repo's "
        "config.json and give its path."
    )


def abstract_params(config: DecoderConfig, dtype: Any) -> dict:
    """The decoder's params as ``jax.ShapeDtypeStruct``s (``jax.eval_shape`` of its init)."""
    from ppojax.rlhf.models.decoder import Decoder

    module = Decoder(config, dtype)
    tokens = jnp.zeros((1, 1), jnp.int32)
    return jax.eval_shape(module.init, jax.random.key(0), tokens, jnp.ones((1, 1), bool))
