"""The planner (``ppojax plan``) on published model shapes: bytes per device, launches, the
step-time estimate and the verdict of a post-training step, compiled for H100s on a CPU.

    PYTHONPATH=/path/to/aotsite JAX_PLATFORMS=cpu python benchmarks/plan.py \\
        [--model qwen2.5-0.5b] [--algorithm grpo] [--devices 1] [--search] [--out FILE]

Needs the CUDA plugin of the ``gpu-aot`` extra. Each run adds (or replaces) one row, keyed by
model, step and target, in benchmarks/results/plan.json, with the plan's numbers and the
seconds the compile took on this machine (the search's compiles are not timed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import RESULTS, merge_row, read_rows, record, write_json

from ppojax.rlhf.planner import StepShape
from ppojax.rlhf.sizing import plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-0.5b")
    parser.add_argument("--algorithm", default="grpo")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--response-len", type=int, default=1024)
    parser.add_argument("--lora-rank", type=int, default=0)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--target", default="h100")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--search", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS / "plan.json")
    args = parser.parse_args()
    import jax

    jax.config.update("jax_platforms", "cpu")
    step = StepShape(
        args.algorithm,
        prompts=args.prompts,
        group_size=args.group_size,
        prompt_len=args.prompt_len,
        response_len=args.response_len,
        lora_rank=args.lora_rank,
        dtype=args.dtype,
    )
    found = plan(args.model, step, args.target, args.devices, search=args.search)
    print(found.report())
    key = (
        f"{args.model} {step.algorithm} {step.prompts}x{step.group_size} "
        f"{step.prompt_len}+{step.response_len} {step.dtype} lora{step.lora_rank} "
        f"{args.devices}x{args.target}"
    )
    row = {"key": key, **found.to_dict(), **record(__file__, sys.argv[1:])}
    results = read_rows(args.out, "plan", "ppojax plan on published shapes, compiled on a CPU")
    write_json(args.out, merge_row(results, row, "key"))


if __name__ == "__main__":
    main()
