"""The planner against a GPU: what ``ppojax plan`` says a step needs, beside what the step
takes on the GPU itself.

    python benchmarks/plan_check.py [--shape small|large] [--model M] [--algorithm grpo]
        [--prompts 8] [--group-size 8] [--prompt-len 512] [--response-len 1024]
        [--remat-layers] [--lora-rank R] [--steps 3] [--smoke]

``--shape`` picks one of two steps the plan table says fit one H100 (an H200 too), whose
flags the others then change: ``small``, Qwen2.5-0.5B GRPO 8 x 8, 512 + 1024 (the default),
and ``large``, Qwen2.5-1.5B GRPO 8 x 8, 512 + 1024 with ``--remat-layers`` (three times the
parameters; without remat it does not fit one H100). Each run adds or replaces its row
(keyed by model and step) in the result file, so the two can run as separate commands.

On the machine's first GPU it builds the program ``ppojax.plan.plan`` sizes
(``planner.program`` over a mesh of that one device), compiles it, and records:

- planned: the compile's ``memory_analysis()`` split as the planner splits it (peak =
  arguments + outputs - aliased + temporaries), and the planner's own figures from the
  deviceless compile for the GPU's kind (h100 or h200) when the CUDA plugin can give them
  here, so the two compiles can be compared too;
- measured: ``memory_stats()["peak_bytes_in_use"]`` after ``--steps`` steps (its growth over
  the bytes in use before the first step, and the total), and the median seconds of a step
  after the first, each waited for with ``block_until_ready``;
- the planner's time ESTIMATE (``estimate.estimate``: FLOPs at the dense peak, bytes at the
  memory bandwidth) for the same program, beside the measured step;
- the budget: the bytes JAX's allocator may hold (``memory_stats()["bytes_limit"]``, which
  ``XLA_PYTHON_CLIENT_MEM_FRACTION`` sets: 0.9 here unless the caller set it, as the training
  commands do, ``ppojax.runtime.memory``), the planner's verdict against that same budget,
  and whether the step ran in it (a step that runs out of memory is recorded as such, with
  the allocator's message, not lost).

No weights are needed: every floating-point input is zeros (the program and the bytes it
moves do not depend on values; zero parameters give uniform logits, so responses run to
their full length, the planner's worst case) and prompts are random token ids. A step that
donates its state gets the previous step's outputs back, as a trainer does.

``--smoke``: a 2-layer, 64-wide Qwen2-shaped model, 2 prompts x 2 of 8 + 8 tokens, on
whatever backend JAX has (the CPU in tests); peak bytes are recorded where the backend reports
them (CPU: none). Writes benchmarks/results/plan_check.json (``--smoke``: a temporary file).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from common import merge_row, read_rows, record, result_path, write_json

from ppojax.plan import estimate, planner, sizing, targets
from ppojax.rlhf.core.sharding import make_mesh
from ppojax.rlhf.models.config import DecoderConfig, parse_config
from ppojax.runtime import launches, memory

# Two steps the plan table says fit one H100: --shape picks one, the other flags change it.
SHAPES = {
    "small": {"model": "qwen2.5-0.5b", "remat_layers": False},
    "large": {"model": "qwen2.5-1.5b", "remat_layers": True},
}

SMOKE_CONFIG = {  # a config.json of a Qwen2-shaped model
    "model_type": "qwen2",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 96,
    "max_position_embeddings": 64,
    "tie_word_embeddings": True,
    "eos_token_id": 1,
}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument("--model", help="a planner model name (default: the shape's)")
    parser.add_argument(
        "--remat-layers", action=argparse.BooleanOptionalAction, help="(default: the shape's)"
    )
    parser.add_argument("--lora-rank", type=int, default=0)
    parser.add_argument("--algorithm", default="grpo", choices=planner.RL_ALGORITHMS)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--response-len", type=int, default=1024)
    parser.add_argument("--dtype", default="bfloat16", choices=planner.DTYPES)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", type=Path, help="the result file (default: see the docstring)")
    parser.add_argument("--mirror", type=Path, help="also copy the result file into this folder")
    args = parser.parse_args(argv)
    for name, value in SHAPES[args.shape].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def concrete(tree: Any, seed: int, vocab: int) -> Any:
    """Arrays for the abstract inputs ``tree``, on their shardings: PRNG keys from ``seed``,
    integer token ids at random below ``vocab`` (from 2: clear of pad and EOS in the smoke
    model), booleans true, every float zero."""
    keys = iter(jax.random.split(jax.random.key(seed), len(jax.tree.leaves(tree))))

    def make(leaf: jax.ShapeDtypeStruct) -> jax.Array:
        key = next(keys)
        if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            value = jax.random.split(key, leaf.shape) if leaf.shape else key
        elif jnp.issubdtype(leaf.dtype, jnp.integer):
            value = jax.random.randint(key, leaf.shape, 2, vocab, leaf.dtype)
        elif leaf.dtype == jnp.bool_:
            value = jnp.ones(leaf.shape, bool)
        else:
            value = jnp.zeros(leaf.shape, leaf.dtype)
        return jax.device_put(value, leaf.sharding)

    return jax.tree.map(make, tree)


def stat(name: str) -> int | None:
    """One of the first device's ``memory_stats()`` (None where the backend keeps none)."""
    stats = jax.local_devices()[0].memory_stats() or {}
    return stats.get(name)


