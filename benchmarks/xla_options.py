"""XLA CPU compiler options on the classic CartPole program: compile time, run time, and
whether the trained arrays equal the default program's bit for bit.

    python benchmarks/xla_options.py [--seeds 1] [--rounds 3] [--tag cpu-2core] [--variants ...]

Each variant is ``jit(vmap(train)).lower(...).compile(compiler_options=...)`` of the same
lowered program in one process: per-compile options, so they change only ppojax's program,
the way the library could ship them. A program of another shape is compiled first and thrown
away, so no variant pays the process's first-compile costs. The runs alternate between the
variants, ``--rounds`` times, with fresh keys each round (run time only). Writes
``results/xla-options-<tag>.json`` and ``.png``.

The variants: XLA's default (on CPU its dots go to YNNPACK), YNNPACK fusions that also take
the elementwise ops (and the reductions) around the dots, the dots left to XLA's own
emitter (no YNNPACK fusion), the XNNPACK switch, the concurrency-optimized scheduler, and
LLVM's optimization levels 2, 1 and 0 for XLA's own kernels (``xla_backend_optimization_level``,
3 by default), and copy insertion's region analysis
(``xla_cpu_copy_insertion_use_region_analysis``: fewer copies of loop-carried buffers),
alone and with level 2.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import machine_description  # noqa: E402

import ppojax  # noqa: E402

FUSION = "LIBRARY_FUSION_TYPE_"
VARIANTS: dict[str, dict[str, object] | None] = {
    "default": None,
    "ynn dot+eltwise": {"xla_cpu_experimental_ynn_fusion_type": f"{FUSION}DOT,{FUSION}ELTWISE"},
    "ynn dot+eltwise+reduce": {
        "xla_cpu_experimental_ynn_fusion_type": f"{FUSION}DOT,{FUSION}ELTWISE,{FUSION}REDUCE"
    },
    "no ynn (XLA's dots)": {"xla_cpu_experimental_ynn_fusion_type": f"{FUSION}INVALID"},
    "xnnpack on": {"xla_cpu_use_xnnpack": True},
    "concurrency scheduler": {"xla_cpu_enable_concurrency_optimized_scheduler": True},
    "LLVM -O2": {"xla_backend_optimization_level": 2},
    "LLVM -O1": {"xla_backend_optimization_level": 1},
    "LLVM -O0": {"xla_backend_optimization_level": 0},
    "copy region analysis": {"xla_cpu_copy_insertion_use_region_analysis": True},
    "LLVM -O2, copy region analysis": {
        "xla_backend_optimization_level": 2,
        "xla_cpu_copy_insertion_use_region_analysis": True,
    },
}


def floats(tree) -> list[np.ndarray]:
    return [
        np.asarray(leaf)
        for leaf in jax.tree.leaves(tree)
        if hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.floating)
    ]


def measure(seeds: int, rounds: int, names: list[str]) -> dict:
    config = ppojax.PPOConfig()
    train_seeds = jax.jit(jax.vmap(ppojax.train, in_axes=(None, 0)), static_argnums=0)
    keys = jax.random.split(jax.random.key(0), seeds)
    # the process's first compile (of another program, so nothing of it is reused), not timed
    train_seeds.lower(config.replace(num_envs=2), keys).compile()
    lowered = train_seeds.lower(config, keys)
    compiled, results = {}, {}
    for name in names:
        options = VARIANTS[name]
        start = time.perf_counter()
        compiled[name] = lowered.compile(compiler_options=options)
        results[name] = {"options": options, "compile_seconds": time.perf_counter() - start}
        results[name]["run_seconds"] = []
        print(f"{name}: compile {results[name]['compile_seconds']:.2f} s", flush=True)
    outputs = {}
    for round_index in range(rounds):
        round_keys = jax.random.split(jax.random.key(round_index + 1), seeds)
        for name, program in compiled.items():
            start = time.perf_counter()
            outputs[name] = jax.block_until_ready(program(round_keys))
            results[name]["run_seconds"].append(time.perf_counter() - start)
            print(f"{name}: run {results[name]['run_seconds'][-1]:.2f} s", flush=True)
    reference = floats(outputs["default"])
    steps = config.total_timesteps * seeds
    for name, result in results.items():
        median = float(np.median(result["run_seconds"]))
        result["median_run_seconds"] = median
        result["env_steps_per_second"] = steps / median
        result["run_vs_default"] = median / float(np.median(results["default"]["run_seconds"]))
        differences = [
            float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)), initial=0.0))
            for a, b in zip(reference, floats(outputs[name]), strict=True)
        ]
        result["bit_identical_to_default"] = max(differences) == 0.0
        result["max_abs_difference_from_default"] = max(differences)
    return results


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["variants"])
    positions = np.arange(len(names))
    figure, (compile_axes, run_axes) = plt.subplots(1, 2, figsize=(12, 4))
    compile_axes.bar(positions, [report["variants"][n]["compile_seconds"] for n in names])
    compile_axes.set_ylabel("compile (s)")
    for index, name in enumerate(names):
        runs = report["variants"][name]["run_seconds"]
        run_axes.scatter([index] * len(runs), runs, color="tab:blue")
        run_axes.plot([index - 0.3, index + 0.3], [np.median(runs)] * 2, color="black")
    run_axes.set_ylabel("run (s), each round and the median")
    for axes in (compile_axes, run_axes):
        axes.set_xticks(positions, names, fontsize=7, rotation=20)
    figure.suptitle(f"classic CartPole, {report['seeds']} seed(s), {report['date']}")
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tag", default="cpu-2core")
    parser.add_argument("--machine-note", default="")
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=list(VARIANTS),
        default=list(VARIANTS),
        help="the variants to measure (default: all); 'default' is always among them",
    )
    args = parser.parse_args()
    names = ["default", *[name for name in args.variants if name != "default"]]
    report = {
        "command": shlex.join(["python", "benchmarks/xla_options.py", *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {**machine_description(), "note": args.machine_note},
        "seeds": args.seeds,
        "variants": measure(args.seeds, args.rounds, names),
    }
    out = Path(__file__).resolve().parent / "results" / f"xla-options-{args.tag}"
    out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    plot(report, out.with_suffix(".png"))
    print(f"wrote {out}.json and .png")


if __name__ == "__main__":
    main()
