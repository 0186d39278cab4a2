"""What ppojax, rejax 0.1.3 and PureJaxRL would run on a GPU, counted without one: kernel
launches and bytes per env step, GAE, minibatch step and update.

    JAX_PLATFORMS=cpu python benchmarks/gpu_program.py --purejaxrl DIR
        [--targets h200 h100] [--works NAME ...] [--programs ppojax rejax purejaxrl]
        [--out benchmarks/results/gpu_program.json] [--replace] [--smoke]
    JAX_PLATFORMS=cpu python benchmarks/gpu_program.py --candidates [VARIANT ...]
        [--targets h200] [--works '1 agent x 8192 envs']

Each library's ``jax.jit(jax.vmap(train))`` over keys, on CartPole-v1 with PureJaxRL's classic
PPO config, as benchmarks/gpu.py times them on a GPU, is compiled here for one GPU of each
target (``ppojax.runtime.deviceless``: XLA's spec of the H200 and of the H100 SXM, the CUDA
plugin from ``pip install "ppojax[gpu-aot]"``), at the four works of benchmarks/gpu.py, and
its optimized HLO counted (``ppojax.runtime.launches``: each fusion, custom call and copy is
a launch; its bytes are its operands' and its result's, no cache credit, of a buffer sliced
or updated in place the slice; loops times their trip counts). Phases: one env step (the
rollout loop's body), GAE (its loop), one minibatch step (the update loop's body), the
epochs, the rest, one update, the whole program.

PureJaxRL: ``--purejaxrl DIR`` is a checkout of github.com/luchris429/purejaxrl (its
``purejaxrl/ppo.py`` is imported from there, not copied); it unpacks gymnax's old five-value
step, so its env gets gymnax's LegacyStepAPIWrapper as rejax's does. Without ``--purejaxrl``
its rows are left out. Writes ``--out`` after every row (an interrupted run keeps its rows);
with ``--replace``, into the ``--out`` there is, whose other rows it keeps.
``--smoke``: the works shrunk to seconds of compiling, results in /tmp.

``--candidates``: ppojax's program with each of ``VARIANTS`` (the kernels candidates of
``ppojax.runtime.kernels``, alone and combined, and ``compute_dtype="bfloat16"``), by
default at 1 agent x 8192 envs on the H200 target; its rows go into the ``candidates``
section of ``--out`` (rows of the same variant, work and target replaced, the rest kept).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
from common import (
    command_line,
    failure,
    legacy_step_env,
    now,
    package_version,
    record,
    rejax_algo,
    with_block,
    write_json,
)
from gpu import WORKS
from gpu_parts import candidates_on, classic

import ppojax
from ppojax.runtime import deviceless, launches

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "gpu_program.json"
# name: (agents, envs per agent, updates): benchmarks/gpu.py's works
COUNTED_WORKS = {
    name: (agents, envs, updates) for name, (agents, envs, updates, *_) in WORKS.items()
}
SMOKE_WORKS = {"1 agent x 4 envs": (1, 4, 3), "2 agents x 8 envs": (2, 8, 3)}
PROGRAMS = ("ppojax", "rejax", "purejaxrl")
# name: (kernels candidates on, compute_dtype); "plain" turns every GPU default off
VARIANTS: dict[str, tuple[tuple[str, ...], str]] = {
    "plain": ((), "float32"),
    "gather_once": (("gather_once",), "float32"),
    "fused_actor_critic": (("fused_actor_critic",), "float32"),
    "pallas_ppo_loss": (("pallas_ppo_loss",), "float32"),
    "bfloat16": ((), "bfloat16"),
    "gather_once + fused_actor_critic": (("gather_once", "fused_actor_critic"), "float32"),
    "gather_once + pallas_ppo_loss": (("gather_once", "pallas_ppo_loss"), "float32"),
    "all three": (("gather_once", "fused_actor_critic", "pallas_ppo_loss"), "float32"),
    "bfloat16 + gather_once + fused_actor_critic": (
        ("gather_once", "fused_actor_critic"),
        "bfloat16",
    ),
}


def ppojax_program(config: ppojax.PPOConfig, keys: jax.Array) -> tuple[Callable, tuple]:
    return jax.vmap(ppojax.train, in_axes=(None, 0)), (config, keys)


def rejax_program(config: ppojax.PPOConfig, keys: jax.Array) -> tuple[Callable, tuple]:
    return jax.vmap(rejax_algo(config).train), (keys,)


def purejaxrl_config(config: ppojax.PPOConfig) -> dict[str, Any]:
    """PureJaxRL's config dict for ``config`` (its classic CartPole settings)."""
    return {
        "LR": config.learning_rate,
        "NUM_ENVS": config.num_envs,
        "NUM_STEPS": config.num_steps,
        "TOTAL_TIMESTEPS": config.num_updates * config.batch_size,
        "UPDATE_EPOCHS": config.update_epochs,
        "NUM_MINIBATCHES": config.num_minibatches,
        "GAMMA": config.gamma,
        "GAE_LAMBDA": config.gae_lambda,
        "CLIP_EPS": config.clip_eps,
        "ENT_COEF": config.ent_coef,
        "VF_COEF": config.vf_coef,
        "MAX_GRAD_NORM": config.max_grad_norm,
        "ACTIVATION": config.activation,
        "ENV_NAME": config.env_id,
        "ANNEAL_LR": config.anneal_lr,
        "DEBUG": False,
    }


