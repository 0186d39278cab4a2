"""Cost of the in-loop evaluation (PPOConfig.eval_every) on the default CartPole config.

    python benchmarks/evaluation.py [--seeds 1 8] [--repeats 3] [--tag cpu-2core]

``jax.jit(jax.vmap(ppojax.train))`` with evaluation every 10 updates, every 50 and never
(eval_episodes 10, deterministic), each compiled once (timed apart), then run ``--repeats``
times, interleaved so that load from other processes hits them alike. Env steps/s count the
training steps only (the evaluation episodes are the overhead). Results go to
``benchmarks/results/evaluation-<tag>.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import jax

import ppojax

SETTINGS = {"none": None, "every 50": 50, "every 10": 10}


def timed(function) -> tuple[float, float]:
    """Wall-clock and process CPU seconds of ``function()``."""
    start, start_cpu = time.perf_counter(), time.process_time()
    jax.block_until_ready(function())
    return time.perf_counter() - start, time.process_time() - start_cpu


def measure(seeds: int, repeats: int) -> dict:
    keys = jax.random.split(jax.random.key(0), seeds)
    train_all = jax.jit(jax.vmap(ppojax.train, in_axes=(None, 0)))
    compiled, configs, compile_seconds = {}, {}, {}
    for name, every in SETTINGS.items():
        configs[name] = ppojax.PPOConfig(eval_every=every)
        start = time.perf_counter()
        compiled[name] = train_all.lower(configs[name], keys).compile()
        compile_seconds[name] = round(time.perf_counter() - start, 2)
    seconds: dict[str, list[float]] = {name: [] for name in SETTINGS}
    cpu: dict[str, list[float]] = {name: [] for name in SETTINGS}
    final_eval: dict[str, float | None] = {}
    for _ in range(repeats):
        for name in SETTINGS:
            out = None

            def run(name=name):
                nonlocal out
                out = compiled[name](configs[name], keys)
                return out

            wall, used = timed(run)
            seconds[name].append(round(wall, 3))
            cpu[name].append(round(used, 3))
            if "eval_return" in out.metrics:
                final_eval[name] = float(out.metrics["eval_return"][:, -1].mean())
    config = configs["none"]
    steps = seeds * config.num_updates * config.batch_size
    median = {name: statistics.median(values) for name, values in seconds.items()}
    return {
        "seeds": seeds,
        "num_updates": config.num_updates,
        # every eval_every-th update and the last one
        "evaluations": {
            name: 0
            if every is None
            else len(set(range(every, config.num_updates + 1, every)) | {config.num_updates})
            for name, every in SETTINGS.items()
        },
        "compile_seconds": compile_seconds,
        "run_seconds": seconds,
        "cpu_seconds": cpu,
        "median_seconds": {name: round(value, 3) for name, value in median.items()},
        "env_steps_per_second": {name: round(steps / value) for name, value in median.items()},
        "fastest_env_steps_per_second": {
            name: round(steps / min(values)) for name, values in seconds.items()
        },
        "slowdown_vs_none": {
            name: round(median[name] / median["none"] - 1, 4) for name in SETTINGS
        },
        "final_eval_return_mean_over_seeds": final_eval,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tag", default="cpu-2core")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    results = [measure(seeds, args.repeats) for seeds in args.seeds]
    report = {
        "command": " ".join(["python", *sys.argv]),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
        "machine": "2-core AMD EPYC CPU, shared with other jobs (loaded during this run)",
        "config": "PPOConfig() defaults: CartPole-v1, 4 envs x 128 steps, 500k steps; "
        "eval_episodes 10, deterministic",
        "versions": {"python": platform.python_version(), "jax": jax.__version__},
        "results": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"evaluation-{args.tag}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    for result in results:
        print(
            f"{result['seeds']} seed(s): env steps/s {result['env_steps_per_second']}, "
            f"slowdown {result['slowdown_vs_none']}"
        )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
