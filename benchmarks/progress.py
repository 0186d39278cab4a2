"""Overhead of the progress bar on the default CartPole config (compile time kept apart).

    python benchmarks/progress.py [--seeds 1] [--repeats 5] [--tag cpu-2core]

Three ways to run the same updates, each compiled once and then timed ``--repeats`` times,
interleaved so that load from other processes hits them alike:

- ``train``: ``jax.jit(jax.vmap(ppojax.train))``, the library's single call (includes init);
- ``no progress``: the CLI's compiled loop without reports, as ``--no-progress`` runs it;
- ``progress``: the CLI's default, a ``jax.debug.callback`` every ``num_updates / 50``
  updates feeding a tqdm bar (env steps, steps/s, latest mean return).

The overhead is ``progress`` over ``no progress``, in wall-clock and in process CPU time, from
the medians and from the fastest runs. Results go to ``benchmarks/results/progress-<tag>.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import jax

import ppojax
from ppojax.runs.experiment import (
    Experiment,
    chunk_runner,
    init_states,
    report_interval,
    run_config,
    run_keys,
    train_chunks,
)
from ppojax.runs.progress import ProgressBar, RunOptions

REPORTS = RunOptions().progress_reports


def timed(function) -> tuple[float, float]:
    """Wall-clock and process CPU seconds (all threads) of ``function()``; CPU time is what
    the progress bar adds in work, which load from other processes on the machine does not
    inflate the way it inflates wall-clock time."""
    start, start_cpu = time.perf_counter(), time.process_time()
    jax.block_until_ready(function())
    return time.perf_counter() - start, time.process_time() - start_cpu


def compiled_loop(experiment: Experiment, progress: bool):
    """(compile seconds, run function) for the CLI's loop over all updates in one chunk."""
    config, _ = run_config(experiment)
    state = jax.block_until_ready(init_states(experiment))
    num_updates = experiment.config.num_updates
    steps_per_update = experiment.num_runs * experiment.config.batch_size
    bar = ProgressBar(num_updates, 0, steps_per_update, "progress benchmark")
    report = bar.report if progress else None
    every = report_interval(num_updates, REPORTS)
    start = time.perf_counter()
    runner = chunk_runner(experiment, num_updates, report, every)
    compiled = runner.lower(config, state, 0, 0).compile()
    compile_seconds = time.perf_counter() - start
    plan = [(0, num_updates)]

    def run():
        if not progress:
            return train_chunks(compiled, config, state, plan, lambda *_: None)
        bar.update_number = 0
        bar.open()
        try:
            return train_chunks(
                compiled,
                config,
                state,
                plan,
                lambda first, _, m: bar.chunk_done(num_updates, m["episode_return"]),
            )
        finally:
            bar.close()

    return compile_seconds, run


def measure(seeds: int, repeats: int) -> dict:
    config = ppojax.PPOConfig()
    experiment = Experiment(config, seeds=seeds)
    keys = run_keys(experiment)
    train_all = jax.jit(jax.vmap(ppojax.train, in_axes=(None, 0)))
    start = time.perf_counter()
    compiled_train = train_all.lower(config, keys).compile()
    compile_seconds = {"train": time.perf_counter() - start}
    compile_seconds["no progress"], no_progress = compiled_loop(experiment, False)
    compile_seconds["progress"], progress = compiled_loop(experiment, True)
    runs = {
        "train": lambda: compiled_train(config, keys),
        "no progress": no_progress,
        "progress": progress,
    }
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    cpu_seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            wall, cpu = timed(run)
            seconds[name].append(wall)
            cpu_seconds[name].append(cpu)
    median = {name: statistics.median(values) for name, values in seconds.items()}
    median_cpu = {name: statistics.median(values) for name, values in cpu_seconds.items()}
    steps = seeds * config.num_updates * config.batch_size
    return {
        "seeds": seeds,
        "num_updates": config.num_updates,
        "progress_reports": math.ceil(
            config.num_updates / report_interval(config.num_updates, REPORTS)
        ),
        "compile_seconds": {name: round(value, 2) for name, value in compile_seconds.items()},
        "run_seconds": rounded(seconds),
        "cpu_seconds": rounded(cpu_seconds),
        "median_seconds": {name: round(value, 3) for name, value in median.items()},
        "env_steps_per_second": {name: round(steps / value) for name, value in median.items()},
        "progress_overhead_wall": round(median["progress"] / median["no progress"] - 1, 4),
        "progress_overhead_cpu": round(median_cpu["progress"] / median_cpu["no progress"] - 1, 4),
        "progress_overhead_wall_vs_train": round(median["progress"] / median["train"] - 1, 4),
        "progress_overhead_min_wall": round(min_ratio(seconds) - 1, 4),
        "progress_overhead_min_cpu": round(min_ratio(cpu_seconds) - 1, 4),
    }


def min_ratio(values: dict[str, list[float]]) -> float:
    """Fastest ``progress`` run over fastest ``no progress`` run. On a shared machine some runs
    of every variant land in a slow mode (about 1.7x, seen in CPU time too), which can sway a
    median of a few repeats; the fastest runs compare the programs themselves."""
    return min(values["progress"]) / min(values["no progress"])


def rounded(values: dict[str, list[float]]) -> dict[str, list[float]]:
    return {name: [round(value, 3) for value in series] for name, series in values.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tag", default="cpu-2core")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    results = [measure(seeds, args.repeats) for seeds in args.seeds]
    report = {
        "command": " ".join(["python", *sys.argv]),
        "config": "PPOConfig() defaults: CartPole-v1, 4 envs x 128 steps, 500k steps",
        "machine": {
            "backend": jax.default_backend(),
            "jax": jax.__version__,
            "devices": [str(device) for device in jax.devices()],
        },
        "results": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"progress-{args.tag}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    for result in results:
        print(
            f"{result['seeds']} seed(s): median run seconds {result['median_seconds']}; "
            f"progress overhead {100 * result['progress_overhead_wall']:.1f}% wall-clock, "
            f"{100 * result['progress_overhead_cpu']:.1f}% CPU time (vs no progress); fastest "
            f"runs: {100 * result['progress_overhead_min_wall']:.1f}% wall-clock, "
            f"{100 * result['progress_overhead_min_cpu']:.1f}% CPU time"
        )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
