"""The planner on TPU slices: published shapes' GRPO steps compiled for v5e, v6e and v5p
slices on a CPU (libtpu, ``pip install "ppojax[tpu-aot]"``), beside what the TPU's own
libraries publish for it (``ppojax.plan.published.RECIPES``).

    JAX_PLATFORMS=cpu python benchmarks/plan_tpu.py            every row of ROWS, then the table
    JAX_PLATFORMS=cpu python benchmarks/plan_tpu.py --row 0    one row
    python benchmarks/plan_tpu.py --table                      print the table
    python benchmarks/plan_tpu.py --docs                       write it into docs/rlhf.md

Each row is merged into benchmarks/results/plan_tpu.json as it finishes (keyed as
benchmarks/plan.py keys its rows), with the compile's seconds on this machine. The step is the
GPU table's: GRPO, 8 prompts x 8 responses, 512 + 1024 tokens, bf16 over float32 masters.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common import (
    RESULTS,
    ROOT,
    markdown_table,
    merge_row,
    read_rows,
    record,
    with_block,
    write_json,
)
from plan import plan_key

from ppojax.plan.planner import StepShape
from ppojax.plan.published import RECIPES
from ppojax.plan.sizing import plan

# (model, LoRA rank, target, chips, the recipes beside it: indices into RECIPES). v5e-8 and
# v6e-8 are 8 chips; v5p-8 is 4 (ppojax.plan.targets).
ROWS = [
    ("qwen2.5-0.5b", 0, "v5e", 8, (0,)),
    ("qwen2.5-0.5b", 0, "v6e", 8, (0,)),
    ("qwen2.5-1.5b", 0, "v5e", 8, (0,)),
    ("qwen2.5-1.5b", 0, "v6e", 8, (0,)),
    ("gemma-2-2b", 0, "v5e", 8, (1,)),
    ("gemma-2-2b", 16, "v5e", 8, (0, 1)),
    ("qwen2.5-7b", 0, "v5p", 4, ()),
]
DOCS = ROOT / "docs" / "rlhf.md"
MARKERS = ("<!-- plan-tpu-table:start -->", "<!-- plan-tpu-table:end -->")
SLICE_NAMES = {("v5e", 8): "v5e-8", ("v6e", 8): "v6e-8", ("v5p", 4): "v5p-8"}


def step_of(lora_rank: int) -> StepShape:
    return StepShape("grpo", prompts=8, group_size=8, lora_rank=lora_rank)


def key_of(model: str, lora_rank: int, target: str, chips: int) -> str:
    step = step_of(lora_rank)
    fields = {name: getattr(step, name) for name in ("algorithm", "prompts", "group_size")}
    fields |= {name: getattr(step, name) for name in ("prompt_len", "response_len", "dtype")}
    fields |= dict(lora_rank=lora_rank, devices=chips, target=target, remat_layers=False)
    return plan_key({"model": model, **fields})


def plan_row(index: int, out: Path, argv: list[str]) -> None:
    model, lora_rank, target, chips, recipes = ROWS[index]
    found = plan(model, step_of(lora_rank), target, chips)
    print(found.report(), flush=True)
    row = {"key": key_of(model, lora_rank, target, chips), **found.to_dict()}
    row["recipes"] = list(recipes)
    results = read_rows(out, "plan_tpu", "ppojax plan on TPU slices, compiled on a CPU")
    write_json(out, merge_row(results, {**row, **record(__file__, argv)}, "key"))


def table(results: dict) -> str:
    """GiB per chip, the verdict, the estimate and what the target's recipes use, a row per
    plan (in ROWS' order), then the recipes' sources."""
    gib = 1024**3
    header = ["model", "step", "slice", "state", "temp.", "peak", "of", "fits"]
    header += ["est. s/step", "tokens/s/chip", "compile s", "published recipes"]
    rows = []
    order = [key_of(*spec[:4]) for spec in ROWS]
    tasks = sorted(results["tasks"], key=lambda r: (order + [r["key"]]).index(r["key"]))
    for row in tasks:
        step, memory = row["step"], row["memory"]
        lora = f" LoRA r{step['lora_rank']}" if step["lora_rank"] else ""
        what = f"grpo{lora} {step['prompts']} x {step['group_size']}, "
        what += f"{step['prompt_len']} + {step['response_len']}"
        state = sum(memory[part] for part in ("parameters", "reference", "critic", "optimizer"))
        name = SLICE_NAMES.get((row["target"], row["devices"]), row["target"])
        estimate = row["estimate"]
        recipes = ", ".join(f"[{index + 1}]" for index in row["recipes"]) or "none found"
        # a step libtpu refused for the chip's HBM: its peak is at least what the refusal named
        refused = bool(row.get("refused"))
        sizes = [f"{value / gib:.2f}" for value in (state, memory["temporaries"], memory["peak"])]
        if refused:
            sizes = [sizes[0], f">= {sizes[1]}", f">= {sizes[2]}"]
        times = ["-", "-"] if estimate is None else [f"{estimate['step']:.3g}"]
        if estimate is not None:
            times.append(f"{estimate['tokens_per_second']:,.0f}")
        fits = "yes" if row["fits"] else "no, libtpu refused it" if refused else "no"
        rows.append(
            [row["model"], what, f"{name} ({row['devices']} chips)", *sizes]
            + [f"{row['usable'] / gib:.2f}", fits, *times]
            + [f"{row['compile_seconds']:.0f}", recipes]
        )
    notes = [
        f"[{index + 1}] {r.library}: {r.model} on {r.slice}: {r.what} ({r.source})"
        for index, r in enumerate(RECIPES)
    ]
    return markdown_table(header, rows) + "\n\n" + "\n".join(notes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--row", type=int, choices=range(len(ROWS)), help="one row of ROWS")
    parser.add_argument("--out", type=Path, default=RESULTS / "plan_tpu.json")
    parser.add_argument("--table", action="store_true", help="print --out's rows as markdown")
    parser.add_argument("--docs", action="store_true", help="write the table into docs/rlhf.md")
    args = parser.parse_args()
    if args.table:
        print(table(read_rows(args.out, "plan_tpu", "")))
        return
    if args.docs:
        write_docs(args.out)
        return
    import jax

    jax.config.update("jax_platforms", "cpu")
    argv = [] if args.row is None else ["--row", str(args.row)]
    for index in range(len(ROWS)) if args.row is None else [args.row]:
        plan_row(index, args.out, argv)
    if args.row is None:
        write_docs(args.out)


def write_docs(out: Path) -> None:
    """docs/rlhf.md with ``out``'s table between its markers."""
    DOCS.write_text(with_block(DOCS.read_text(), *MARKERS, table(read_rows(out, "plan_tpu", ""))))


if __name__ == "__main__":
    main()