def module_from_file(name: str, path: Path) -> types.ModuleType:
    """The Python file ``path`` run as the module ``name``, registered in ``sys.modules`` under
    that name (where an import of that name finds it); a file that fails leaves no entry."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


@functools.cache
def purejaxrl_module(folder: Path) -> types.ModuleType:
    """PureJaxRL's ``purejaxrl/ppo.py`` loaded from its checkout by path, its ``gymnax.make``
    giving the five-value step. ppo.py imports its sibling by name (``from wrappers import
    ...``), so ``purejaxrl/wrappers.py`` is loaded first as the module ``wrappers``."""
    source = folder / "purejaxrl"
    module_from_file("wrappers", source / "wrappers.py")
    ppo = module_from_file("purejaxrl_ppo", source / "ppo.py")
    gymnax = ppo.gymnax

    def make(env_id: str, **kwargs: Any) -> tuple[Any, Any]:
        env, params = gymnax.make(env_id, **kwargs)
        return legacy_step_env(env), params

    ppo.gymnax = types.SimpleNamespace(make=make)
    return ppo


def purejaxrl_program(folder: Path) -> Callable[..., tuple[Callable, tuple]]:
    def program(config: ppojax.PPOConfig, keys: jax.Array) -> tuple[Callable, tuple]:
        return jax.vmap(purejaxrl_module(folder).make_train(purejaxrl_config(config))), (keys,)

    return program


def count_row(
    program: str,
    make: Callable,
    work: str,
    spec: tuple[int, int, int],
    target: str,
    compute_dtype: str = "float32",
    compile_for: Callable[..., Any] = deviceless.compile_for,
    trips_from_condition: bool = False,
) -> dict:
    """One program at one work compiled for ``target`` (by ``compile_for``: a GPU's by
    default) and counted (loops without XLA's trip counts, a TPU's, take their conditions'
    with ``trips_from_condition``)."""
    agents, envs, updates = spec
    config = classic(envs, updates).replace(compute_dtype=compute_dtype)
    row: dict[str, Any] = {
        "program": program,
        "work": work,
        "target": target,
        "agents": agents,
        "envs_per_agent": envs,
        "num_steps": config.num_steps,
        "updates": updates,
        "epochs": config.update_epochs,
        "minibatches": config.num_minibatches,
    }
    fn, args = make(config, jax.random.split(jax.random.key(0), agents))
    began = time.perf_counter()
    compiled = compile_for(fn, args, target)
    row["compile_s"] = round(time.perf_counter() - began, 1)
    program_tree = launches.count(compiled.as_text(), trips_from_condition)
    row.update(
        launches.ppo_phases(
            program_tree, updates, config.num_steps, config.update_epochs, config.num_minibatches
        )
    )
    memory = compiled.memory_analysis()
    row["temp_bytes"] = getattr(memory, "temp_size_in_bytes", None)
    row["loops"] = launches.tree(program_tree).splitlines()
    return row


TABLE_START, TABLE_END = "<!-- gpu-program-table:start -->", "<!-- gpu-program-table:end -->"
NAMES = {"ppojax": "ppojax", "rejax": "rejax", "purejaxrl": "PureJaxRL"}


def size(count: int) -> str:
    return f"{count / 1e9:.1f} GB" if count >= 1e9 else f"{count / 1e6:.0f} MB"


def markdown_table(report: dict) -> str:
    """The README's table of ``report``: per work and target, launches and bytes per update of
    each program, and ppojax's launches per env step and per minibatch step."""
    programs = [name for name in NAMES if any(row["program"] == name for row in report["rows"])]
    found = {(r["work"], r["target"], r["program"]): r for r in report["rows"] if "error" not in r}
    names = " / ".join(NAMES[name] for name in programs)
    lines = [
        f"| work | target | launches per update: {names} | bytes per update: {names} "
        "| ppojax launches per env step / minibatch step |",
        "|---|---|---|---|---|",
    ]
    keys = dict.fromkeys((row["work"], row["target"]) for row in report["rows"])
    for work, target in sorted(keys, key=lambda key: (key[1] != "h200", key[1])):
        rows = [found.get((work, target, name)) for name in programs]
        per_update = [row["per_update"] if row else None for row in rows]
        launch_text = " / ".join(f"{p['launches']:,}" if p else "-" for p in per_update)
        byte_text = " / ".join(size(p["bytes"]) if p else "-" for p in per_update)
        own = found.get((work, target, "ppojax"))
        steps = (
            f"{own['per_env_step']['launches']:.4g} / {own['per_minibatch_step']['launches']}"
            if own
            else "-"
        )
        lines.append(f"| {work} | {target.upper()} | {launch_text} | {byte_text} | {steps} |")
    versions = report["versions"]
    lines.append("")
    lines.append(
        f"Counted on {report['machine']['cpu']} ({report['date'][:10]}), jax {versions['jax']}, "
        f"CUDA plugin {versions['cuda_plugin']}, rejax {versions['rejax']}: "
        f"`{report['command']}`"
    )
    return "\n".join(lines)


