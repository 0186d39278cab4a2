"""The planner (``ppojax plan``) on published model shapes: bytes per device, launches, the
step-time estimate and the verdict of a post-training step, compiled for H100s on a CPU.

    PYTHONPATH=/path/to/aotsite JAX_PLATFORMS=cpu python benchmarks/plan.py \\
        [--model qwen2.5-0.5b] [--algorithm grpo] [--devices 1] [--logit-chunk 4096] \\
        [--search] [--out FILE]
    ... python benchmarks/plan.py --matrix     every row of MATRIX, one after the other
    ... python benchmarks/plan.py --matrix --part 1/2 & ... --part 2/2    in two processes

Needs the CUDA plugin of the ``gpu-aot`` extra. Each run adds (or replaces) one row, keyed by
model, step and target, in benchmarks/results/plan.json, with the plan's numbers and the
seconds the compile took on this machine (the search's compiles are not timed).
``python benchmarks/plan.py --table`` prints the rows of that file as docs/rlhf.md's table.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import sys
from pathlib import Path

from common import RESULTS, markdown_table, merge_row, read_rows, record, write_json

from ppojax.plan.planner import StepShape
from ppojax.plan.sizing import plan


def verdict(row: dict) -> str:
    """yes or no, and with ``--search`` the largest prompts per step that fit."""
    said = "yes" if row["fits"] else "no"
    if row.get("largest_prompts") is not None:
        said += f" (up to {row['largest_prompts']} prompts)"
    return said


def table(results: dict) -> str:
    """GiB per device by part, the verdict, the estimate and the compile's seconds, a row per
    plan."""
    gib = 1024**3
    header = ["model", "step", "GPUs", "params", "ref.", "critic", "Adam", "temp.", "out."]
    header += ["peak", "fits", "in the loop", "est. s/step", "compile s"]
    rows = []
    for row in results["tasks"]:
        step, memory = row["step"], row["memory"]
        lora = f" LoRA r{step['lora_rank']}" if step["lora_rank"] else ""
        lora += " remat" if step.get("remat_layers") else ""
        # rows measured before logit_chunk existed computed every logit at once
        chunk = f", logits by {step['logit_chunk']}" if step.get("logit_chunk") else ""
        what = (
            f"{step['algorithm']}{lora} {step['prompts']} x {step['group_size']}, "
            f"{step['prompt_len']} + {step['response_len']}, {step['dtype']}{chunk}"
        )
        parts = ("parameters", "reference", "critic", "optimizer", "temporaries", "outputs")
        cells = [f"{memory[part] / gib:.2f}" for part in (*parts, "peak")]
        estimate = row["estimate"]["step"] if row["estimate"] else None
        # rows planned before the loop donated its state give its peak apart (the outputs a
        # copy of their own); since, the loop's peak is the step's
        in_loop = row.get("loop_peak", memory["peak"] + memory.get("aliased", 0))
        fits_loop = "fits" if in_loop <= row["usable"] else "no"
        rows.append(
            [row["model"], what, f"{row['devices']} x {row['target']}", *cells]
            + [verdict(row), f"{in_loop / gib:.2f}, {fits_loop}"]
            + [f"{estimate:.3g}", f"{row['compile_seconds']:.0f}"]
        )
    return markdown_table(header, rows)


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-0.5b")
    parser.add_argument("--algorithm", default="grpo")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--response-len", type=int, default=1024)
    parser.add_argument("--lora-rank", type=int, default=0)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--logit-chunk", type=int, default=StepShape.logit_chunk)
    parser.add_argument("--target", default="h100")
    parser.add_argument("--remat-layers", action="store_true")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--search", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS / "plan.json")
    parser.add_argument("--table", action="store_true", help="print --out's rows as markdown")
    # the flags above size one row; these run the table's rows
    matrix = parser.add_argument_group(
        "the table's rows", "--part and --keep-since go with --matrix"
    )
    matrix.add_argument(
        "--matrix",
        action="store_true",
        help="every row of MATRIX in turn (hours on a 2-core CPU), each saved as it finishes",
    )
    matrix.add_argument(
        "--part",
        metavar="K/N",
        help="rows K, K+N, K+2N, ... only, for N processes sharing --out",
    )
    matrix.add_argument(
        "--keep-since",
        metavar="ISO_DATE",
        help="skip the rows --out already holds from this date on (a resumed run)",
    )
    return parser


def main() -> None:
    parser = PARSER
    args = parser.parse_args()
    if args.table:
        print(table(read_rows(args.out, "plan", "")))
        return
    import jax

    jax.config.update("jax_platforms", "cpu")
    if not args.matrix:
        plan_row(vars(args), args.out, sys.argv[1:])
        return
    kept = {
        row["key"]
        for row in read_rows(args.out, "plan", "")["tasks"]
        if args.keep_since and row["date"] >= args.keep_since
    }
    part, parts = parse_part(args.part)
    for flags in MATRIX[part - 1 :: parts]:
        if plan_key(parse_flags(parser, flags)) in kept:
            continue
        argv = [*flags, *(["--out", str(args.out)] if args.out != RESULTS / "plan.json" else [])]
        plan_row({**vars(args), **parse_flags(parser, flags)}, args.out, argv)


# The published shapes by the steps people post-train them with, 512 + 1024 tokens, 8 x 8 (PPO:
# 64 x 1): full fine-tuning and LoRA r16 GRPO, PPO with a critic, on 1 and 8 H100s. One H100's
# rows rematerialize the layers (the lever that makes them fit: without it Qwen2.5-1.5B's LoRA
# step keeps every layer's activations for the backward pass, 85 GiB).
MATRIX = [
    [*model, *step, *(["--remat-layers"] if devices == "1" else [])] + ["--devices", devices]
    for model in (
        ["--model", name] for name in ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "llama-3.1-8b")
    )  # fmt: skip
    for step in (
        ["--algorithm", "grpo"],
        ["--algorithm", "grpo", "--lora-rank", "16"],
        ["--algorithm", "ppo", "--prompts", "64", "--group-size", "1"],
    )
    for devices in ("1", "8")
]


def parse_part(text: str | None) -> tuple[int, int]:
    """``--part K/N`` as (K, N); (1, 1) without it."""
    if text is None:
        return 1, 1
    try:
        part, parts = (int(n) for n in text.split("/"))
    except ValueError:
        part = parts = 0
    if not 1 <= part <= parts:
        raise SystemExit(f"--part must be K/N with 1 <= K <= N, got {text!r}")
    return part, parts


def parse_flags(parser: argparse.ArgumentParser, flags: list[str]) -> dict:
    """``flags`` over the parser's defaults (not over the command line's own flags)."""
    return vars(parser.parse_args(flags))


def plan_key(args: dict) -> str:
    """The row's key in the results file: model, step and target."""
    return (
        f"{args['model']} {args['algorithm']} {args['prompts']}x{args['group_size']} "
        f"{args['prompt_len']}+{args['response_len']} {args['dtype']} lora{args['lora_rank']} "
        f"{args['devices']}x{args['target']}" + (" remat" if args["remat_layers"] else "")
    )


