"""Load time of a Hugging Face checkpoint, and generation tokens/s with the KV cache against
full recomputation, on this machine's CPU.

    python benchmarks/hf_speed.py [--repeats 5] [--out benchmarks/results]

1. Load: a Qwen2-layout checkpoint of 4 layers, width 256 (8 heads, 2 KV heads, MLP 1024,
   vocabulary 32000, tied embeddings) from random params, written with ``save_pretrained``
   (the tokenizer files are the tiny Qwen2 test fixture's) into a temporary folder; then
   ``from_pretrained`` of it, timed ``--repeats`` times (the first, cold, apart).
2. Generation: 8 prompts of 16 tokens, 64 new tokens at temperature 1, through
   ``generate`` (KV cache: one prefill, then one-token decodes) and through
   ``ppojax.rlhf.core.sampling.sample_responses`` with the model's ``policy_apply`` (each new token
   recomputes the whole [8, 80] buffer). Compile time (lower + compile) apart from run time;
   tokens/s = 8 x 64 / the median run time of ``--repeats`` runs with fresh keys.

Writes ``<out>/hf_speed.json`` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from common import ROOT, record, write_json

from ppojax.rlhf import from_pretrained, generate, save_pretrained
from ppojax.rlhf.core.sampling import SamplingSettings, sample_responses
from ppojax.rlhf.models.config import parse_config
from ppojax.rlhf.models.decoder import Decoder
from ppojax.rlhf.models.pretrained import PretrainedLM, contract
from ppojax.rlhf.models.tokenizer import Tokenizer

TOKENIZER = ROOT / "tests" / "fixtures" / "hf" / "qwen2"
CONFIG = {
    "model_type": "qwen2",
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "eos_token_id": 2,
}
BATCH, PROMPT_LEN, NEW_TOKENS = 8, 16, 64
NOTE = (
    "Timed on a machine shared with other work running: absolute numbers move with the load; "
    "compare the figures of one file only."
)


def write_checkpoint(folder: Path) -> Path:
    """A random checkpoint of CONFIG in ``folder``, written by ``save_pretrained``."""
    config = parse_config(CONFIG)
    module = Decoder(config, jnp.float32)
    tokens = jnp.zeros((1, 1), jnp.int32)
    params = module.init(jax.random.key(0), tokens, jnp.ones((1, 1), bool))
    policy_apply, critic_apply, hook = contract(module)
    tokenizer = Tokenizer(TOKENIZER, config.eos_ids)
    lm = PretrainedLM(module, params, policy_apply, critic_apply, hook, tokenizer, config)
    return save_pretrained(lm, params, folder)


def time_load(folder: Path, repeats: int) -> dict:
    """Seconds of ``from_pretrained(folder)``: the cold first call, then ``repeats`` more."""
    seconds = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        lm = from_pretrained(folder)
        jax.block_until_ready(lm.params)
        seconds.append(time.perf_counter() - start)
    size = sum(path.stat().st_size for path in folder.iterdir())
    return {
        "cold_s": seconds[0],
        "median_s": statistics.median(seconds[1:]),
        "runs_s": seconds[1:],
        "folder_bytes": size,
    }


def time_sampler(fn, params, prompts, mask, repeats: int) -> dict:
    """Compile seconds, then the median run seconds and tokens/s of ``fn(params, prompts,
    mask, key)`` over ``repeats`` fresh keys."""
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(params, prompts, mask, jax.random.key(0)).compile()
    compile_s = time.perf_counter() - start
    runs = []
    for index in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(params, prompts, mask, jax.random.key(index + 1)))
        runs.append(time.perf_counter() - start)
    run_s = statistics.median(runs)
    return {
        "compile_s": compile_s,
        "run_s": run_s,
        "runs_s": runs,
        "tokens_per_s": BATCH * NEW_TOKENS / run_s,
    }


def time_generation(lm: PretrainedLM, repeats: int) -> dict:
    """KV cache (``generate``) against full recomputation (``sample_responses`` given the
    ``policy_apply``)."""
    prompts = jax.random.randint(jax.random.key(7), (BATCH, PROMPT_LEN), 3, 288)
    mask = jnp.ones((BATCH, PROMPT_LEN), bool)
    cached = functools.partial(generate, lm, max_new_tokens=NEW_TOKENS, temperature=1.0)
    settings = SamplingSettings(NEW_TOKENS, 1.0, lm.tokenizer.pad_id, lm.tokenizer.eos_id)

    def full(params, prompts, mask, key):
        return sample_responses(lm.policy_apply, params, prompts, mask, key, settings)

    return {
        "kv_cache": time_sampler(cached, lm.params, prompts, mask, repeats),
        "full_recompute": time_sampler(full, lm.params, prompts, mask, repeats),
    }


def table(load: dict, generation: dict) -> str:
    """The figures as markdown."""
    lines = [
        f"load (4 layers, width 256, {load['folder_bytes'] / 1e6:.1f} MB): median "
        f"{load['median_s']:.3f} s, cold {load['cold_s']:.3f} s",
        "",
        f"| sampler (batch {BATCH}, {NEW_TOKENS} new tokens) | compile s | run s | tokens/s |",
        "|---|---:|---:|---:|",
    ]
    for name, row in generation.items():
        lines.append(
            f"| {name} | {row['compile_s']:.2f} | {row['run_s']:.3f} | {row['tokens_per_s']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temp:
        folder = write_checkpoint(Path(temp) / "checkpoint")
        load = time_load(folder, args.repeats)
        generation = time_generation(from_pretrained(folder), args.repeats)
    result = {
        "benchmark": "Hugging Face checkpoint: load time; generation with the KV cache "
        "against full recomputation",
        **record(__file__, sys.argv[1:], "safetensors", "tokenizers"),
        "note": NOTE,
        "model": CONFIG,
        "generation_settings": {
            "batch": BATCH,
            "prompt_len": PROMPT_LEN,
            "new_tokens": NEW_TOKENS,
            "temperature": 1.0,
        },
        "repeats": args.repeats,
        "load": load,
        "generation": generation,
    }
    write_json(Path(args.out) / "hf_speed.json", result)
    print(table(load, generation))
    print(f"\n{NOTE}")


if __name__ == "__main__":
    main()
