"""What in ppojax's program costs compile time: the Python path's program with one piece of
the core taken out at a time, against rejax's, compiled alternating in one process.

    python benchmarks/compile_ablation.py [--seeds 1] [--repeats 5]
        [--run-seeds 8] [--run-repeats 3]

The program is the one a user compiles: ``jax.jit(jax.vmap(ppojax.train))`` over seeds with
XLA's default options, on the classic CartPole config (benchmarks/compare.py's ``cartpole``).
Each variant changes the core while the program is traced (the patches are undone after):

- ``with divergence guard``: ``divergence_guard=True`` (off by default), whose finite checks
  and selects skip a step that is not finite;
- ``no truncation bootstrap``: V(next_obs) of every step (one critic pass over the rollout,
  which bootstraps truncated episodes) replaced by zeros;
- ``no training metrics``: the episode statistics and the explained variance left out;
- ``noise drawn per step``: the rollout's randomness drawn inside each step (the plain form
  of the "noise" stand-in) instead of ahead;
- ``all three`` (the last three together).

PPO-Penalty's KL pass and the in-loop evaluation are not in this program: the config uses the
clipped objective and no ``eval_every``, so neither is traced. Per variant: the compiled
program's fusions and HLO instructions, and the median of ``--repeats`` compile times, each
from a fresh lowering with JAX's caches cleared, the variants and rejax in rotating order.
Then, with ``--run-repeats`` > 0, the run time of the whole run at ``--run-seeds`` seeds for
the shipped program, the guarded one and rejax's, alternating (the guard's cost is run time
too). Writes benchmarks/results/compile_ablation.json.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import jax
import jax.numpy as jnp
from compare import CONFIGS, _version, keys_for, program_size, rejax_algo
from machine import machine_description

import ppojax
from ppojax.ppo import train
from ppojax.runtime import kernels

RESULT = Path(__file__).resolve().parent / "results" / "compile_ablation.json"


def no_bootstrap() -> contextlib.AbstractContextManager:
    return mock.patch.object(
        train, "next_values", lambda agent, params, transitions: jnp.zeros_like(transitions.reward)
    )


@contextlib.contextmanager
def no_metrics() -> Iterator[None]:
    with (
        mock.patch.object(train, "episode_metrics", lambda transitions: {}),
        mock.patch.object(train, "explained_variance", lambda *args: jnp.float32(0.0)),
    ):
        yield


@contextlib.contextmanager
def all_three() -> Iterator[None]:
    with no_bootstrap(), no_metrics(), kernels.plain("noise"):
        yield


VARIANTS: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
    "as shipped": contextlib.nullcontext,
    "with divergence guard": contextlib.nullcontext,
    "no truncation bootstrap": no_bootstrap,
    "no training metrics": no_metrics,
    "noise drawn per step": lambda: kernels.plain("noise"),
    "all three": all_three,
}
# variants that are a config of the shipped core rather than a patch of it
CONFIG_CHANGES: dict[str, dict[str, Any]] = {"with divergence guard": {"divergence_guard": True}}


def variant_config(config: ppojax.PPOConfig, variant: str) -> ppojax.PPOConfig:
    return config.replace(**CONFIG_CHANGES.get(variant, {}))


def ppojax_lowering(config: ppojax.PPOConfig, seeds: int, variant: str) -> Any:
    config = variant_config(config, variant)
    with VARIANTS[variant]():
        # a fresh function: jit's cache would otherwise hand back another variant's trace
        train_seeds = jax.jit(lambda c, k: jax.vmap(ppojax.train, in_axes=(None, 0))(c, k))
        return train_seeds.lower(config, keys_for(seeds, 0))


def measure(seeds: int, repeats: int) -> dict[str, Any]:
    config = CONFIGS["cartpole"]
    rejax_train = rejax_algo(config).train
    lowerings: dict[str, Callable[[], Any]] = {
        name: (lambda name=name: ppojax_lowering(config, seeds, name)) for name in VARIANTS
    }
    lowerings["rejax 0.1.3"] = lambda: jax.jit(jax.vmap(rejax_train)).lower(keys_for(seeds, 0))
    jax.jit(lambda x: jnp.sin(x) * 2.0).lower(1.0).compile()  # the compiler's own set-up
    times: dict[str, list[float]] = {name: [] for name in lowerings}
    sizes: dict[str, dict[str, int]] = {}
    names = list(lowerings)
    for repeat in range(repeats):
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            jax.clear_caches()
            lowered = lowerings[name]()
            start = time.perf_counter()
            compiled = lowered.compile()
            times[name].append(time.perf_counter() - start)
            sizes[name] = program_size(compiled)
    rows = [
        {
            "variant": name,
            **sizes[name],
            "compile_seconds": round(statistics.median(times[name]), 3),
            "compile_seconds_each": [round(t, 3) for t in times[name]],
        }
        for name in names
    ]
    shipped = rows[0]["compile_seconds"]
    for row in rows:
        row["compile_over_shipped"] = round(row["compile_seconds"] / shipped, 3)
    return {"seeds": seeds, "repeats": repeats, "config": "compare.py's cartpole", "rows": rows}


RUN_VARIANTS = ("as shipped", "with divergence guard")


def run_seconds(seeds: int, repeats: int) -> dict[str, Any]:
    """Run time of the whole classic run over ``seeds`` seeds for the variants whose cost is
    run time too (``RUN_VARIANTS``) and rejax's, alternating, ``repeats`` each."""
    config = CONFIGS["cartpole"]
    runs: dict[str, Callable[[jax.Array], Any]] = {}
    for name in RUN_VARIANTS:
        compiled = ppojax_lowering(config, seeds, name).compile()
        runs[name] = functools.partial(compiled, variant_config(config, name))
    rejax_lowered = jax.jit(jax.vmap(rejax_algo(config).train)).lower(keys_for(seeds, 0))
    runs["rejax 0.1.3"] = rejax_lowered.compile()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for repeat in range(repeats):
        order = list(runs) if repeat % 2 == 0 else list(reversed(runs))
        for name in order:
            keys = keys_for(seeds, repeat)
            start = time.perf_counter()
            jax.block_until_ready(runs[name](keys))
            times[name].append(time.perf_counter() - start)
    return {
        "seeds": seeds,
        "repeats": repeats,
        "rows": [
            {
                "variant": name,
                "run_seconds": round(statistics.median(each), 3),
                "run_seconds_each": [round(t, 3) for t in each],
            }
            for name, each in times.items()
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--run-seeds", type=int, default=8)
    parser.add_argument("--run-repeats", type=int, default=3, help="0: no run times")
    parser.add_argument("--out", type=Path, default=RESULT)
    args = parser.parse_args()
    report = {
        "benchmark": "compile_ablation",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python benchmarks/compile_ablation.py " + " ".join(sys.argv[1:]),
        "machine": machine_description(),
        "versions": {"ppojax": _version("ppojax"), "rejax": _version("rejax")},
        "compile_options": "XLA's defaults (the Python path)",
        **measure(args.seeds, args.repeats),
    }
    if args.run_repeats > 0:
        report["run"] = run_seconds(args.run_seeds, args.run_repeats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    for row in report["rows"]:
        print(
            f"{row['variant']:>24}: {row['fusions']:4d} fusions, {row['instructions']:6d} "
            f"instructions, compile {row['compile_seconds']:.2f} s "
            f"({row['compile_over_shipped']:.2f} of as shipped)"
        )
    for row in report.get("run", {}).get("rows", []):
        print(f"{row['variant']:>24}: run {row['run_seconds']:.2f} s at {args.run_seeds} seeds")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