def matrix_order(key: str) -> int:
    """A row's place: MATRIX's order, rows outside it after."""
    keys = [plan_key(parse_flags(PARSER, flags)) for flags in MATRIX]
    return keys.index(key) if key in keys else len(keys)


def plan_row(args: dict, out: Path, argv: list[str]) -> None:
    """One plan of ``args`` printed and merged into ``out`` (keyed by model, step, target)."""
    step = StepShape(
        args["algorithm"],
        prompts=args["prompts"],
        group_size=args["group_size"],
        prompt_len=args["prompt_len"],
        response_len=args["response_len"],
        lora_rank=args["lora_rank"],
        dtype=args["dtype"],
        remat_layers=args["remat_layers"],
        logit_chunk=args["logit_chunk"],
    )
    found = plan(args["model"], step, args["target"], args["devices"], search=args["search"])
    print(found.report(), flush=True)
    row = {"key": plan_key(args), **found.to_dict(), **record(__file__, argv)}
    out.parent.mkdir(parents=True, exist_ok=True)
    # --part's processes share the file: each read-merge-write holds a lock on its folder
    folder = os.open(out.parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        results = read_rows(out, "plan", "ppojax plan on published shapes, compiled on a CPU")
        write_json(out, merge_row(results, row, "key", order=matrix_order))
    finally:
        os.close(folder)  # and with it the lock


PARSER = arguments()

if __name__ == "__main__":
    main()
