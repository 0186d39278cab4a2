"""What ppojax, rejax 0.1.3 and PureJaxRL would run on one TPU chip, counted without one:
ops, fusions and bytes per update, and the program's peak memory.

    JAX_PLATFORMS=cpu python benchmarks/tpu_program.py [--targets v5e v6e]
        [--works NAME ...] [--programs ppojax rejax purejaxrl] [--purejaxrl DIR]
        [--out benchmarks/results/tpu_program.json] [--replace] [--smoke]
    JAX_PLATFORMS=cpu python benchmarks/tpu_program.py --candidates [VARIANT ...]
        [--targets v5e] [--works '1 agent x 8192 envs']
    python benchmarks/tpu_program.py --readme docs/tpu.md

benchmarks/gpu_program.py's programs (each library's ``jax.jit(jax.vmap(train))`` over keys,
CartPole-v1 with PureJaxRL's classic PPO config, at benchmarks/gpu.py's works; by default
1 agent x 8192 envs) compiled for one chip of each TPU target
(``ppojax.runtime.deviceless_tpu``: libtpu from ``pip install "ppojax[tpu-aot]"``) and
counted with the GPU count's rule (``ppojax.runtime.launches``): an op is each fusion, custom
call, copy or other instruction that does work, in the entry or a loop's body or condition;
its bytes are its operands' and its result's, of a buffer a fusion slices or updates in place
the slice; loops times their trips, which TPU HLO does not record and the loops' conditions
give. Fusions: the ops that are fusions. Peak memory: libtpu's ``memory_analysis()``.

PureJaxRL and rejax as in benchmarks/gpu_program.py (``--purejaxrl DIR``, a checkout; rejax
installed); without them their rows are left out. ``--readme FILE`` writes the table of
``--out`` into FILE between its markers. ``--smoke``: the works shrunk, results in /tmp.

``--candidates``: ppojax's program with each of ``VARIANTS`` ("plain": no candidate and no
platform's default; each of ``ppojax.runtime.kernels.CANDIDATES`` alone; then those that cut
ops or bytes by 10% alone, together), by default at
1 agent x 8192 envs on the v5e target, counted as the rows are; they go into the
``candidates`` section of ``--out`` (rows of the same variant, work and target replaced, the
rest kept), and ``--readme`` writes their table where FILE has its markers.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import jax
from common import command_line, package_version, record, with_block
from gpu_parts import candidates_on
from gpu_program import (
    COUNTED_WORKS,
    NAMES,
    SMOKE_WORKS,
    candidate_cells,
    count_programs,
    count_row,
    count_variants,
    parse_program_args,
    ppojax_program,
    size,
    without_purejaxrl,
    write_readme,
)

from ppojax.runtime import deviceless_tpu, kernels

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "tpu_program.json"
DEFAULT_WORKS = ("1 agent x 8192 envs",)
TABLE_START, TABLE_END = "<!-- tpu-program-table:start -->", "<!-- tpu-program-table:end -->"
CANDIDATES_START = "<!-- tpu-candidates-table:start -->"
CANDIDATES_END = "<!-- tpu-candidates-table:end -->"
# name: the kernels candidates on (every platform's defaults not among them off)
VARIANTS: dict[str, tuple[str, ...]] = (
    {"plain": ()}
    | {name: (name,) for name in kernels.CANDIDATES}
    | {
        "pallas_ppo_loss + associative_gae": ("pallas_ppo_loss", "associative_gae"),
        "pallas_ppo_loss + associative_gae + fused_actor_critic": (
            "pallas_ppo_loss",
            "associative_gae",
            "fused_actor_critic",
        ),
    }
)


def memory(compiled: Any) -> dict[str, int | None]:
    """The buffers of a compiled program (``memory_analysis()``), in bytes; ``peak`` is
    libtpu's own peak where jax reports it."""
    stats = compiled.memory_analysis()
    fields = ("argument", "output", "alias", "temp")
    found = {name: getattr(stats, f"{name}_size_in_bytes", None) for name in fields}
    found["peak"] = getattr(stats, "peak_memory_in_bytes", None)
    return found


def tpu_row(program: str, make: Any, work: str, spec: tuple[int, int, int], target: str) -> dict:
    """One program at one work compiled for one chip of ``target`` and counted."""
    kept: dict[str, Any] = {}

    def compile_for(fn: Any, args: Any, target: str) -> Any:
        kept["compiled"] = deviceless_tpu.compile_for(fn, args, target)
        return kept["compiled"]

    row = count_row(
        program, make, work, spec, target, compile_for=compile_for, trips_from_condition=True
    )
    row["fusions_per_update"] = row["per_update"]["by_opcode"].get("fusion", 0)
    row["memory"] = memory(kept["compiled"])
    return row


def candidate_row(variant: str, work: str, spec: tuple[int, int, int], target: str) -> dict:
    """ppojax's program with ``VARIANTS[variant]`` on, compiled for ``target`` and counted."""
    names = VARIANTS[variant]
    with candidates_on(names):
        row = tpu_row("ppojax", ppojax_program, work, spec, target)
    return {"variant": variant, "candidates": list(names)} | row


def count_candidates(args: argparse.Namespace, argv: list[str]) -> int:
    """The ``--candidates`` rows into the ``candidates`` section of ``args.out``, read again
    before each write."""
    command = command_line(__file__, argv)
    shown = ("variant", "target", "error")
    return count_variants(args, candidate_row, lambda: header(argv), command, shown)