CANDIDATES_START = "<!-- gpu-candidates-table:start -->"
CANDIDATES_END = "<!-- gpu-candidates-table:end -->"


def candidate_cells(report: dict, variants: Any = None) -> list[tuple[dict, str, str]]:
    """The rows of ``report``'s ``candidates`` section that counted, by target, work and
    variant (in the order of ``variants``, default ``VARIANTS``), each with its launches (a
    TPU's ops) and bytes per update as text and their change against "plain" at the same work
    and target."""
    rows = [row for row in report["candidates"]["rows"] if "error" not in row]
    order = list(VARIANTS if variants is None else variants)
    rows.sort(key=lambda row: (row["target"], row["work"], order.index(row["variant"])))
    plain = {(r["work"], r["target"]): r for r in rows if r["variant"] == "plain"}

    def change(value: int, base: int | None) -> str:
        return f" ({value / base - 1:+.0%})" if base else ""

    cells = []
    for row in rows:
        base = plain.get((row["work"], row["target"]))
        update, base_update = row["per_update"], base and base["per_update"]
        launches = f"{update['launches']:,}" + change(
            update["launches"], base_update and base_update["launches"]
        )
        moved = size(update["bytes"]) + change(
            update["bytes"], base_update and base_update["bytes"]
        )
        cells.append((row, launches, moved))
    return cells


