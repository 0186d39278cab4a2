"""Compile time and env steps/s (run time only) of ``train`` on the classic CartPole config.

    python benchmarks/throughput.py [--seeds 1 8] [--repeats 3] [--out benchmarks/results]

Each seed count is compiled once (timed on its own), then run ``--repeats`` times with fresh
keys; the JSON keeps every run and the median. Results go to
``<out>/throughput-<machine>.json`` and a bar chart beside it when matplotlib is installed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

import ppojax


def report_header(benchmark: str) -> dict[str, Any]:
    """The fields a benchmark's JSON opens with: its name, the UTC date, the exact command
    and the machine."""
    return {
        "benchmark": benchmark,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join(shlex.quote(arg) for arg in sys.argv),
        "machine": machine_description(),
    }


def write_report(report: dict[str, Any], path: Path) -> None:
    """``report`` as indented JSON at ``path`` (its folder made if needed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")


def machine_description() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            names = [line.split(":", 1)[1].strip() for line in cpuinfo if "model name" in line]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": [str(device) for device in jax.devices()],
    }


def compile_and_run(
    config: ppojax.PPOConfig, seeds: int, repeats: int
) -> tuple[Any, float, list[float], Any]:
    """jit(vmap(train)) over ``seeds`` keys: (compiled, compile seconds, run seconds of each of
    ``repeats`` runs with fresh keys, output of the last run)."""
    train_seeds = jax.jit(jax.vmap(ppojax.train, in_axes=(None, 0)))
    keys = jax.random.split(jax.random.key(0), seeds)
    start = time.perf_counter()
    compiled = train_seeds.lower(config, keys).compile()
    compile_seconds = time.perf_counter() - start
    run_seconds, out = [], None
    for repeat in range(repeats):
        keys = jax.random.split(jax.random.key(repeat), seeds)
        start = time.perf_counter()
        out = jax.block_until_ready(compiled(config, keys))
        run_seconds.append(time.perf_counter() - start)
    return compiled, compile_seconds, run_seconds, out


def measure(config: ppojax.PPOConfig, seeds: int, repeats: int) -> dict:
    """Compile once, then time ``repeats`` runs of jit(vmap(train)) over ``seeds`` keys."""
    _, compile_seconds, run_seconds, out = compile_and_run(config, seeds, repeats)
    steps = seeds * config.num_updates * config.batch_size
    returns = np.asarray(out.metrics["episode_return"])[:, -10:]
    median = statistics.median(run_seconds)
    return {
        "seeds": seeds,
        "env_steps": steps,
        "compile_seconds": round(compile_seconds, 3),
        "run_seconds": [round(value, 3) for value in run_seconds],
        "env_steps_per_second": round(steps / median),
        "env_steps_per_second_all": [round(steps / value) for value in run_seconds],
        "final_return_last_10_updates_per_seed": np.nanmean(returns, axis=1).tolist(),
    }


def plot(results: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot (pip install -e '.[bench]')")
        return
    figure, (speed, compile_axis) = plt.subplots(1, 2, figsize=(9, 3.5))
    labels = [f"{result['seeds']} seed(s)" for result in results]
    speed.bar(labels, [result["env_steps_per_second"] / 1e3 for result in results])
    speed.set_ylabel("env steps / s (thousands), run time only")
    compile_axis.bar(labels, [result["compile_seconds"] for result in results], color="tab:orange")
    compile_axis.set_ylabel("compile time (s)")
    figure.suptitle("ppojax PPO, CartPole-v1: 4 envs x 128 steps, 4 epochs x 4 minibatches, 500k")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--tag", default=platform.node() or "machine", help="file name suffix")
    args = parser.parse_args()
    config = ppojax.PPOConfig()  # the classic CartPole config
    results = []
    for seeds in args.seeds:
        result = measure(config, seeds, args.repeats)
        print(
            f"{seeds} seed(s): compile {result['compile_seconds']:.1f} s, "
            f"{result['env_steps_per_second']:,} env steps/s (median of {args.repeats}), "
            f"final return per seed {result['final_return_last_10_updates_per_seed']}"
        )
        results.append(result)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        **report_header("throughput"),
        "config": {
            "env_id": config.env_id,
            "num_envs": config.num_envs,
            "num_steps": config.num_steps,
            "total_timesteps": config.total_timesteps,
            "update_epochs": config.update_epochs,
            "num_minibatches": config.num_minibatches,
            "hidden_sizes": config.hidden_sizes,
        },
        "results": results,
    }
    write_report(report, args.out / f"throughput-{args.tag}.json")
    plot(results, args.out / f"throughput-{args.tag}.png")


if __name__ == "__main__":
    main()
