"""Bytes per device of the RLHF trainer's state for a Qwen2.5-0.5B-shaped model, from
abstract shapes only (``jax.eval_shape``: no weights are read or created).

    python benchmarks/hf_memory.py [--out benchmarks/results]

The config is Qwen/Qwen2.5-0.5B's config.json (hidden 896, 24 layers, 14 heads, 2 KV heads,
intermediate 4864, vocabulary 151936, tied embeddings, qkv biases). For each layout of the
state ``make_trainer``'s ``init`` builds, each params dtype and 1, 4 and 8 devices in a
(data=1, fsdp=N) mesh, the bytes one device holds under ``ppojax.rlhf.core.sharding``'s
rules, split into the trained policy, the frozen reference, a separate critic and Adam's
moments:

- ``full, separate critic``: PPO with a critic that is its own copy of the decoder plus a value
  head, both trained in full;
- ``full, value head``: the critic is a value head on the policy's last hidden states (PPO);
  without the head this is GRPO's and RLOO's state;
- ``LoRA r16 q/k/v/o``: rank-16 adapters on q_proj, k_proj, v_proj and o_proj (float32), the
  value head trained in full (``lora_full``); the base is the reference, so no second copy.

Only the state is counted: activations, the KV cache and XLA's temporaries come on top.
Writes ``<out>/hf_memory.json`` and prints the tables as markdown.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
from common import record, write_json

import ppojax
from ppojax.rlhf import RLHFConfig, make_trainer
from ppojax.rlhf.core.sharding import MIN_SHARD_SIZE, bytes_per_device, make_mesh
from ppojax.rlhf.models.config import parse_config
from ppojax.rlhf.models.decoder import Decoder
from ppojax.rlhf.models.pretrained import PretrainedLM, contract
from ppojax.rlhf.models.shapes import PUBLISHED

# Qwen/Qwen2.5-0.5B's config.json (the fields the decoder reads), kept once for the planner too
QWEN2_0_5B = PUBLISHED["qwen2.5-0.5b"]
DEVICES = (1, 4, 8)
DTYPES = ("float32", "bfloat16")
LAYOUTS = ("full, separate critic", "full, value head", "LoRA r16 q/k/v/o")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
GIB = 1024**3


def abstract_lm(dtype: str) -> tuple[PretrainedLM, dict]:
    """The model's contract and the shapes of its params with a value head."""
    config = parse_config(QWEN2_0_5B)
    module = Decoder(config, jnp.dtype(dtype))
    tokens = jnp.zeros((1, 1), jnp.int32)
    shapes = jax.eval_shape(module.init, jax.random.key(0), tokens, jnp.ones((1, 1), bool))
    policy_apply, critic_apply, hook = contract(module)
    lm = PretrainedLM(module, shapes, policy_apply, critic_apply, hook, None, config)
    return lm, jax.eval_shape(lm.init_value_head, shapes)


def abstract_state(layout: str, dtype: str):
    """``jax.eval_shape`` of ``make_trainer(...).init`` for ``layout``: the whole state."""
    lm, with_head = abstract_lm(dtype)
    options = dict(pad_id=151643, eos_id=151645, response_len=8, num_minibatches=1)
    if layout.startswith("LoRA"):
        options.update(lora_rank=16, lora_targets=LORA_TARGETS, lora_full=("value_head",))
    config = RLHFConfig(algorithm="ppo", **options)
    trainer = make_trainer(config, lm.policy_apply, lambda *batch: 0.0, lm.critic_apply)
    key = jax.random.key(0)
    if layout == "full, separate critic":
        return jax.eval_shape(trainer.init, lm.params, key, with_head)
    return jax.eval_shape(trainer.init, with_head, key)


def measure(state, devices: int) -> dict:
    """Bytes one device holds of each part of ``state`` on a (1, ``devices``) mesh."""
    mesh = make_mesh(fsdp=devices, devices=jax.devices()[:devices])
    parts = {
        "policy": state.params["policy"],
        "reference": state.reference,
        "critic": state.params.get("critic", {}),
        "adam": state.opt_state,
    }
    sizes = {name: bytes_per_device(tree, mesh) for name, tree in parts.items()}
    return {**sizes, "total": bytes_per_device(state, mesh)}


def tables(rows: list[dict]) -> str:
    """Markdown: GiB per device by layout, dtype and device count; then the breakdown."""
    lines = [
        "| state | params | " + " | ".join(f"{n} device{'s' * (n > 1)}" for n in DEVICES) + " |",
        "|---|---|" + "---:|" * len(DEVICES),
    ]
    for layout in LAYOUTS:
        for dtype in DTYPES:
            cells = [r for r in rows if r["layout"] == layout and r["dtype"] == dtype]
            gib = " | ".join(f"{r['bytes']['total'] / GIB:.2f} GiB" for r in cells)
            lines.append(f"| {layout} | {dtype} | {gib} |")
    lines += ["", "| state | params | devices | policy | reference | critic | Adam | total |"]
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        mib = " | ".join(f"{r['bytes'][k] / 1024**2:.1f}" for k in ("policy", "reference"))
        rest = " | ".join(f"{r['bytes'][k] / 1024**2:.1f}" for k in ("critic", "adam", "total"))
        lines.append(f"| {r['layout']} | {r['dtype']} | {r['devices']} | {mib} | {rest} |")
    return "\n".join(lines) + "\n\n(breakdown in MiB per device)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    ppojax.use_cpu_devices(max(DEVICES))
    rows = []
    for layout in LAYOUTS:
        for dtype in DTYPES:
            state = abstract_state(layout, dtype)
            for devices in DEVICES:
                bytes_ = measure(state, devices)
                rows.append(dict(layout=layout, dtype=dtype, devices=devices, bytes=bytes_))
    _, with_head = abstract_lm("float32")
    result = {
        "benchmark": "bytes per device of the RLHF trainer's state, Qwen2.5-0.5B-shaped",
        **record(__file__, sys.argv[1:]),
        "model": QWEN2_0_5B,
        "parameters": sum(leaf.size for leaf in jax.tree.leaves(with_head)),
        "mesh": "(data=1, fsdp=devices)",
        "min_shard_size": MIN_SHARD_SIZE,
        "counted": "policy, reference, critic, Adam moments; not activations or the KV cache",
        "rows": rows,
    }
    write_json(Path(args.out) / "hf_memory.json", result)
    print(tables(rows))


if __name__ == "__main__":
    main()
