"""Hugging Face checkpoints as policies: ``from_pretrained``, ``save_pretrained``, ``generate``
for Llama, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3 and GPT-2 folders (config.json, safetensors,
tokenizer.json)."""

from ppojax.rlhf.models.config import DecoderConfig, parse_config, read_config
from ppojax.rlhf.models.decoder import Decoder, KVCache
from ppojax.rlhf.models.generate import generate
from ppojax.rlhf.models.pretrained import PretrainedLM, from_pretrained, save_pretrained
from ppojax.rlhf.models.tokenizer import Tokenizer

__all__ = [
    "Decoder",
    "DecoderConfig",
    "KVCache",
    "PretrainedLM",
    "Tokenizer",
    "from_pretrained",
    "generate",
    "parse_config",
    "read_config",
    "save_pretrained",
]