def candidates_table(report: dict) -> str:
    """The README's table of ``report``'s ``candidates`` section: per variant, launches and
    bytes per update, per env step and per minibatch step, and the change per update against
    "plain" at the same work and target."""
    section = report["candidates"]
    lines = [
        "| variant | work | target | launches per update | bytes per update "
        "| launches per env step / minibatch step | bytes per minibatch step |",
        "|---|---|---|---|---|---|---|",
    ]
    for row, launches_text, bytes_text in candidate_cells(report):
        steps = f"{row['per_env_step']['launches']:.4g} / {row['per_minibatch_step']['launches']}"
        minibatch_bytes = size(row["per_minibatch_step"]["bytes"])
        lines.append(
            f"| {row['variant']} | {row['work']} | {row['target'].upper()} | {launches_text} "
            f"| {bytes_text} | {steps} | {minibatch_bytes} |"
        )
    lines.append("")
    lines.append(
        f"Counted {section['date'][:10]}, jax {report['versions']['jax']}: "
        + "; ".join(f"`{command}`" for command in section["commands"])
    )
    return "\n".join(lines)


def readme_with_table(readme: str, table: str) -> str:
    """``readme`` with the block between the table's markers replaced by ``table``."""
    return with_block(readme, TABLE_START, TABLE_END, table)


def header(argv: list[str]) -> dict[str, Any]:
    plugin = package_version("jax-cuda13-plugin") or package_version("jax-cuda12-plugin")
    report = {
        "benchmark": "gpu_program: launches and bytes of each library's GPU program, counted "
        "from its deviceless compile (CartPole-v1, PureJaxRL's classic PPO config)",
        **record(__file__, argv, "rejax", "distrax"),
        "targets": {name: deviceless.TARGETS[name] for name in deviceless.TARGETS},
        "counting": [
            "a launch: each fusion, custom call, copy, sort or collective of the entry "
            "computation or of a loop's body or condition (condition once a trip)",
            "bytes: operands' and result's sizes of every launch, no cache credit; of a buffer "
            "a fusion slices or updates in place (dynamic-slice, dynamic-update-slice), the slice",
            "per_update: one trip of the update loop; rollout, gae, epochs: their loops "
            "inside it times their trips; rest: the update's launches outside them",
            "no autotuning (default Triton gemms) and the generic sort instead of CUB",
        ],
        "rows": [],
    }
    report["versions"]["cuda_plugin"] = plugin
    return report


def guarded(count: Callable[[], dict], key: dict) -> dict:
    """The row ``count()`` makes, or ``key`` with the error where it raises: one row's failure
    must not lose the others."""
    try:
        return count()
    except Exception as error:
        return {**key, "error": failure(error)}


def replaced(rows: list[dict], row: dict, key: tuple[str, ...]) -> list[dict]:
    """``rows`` without the old row whose ``key`` fields equal ``row``'s, then ``row``."""
    same = [row[name] for name in key]
    return [old for old in rows if [old[name] for name in key] != same] + [row]


def candidate_row(variant: str, work: str, spec: tuple[int, int, int], target: str) -> dict:
    """ppojax's program with ``VARIANTS[variant]``, traced with those candidates on and CUDA's
    defaults not among them off, compiled for ``target`` and counted."""
    names, compute_dtype = VARIANTS[variant]
    with candidates_on(names):
        row = count_row("ppojax", ppojax_program, work, spec, target, compute_dtype)
    return {"variant": variant, "candidates": list(names), "compute_dtype": compute_dtype} | row


def count_candidates(args: argparse.Namespace, argv: list[str]) -> int:
    """The ``--candidates`` rows into the ``candidates`` section of ``args.out``, read again
    before each write (another such run may be writing rows of other variants into it)."""
    command = command_line(__file__, argv)
    fresh = functools.partial(header, argv)
    return count_variants(args, candidate_row, fresh, command, ("variant",))