def candidates_table(report: dict) -> str:
    """The docs' table of ``report``'s ``candidates`` section: per variant, ops and bytes per
    update and per minibatch step, and the change per update against "plain"."""
    section = report["candidates"]
    lines = [
        "| variant | work | target | ops per update | bytes per update "
        "| ops / bytes per minibatch step | peak memory |",
        "|---|---|---|---|---|---|---|",
    ]
    for row, ops, moved in candidate_cells(report, VARIANTS):
        step = row["per_minibatch_step"]
        lines.append(
            f"| {row['variant']} | {row['work']} | {row['target']} | {ops} | {moved} "
            f"| {step['launches']:,} / {size(step['bytes'])} | {peak(row)} |"
        )
    lines.append("")
    lines.append(
        f"Counted {section['date'][:10]}, jax {report['versions']['jax']}, libtpu "
        f"{report['versions']['libtpu']}: "
        + "; ".join(f"`{command}`" for command in section["commands"])
    )
    return "\n".join(lines)


def header(argv: list[str]) -> dict[str, Any]:
    report = {
        "benchmark": "tpu_program: ops, fusions and bytes of each library's program for one TPU "
        "chip, counted from its deviceless compile (CartPole-v1, PureJaxRL's classic PPO config)",
        **record(__file__, argv, "rejax", "distrax"),
        "targets": {name: slice_name for name, (slice_name, _) in deviceless_tpu.TARGETS.items()},
        "counting": [
            "an op: each fusion, custom call, copy or other instruction that does work, of the "
            "entry computation or of a loop's body or condition (condition once a trip)",
            "bytes: operands' and result's sizes of every op, no cache credit, neither tiling "
            "padding nor memory space (HBM or VMEM) told apart; of a buffer a fusion slices or "
            "updates in place (dynamic-slice, dynamic-update-slice), the slice",
            "loop trips: read from each loop's condition (a counter from a constant, less than "
            "a constant, plus 1 a trip); TPU HLO records none",
            "per_update: one trip of the update loop; fusions_per_update: its ops that are "
            "fusions; memory: memory_analysis() of the whole program, peak as libtpu gives it",
            "one chip: a mesh over one device of the target's 2x2 slice (single-chip "
            "topologies are refused)",
        ],
        "rows": [],
    }
    report["versions"]["libtpu"] = package_version("libtpu")
    return report


def peak(row: dict | None) -> str:
    """A row's peak memory as the table shows it; "-" where there is none."""
    found = row and row["memory"]["peak"]
    return size(found) if found else "-"


def markdown_table(report: dict) -> str:
    """The docs' table of ``report``: per work and target, ops, fusions and bytes per update
    and peak memory of each program."""
    programs = [name for name in NAMES if any(row["program"] == name for row in report["rows"])]
    found = {(r["work"], r["target"], r["program"]): r for r in report["rows"] if "error" not in r}
    names = " / ".join(NAMES[name] for name in programs)
    lines = [
        f"| work | target | ops per update: {names} | fusions per update: {names} "
        f"| bytes per update: {names} | peak memory: {names} |",
        "|---|---|---|---|---|---|",
    ]
    keys = dict.fromkeys((row["work"], row["target"]) for row in report["rows"])
    for work, target in sorted(keys, key=lambda key: (key[1], key[0])):
        rows = [found.get((work, target, name)) for name in programs]
        columns = [
            [f"{row['per_update']['launches']:,}" if row else "-" for row in rows],
            [f"{row['fusions_per_update']:,}" if row else "-" for row in rows],
            [size(row["per_update"]["bytes"]) if row else "-" for row in rows],
            [peak(row) for row in rows],
        ]
        cells = " | ".join(" / ".join(column) for column in columns)
        lines.append(f"| {work} | {target} | {cells} |")
    versions = report["versions"]
    lines.append("")
    lines.append(
        f"Counted on {report['machine']['cpu']} ({report['date'][:10]}), Python "
        f"{report['machine']['python']}, jax {versions['jax']}, libtpu {versions['libtpu']}"
        + (f", rejax {versions['rejax']}" if "rejax" in programs else "")
        + f": `{report['command']}`"
    )
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    readme = "write --out's table into this file"
    targets, variants = list(deviceless_tpu.TARGETS), list(VARIANTS)
    args = parse_program_args(argv, __doc__, targets, DEFAULT_OUT, readme, variants)
    if args.candidates is not None:
        args.targets = args.targets or ["v5e"]
    args.targets = args.targets or list(deviceless_tpu.TARGETS)
    works = SMOKE_WORKS if args.smoke else COUNTED_WORKS
    named = args.works or ([next(iter(SMOKE_WORKS))] if args.smoke else DEFAULT_WORKS)
    args.works = {name: works[name] for name in named if name in works}
    without_purejaxrl(args)
    if args.readme is None and "rejax" in args.programs and package_version("rejax") is None:
        print("rejax is not installed: its rows are left out", flush=True)
        args.programs = [name for name in args.programs if name != "rejax"]
    return args


def readme_tables(path: Path, report: dict) -> str:
    """The text of ``path`` with ``report``'s table, and its candidates' where it has their
    markers."""
    readme = with_block(path.read_text(), TABLE_START, TABLE_END, markdown_table(report))
    if "candidates" in report and CANDIDATES_START in readme:
        readme = with_block(readme, CANDIDATES_START, CANDIDATES_END, candidates_table(report))
    return readme


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.readme is not None:
        return write_readme(args, readme_tables)
    if not os.environ.get("JAX_PLATFORMS"):  # libtpu must not start as a backend here
        jax.config.update("jax_platforms", "cpu")
    if args.candidates is not None:
        return count_candidates(args, argv)
    return count_programs(args, header(argv), tpu_row, ("fusions_per_update", "memory"))


if __name__ == "__main__":
    raise SystemExit(main())