def deviceless_plan(config: DecoderConfig, step: planner.StepShape, target: str) -> Any:
    """The planner's figures from the deviceless compile for ``target``, or the reason there
    are none here."""
    try:
        found = sizing.plan(config, step, target, 1)
    except Exception as error:  # noqa: BLE001 (the plugin may be missing: say so, go on)
        return f"{type(error).__name__}: {error}"[:500]
    return {"peak": found.memory.peak, "temporaries": found.memory.temporaries}


def check(args: argparse.Namespace) -> dict[str, Any]:
    if args.smoke:
        config = parse_config(SMOKE_CONFIG)
        step = planner.StepShape(
            args.algorithm,
            2,
            2,
            8,
            8,
            dtype="float32",
            num_minibatches=2,
            remat_layers=args.remat_layers,
            lora_rank=args.lora_rank,
        )
    else:
        config = sizing.model_config(args.model)
        step = planner.StepShape(
            args.algorithm,
            args.prompts,
            args.group_size,
            args.prompt_len,
            args.response_len,
            dtype=args.dtype,
            remat_layers=args.remat_layers,
            lora_rank=args.lora_rank,
        )
    device = jax.local_devices()[0]
    mesh = make_mesh(fsdp=1, devices=[device])
    prog = planner.program(config, step, mesh)
    started = time.perf_counter()
    compiled = prog.fn.lower(*prog.args).compile()
    compile_s = time.perf_counter() - started
    analysis = compiled.memory_analysis()
    arguments, outputs = analysis.argument_size_in_bytes, analysis.output_size_in_bytes
    aliased, temporaries = analysis.alias_size_in_bytes, analysis.temp_size_in_bytes
    moved = launches.count(compiled.as_text()).total_bytes()
    kind = device.device_kind.lower()
    # the GPU the planner has figures for, by name (a TPU's kind names no target)
    target = next((name for name in targets.CHIPS if name in kind), None)

    planned_peak = arguments + outputs - aliased + temporaries
    limit = stat("bytes_limit")  # the allocator's budget: the memory fraction of the device
    metrics, error, seconds = None, None, []
    state, *rest = concrete(prog.args, 0, config.vocab_size)
    before = stat("bytes_in_use")
    try:
        for _ in range(args.steps):
            began = time.perf_counter()
            state, metrics = compiled(state, *rest)
            jax.block_until_ready((state, metrics))
            seconds.append(time.perf_counter() - began)
    except jax.errors.JaxRuntimeError as failed:  # out of memory: the row says so
        error = f"{type(failed).__name__}: {failed}"[:1000]
    peak = stat("peak_bytes_in_use")
    estimated = estimate.estimate(config, step, target, 1, moved) if target else None
    return {
        "key": row_key(args, step),
        "model": SMOKE_CONFIG if args.smoke else args.model,
        "step": {
            "algorithm": step.algorithm,
            "prompts": step.prompts,
            "group_size": step.group_size,
            "prompt_len": step.prompt_len,
            "response_len": step.response_len,
            "dtype": step.dtype,
            "remat_layers": step.remat_layers,
            "lora_rank": step.lora_rank,
        },
        "device": device.device_kind,
        "budget": {
            "memory_fraction": os.environ.get(memory.FRACTION_VARIABLE),
            "bytes_limit": limit,
            "planned_fits": None if limit is None else planned_peak <= limit,
        },
        "compile_s": round(compile_s, 2),
        "planned": {
            "arguments": arguments,
            "outputs": outputs,
            "aliased": aliased,
            "temporaries": temporaries,
            "peak": planned_peak,
            "bytes_moved_per_step": moved,
            "deviceless": deviceless_plan(config, step, target) if target else None,
        },
        "measured": {
            "ran": error is None,
            "error": error,
            "bytes_in_use_before_steps": before,
            "peak_bytes_in_use": peak,
            "peak_growth_over_state": None if peak is None or before is None else peak - before,
            "step_s": [round(s, 4) for s in seconds],
            "step_s_median_after_first": (
                round(statistics.median(seconds[1:]), 4) if len(seconds) > 1 else None
            ),
        },
        "estimate_s": None if estimated is None else round(estimated.step, 4),
        "estimate_bound": None
        if estimated is None
        else ("memory" if estimated.memory >= estimated.compute else "compute"),
        "finite_metrics": metrics is not None
        and all(bool(np.isfinite(np.asarray(value)).all()) for value in jax.tree.leaves(metrics)),
    }


def row_key(args: argparse.Namespace, step: planner.StepShape) -> str:
    """A row's key in the result file: the model and the step, as plan.json's keys read."""
    model = "smoke" if args.smoke else args.model
    key = (
        f"{model} {step.algorithm} {step.prompts}x{step.group_size} "
        f"{step.prompt_len}+{step.response_len} {step.dtype} lora{step.lora_rank}"
    )
    return key + (" remat" if step.remat_layers else "")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    memory.use_memory_fraction()  # before JAX's GPU backend starts: the commands' budget
    path = result_path(args.out, args.smoke, "plan_check.json")
    row = {**record(__file__, argv), **check(args)}
    results = read_rows(path, "plan_check", __doc__.split("\n\n")[0])
    write_json(path, merge_row(results, row, "key"), args.mirror)
    print(f"wrote {path}")
    planned, measured = row["planned"], row["measured"]
    peak = measured["peak_bytes_in_use"]
    print(
        f"{row['key']}: planned peak {planned['peak'] / 2**30:.3f} GiB, measured peak "
        + ("- (not reported)" if peak is None else f"{peak / 2**30:.3f} GiB")
        + f", step {measured['step_s_median_after_first']} s, estimate {row['estimate_s']} s"
        + ("" if measured["ran"] else f"; did not run: {measured['error']}")
    )
    return 0 if measured["ran"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