def count_variants(
    args: argparse.Namespace,
    count: Callable[[str, str, tuple[int, int, int], str], dict],
    fresh: Callable[[], dict],
    command: str,
    shown: tuple[str, ...],
) -> int:
    """Each of ``args.candidates`` at each target and work counted (``count(variant, work,
    spec, target)``, as ``candidate_row``) into the ``candidates`` section of ``args.out``
    (``fresh()`` where there is none), read again before each write; printed with its
    ``shown`` fields. 1 where a row failed, else 0."""
    failed = 0
    for target in args.targets:
        for work, spec in args.works.items():
            for variant in args.candidates:
                row = guarded(
                    functools.partial(count, variant, work, spec, target),
                    {"variant": variant, "work": work, "target": target},
                )
                failed += "error" in row
                report = json.loads(args.out.read_text()) if args.out.exists() else fresh()
                section = report.setdefault("candidates", {"commands": [], "rows": []})
                section["commands"] = list(dict.fromkeys([*section["commands"], command]))
                section["rows"] = replaced(section["rows"], row, ("variant", "work", "target"))
                section["date"] = now()
                write_json(args.out, report)
                brief = {key: row.get(key) for key in shown}
                print(json.dumps(brief | {"per_update": row.get("per_update")}), flush=True)
    return 1 if failed else 0


def replacing(kept: dict, fresh: dict) -> dict:
    """``kept`` (a report read back) whose rows this run replaces: its command followed by
    this one's, its ppojax commits followed by this one's, this run's date."""
    commit = fresh["versions"]["ppojax_commit"]
    kept["command"] += f"; then rows replaced by those of: {fresh['command']}"
    commits = kept["versions"]["ppojax_commit"]
    commits = commits if isinstance(commits, list) else [commits]
    kept["versions"]["ppojax_commit"] = list(dict.fromkeys([*commits, commit]))
    kept["date"] = fresh["date"]
    return kept


def parse_program_args(
    argv: list[str],
    doc: str,
    targets: list[str],
    default_out: Path,
    readme: str,
    variants: list[str],
) -> argparse.Namespace:
    """The flags of a program-counting benchmark (this one, ``tpu_program``): ``doc`` its
    docstring, ``readme`` what its --readme writes; --candidates named none: all
    ``variants``, --smoke's --out in a temporary folder."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--targets", nargs="+", choices=targets)
    parser.add_argument("--works", nargs="+", choices=list(COUNTED_WORKS))
    parser.add_argument("--programs", nargs="+", choices=PROGRAMS, default=list(PROGRAMS))
    parser.add_argument("--purejaxrl", type=Path, help="a checkout of luchris429/purejaxrl")
    parser.add_argument("--out", type=Path, help=f"the JSON (default {default_out})")
    parser.add_argument("--smoke", action="store_true", help="tiny works, results in /tmp")
    parser.add_argument("--readme", type=Path, help=readme)
    parser.add_argument(
        "--replace",
        action="store_true",
        help="keep --out's other rows: replace only the rows counted now",
    )
    parser.add_argument(
        "--candidates",
        nargs="*",
        choices=variants,
        help="count ppojax with these VARIANTS (none named: all)",
    )
    args = parser.parse_args(argv)
    if args.candidates is not None:
        args.candidates = args.candidates or variants
    if args.out is None:
        smoke_out = Path(tempfile.gettempdir()) / "ppojax-smoke" / default_out.name
        args.out = smoke_out if args.smoke else default_out
    return args


def parse_args(argv: list[str]) -> argparse.Namespace:
    readme = "write --out's tables into this file, where it has their markers"
    targets, variants = list(deviceless.TARGETS), list(VARIANTS)
    args = parse_program_args(argv, __doc__, targets, DEFAULT_OUT, readme, variants)
    first_work = next(iter(SMOKE_WORKS)) if args.smoke else "1 agent x 8192 envs"
    if args.candidates is not None:  # one target and one work unless named
        args.targets, args.works = args.targets or ["h200"], args.works or [first_work]
    args.targets = args.targets or ["h200", "h100"]
    works = SMOKE_WORKS if args.smoke else COUNTED_WORKS
    args.works = {name: works[name] for name in (args.works or works) if name in works}
    without_purejaxrl(args)
    return args


def without_purejaxrl(args: argparse.Namespace) -> None:
    """PureJaxRL's rows left out of a counting run (not a --readme one) given no checkout."""
    if "purejaxrl" in args.programs and args.purejaxrl is None and args.readme is None:
        print("no --purejaxrl checkout: PureJaxRL's rows are left out", flush=True)
        args.programs = [name for name in args.programs if name != "purejaxrl"]


