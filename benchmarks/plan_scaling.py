"""How a post-training step's planned time scales with GPUs, in each sampling layout: one
deviceless plan a row (``ppojax.plan.plan``), nothing run on a GPU.

    python benchmarks/plan_scaling.py --row qwen2.5-0.5b:1:auto     # MODEL:DEVICES:LAYOUT
    python benchmarks/plan_scaling.py --table                       # the rows as markdown

A row is GRPO at the planner's default shape (8 prompts x 8 responses, 512 + 1024 tokens,
bf16 over float32 masters) on DEVICES H100s, one device with ``--remat-layers`` (the only
way the bigger models fit there), sampling in LAYOUT (``ppojax.rlhf.core.sharding``:
"replicated" decodes each device's rows with the whole compute copy, "fsdp" under the
training layout, "auto" the planner's choice). Each row keeps the step-time ESTIMATE and its
parts, the collectives' share of it, the decoded token's launches a layer and collective
bytes, the peak per device and the compile's seconds. The per-launch cost (2 us) and the
NVLink bandwidth (450 GB/s one way) are stated assumptions of ``ppojax.plan.targets``, to be
calibrated on a GPU. A row is merged into ``benchmarks/results/plan_scaling.json`` by its key,
so rows can be planned one at a time (a 0.5B compile takes minutes on a 2-core CPU).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import markdown_table, merge_row, read_rows, record, result_path, write_json

NAME = "plan_scaling.json"
DESCRIPTION = "GRPO's planned step on 1 and N H100s by sampling layout (deviceless estimates)"


def plan_row(model: str, devices: int, layout: str) -> dict:
    """One plan as a result row."""
    import jax

    jax.config.update("jax_platforms", "cpu")
    from ppojax.plan import StepShape, plan

    step = StepShape(sample_layout=layout, remat_layers=devices == 1)
    found = plan(model, step, "h100", devices)
    e, d = found.estimate, found.decoding
    return {
        "key": f"{model}:{devices}:{layout}",
        "model": model,
        "devices": devices,
        "asked_layout": layout,
        "sample_layout": found.step.sample_layout,
        "remat_layers": step.remat_layers,
        "step_seconds": e.step,
        "compute_seconds": e.compute,
        "hbm_seconds": e.memory,
        "launch_seconds": e.launches,
        "collective_seconds": e.collectives,
        "collective_share": e.collectives / e.step if e.step else 0.0,
        "response_tokens_per_second_per_gpu": e.tokens_per_second,
        "decode_launches_per_layer": d.launches_per_layer,
        "decode_collective_bytes_per_token": d.collective_bytes,
        "peak_gib": found.memory.peak / 1024**3,
        "fits": found.fits,
        "compile_seconds": found.compile_seconds,
    }


def table(results: dict) -> str:
    rows = sorted(results["tasks"], key=lambda r: (r["model"], r["devices"], r["asked_layout"]))
    return markdown_table(
        (
            "model",
            "H100s",
            "sampling",
            "step (s, estimate)",
            "collectives",
            "response tokens/s per GPU",
            "decode launches a layer",
            "decode collective bytes a token",
            "peak GiB",
        ),
        (
            (
                r["model"],
                r["devices"],
                r["sample_layout"] + (" (auto)" if r["asked_layout"] == "auto" else ""),
                f"{r['step_seconds']:.2f}",
                f"{r['collective_seconds']:.2f} s ({r['collective_share']:.0%})",
                f"{r['response_tokens_per_second_per_gpu']:,.0f}",
                f"{r['decode_launches_per_layer']:.1f}",
                f"{r['decode_collective_bytes_per_token']:,.0f}",
                f"{r['peak_gib']:.2f}",
            )
            for r in rows
        ),
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--row", action="append", default=[], metavar="MODEL:DEVICES:LAYOUT")
    parser.add_argument("--table", action="store_true", help="print the rows as markdown")
    parser.add_argument("--out", type=Path, help=f"the result file (benchmarks/results/{NAME})")
    args = parser.parse_args(argv)
    path = result_path(args.out, False, NAME)
    results = read_rows(path, "plan_scaling", DESCRIPTION)
    for spec in args.row:
        try:
            model, devices, layout = spec.split(":")
            row = plan_row(model, int(devices), layout)
        except ValueError as error:
            parser.error(f"--row {spec}: {error} (MODEL:DEVICES:LAYOUT, e.g. qwen2.5-0.5b:8:auto)")
        row.update(record(__file__, argv, "jax", "jaxlib"))
        results = merge_row(results, row, "key")
        write_json(path, results)
        print(f"{spec}: {row['step_seconds']:.3g} s, {row['sample_layout']}", flush=True)
    if args.table:
        print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