def readme_tables(path: Path, report: dict) -> str:
    """The text of ``path`` with ``report``'s tables where it has their markers."""
    readme = path.read_text()
    if TABLE_START not in readme and CANDIDATES_START not in readme:
        raise SystemExit(f"--readme {path}: it has neither {TABLE_START} nor {CANDIDATES_START}")
    if TABLE_START in readme:  # README.md holds the main table
        readme = readme_with_table(readme, markdown_table(report))
    if "candidates" in report and CANDIDATES_START in readme:  # benchmarks/README.md
        readme = with_block(readme, CANDIDATES_START, CANDIDATES_END, candidates_table(report))
    return readme


def write_readme(args: argparse.Namespace, tables: Callable[[Path, dict], str]) -> int:
    """--readme: ``args.readme`` rewritten as ``tables(args.readme, report of args.out)``."""
    report = json.loads(args.out.read_text())
    args.readme.write_text(tables(args.readme, report))
    print(f"wrote the table of {args.out} into {args.readme}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.readme is not None:
        return write_readme(args, readme_tables)
    # the CUDA plugin must not start as a backend: it finds no cuDNN, and then gives no
    # topology either (jax read JAX_PLATFORMS at import: set its flag)
    if not os.environ.get("JAX_PLATFORMS"):
        jax.config.update("jax_platforms", "cpu")
    if args.candidates is not None:
        return count_candidates(args, argv)
    return count_programs(args, header(argv), count_row)


def count_programs(
    args: argparse.Namespace, report: dict, count: Callable[..., dict], shown: tuple[str, ...] = ()
) -> int:
    """Each of ``args.programs`` at each target and work counted (``count(program, make,
    work, spec, target)``) into ``report`` (a fresh header; with --replace, --out's rows kept)
    written to ``args.out`` after each row; printed with the ``shown`` fields beside the usual.
    1 where a row failed, else 0."""
    makers = {"ppojax": ppojax_program, "rejax": rejax_program}
    if args.purejaxrl is not None:
        makers["purejaxrl"] = purejaxrl_program(args.purejaxrl)
    commit = report["versions"]["ppojax_commit"]
    if args.replace and args.out.exists():
        report = replacing(json.loads(args.out.read_text()), report)
    failed = 0
    for target in args.targets:
        for work, spec in args.works.items():
            for program in args.programs:
                row = guarded(
                    functools.partial(count, program, makers[program], work, spec, target),
                    {"program": program, "work": work, "target": target},
                )
                failed += "error" in row
                row["ppojax_commit"] = commit
                report["rows"] = replaced(report["rows"], row, ("program", "work", "target"))
                write_json(args.out, report)
                brief = {key: row.get(key) for key in ("program", "work", "target", "error")}
                counts = {key: row.get(key) for key in shown}
                print(
                    json.dumps(brief | {"per_update": row.get("per_update")} | counts),
                    flush=True,
                )
    print(f"wrote {args.out}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
