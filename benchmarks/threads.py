"""One CPU core against all: the same programs pinned to one core, with a one-thread pool, or
with their seeds split over one CPU device per core.

    python benchmarks/threads.py [--configs cartpole cartpole-2048 pendulum breakout]
                                 [--seeds 1 4 8] [--other-seeds 1] [--rounds 2] [--cli]
                                 [--rejax] [--tag cpu-2core]

XLA's CPU client sizes its thread pool by the cores the process may run on when the client
starts. Each measurement here is a fresh process, started on every core of this machine, pinned
to one core (``os.sched_setaffinity``, then ``exec`` of the command), or on every core with
``ppojax.limit_cpu_threads(1)`` called first (a one-thread pool; compiling keeps every core),
or, where the seeds divide evenly over more than one device, on every core with
``ppojax.use_cpu_devices(n)`` called first (``compiling.auto_cpu_devices``: one device per core
here) and the seeds split over the devices as ``parallel.runs_sharding`` splits a run folder's
runs, the modes in turn for ``--rounds`` rounds. With ``--rejax``, the classic config is also
trained by rejax 0.1.3 (compare.py's settings, its own compiler options) as it ships, on
every core, and with a one-thread pool: separate processes, so each library with the pool
its own command line gives it. ``--configs`` may also name the classic config
at the sizes where ``--cpu-threads auto`` switches (``BOUNDARY``: 16 or 64 envs, 256-256
layers at 4 or 8 envs). A process compiles ``run_updates`` of one config of
``compare.py`` for a number of vmapped seeds (``--seeds`` for the classic config,
``--other-seeds`` for the rest; compile time measured apart, with ppojax's compiler
options), runs it once to warm up, then three times; the figure is the fastest of the three,
as milliseconds per update and env steps/s. The report gives each mode's median
over the rounds.

With ``--cli``, ``ppojax train CartPole-v1 --seeds 4`` twice on an empty compilation cache
(a first run that compiles and a second that loads its programs) in each mode: one device with
``--cpu-threads all``, the same pinned to one core, one device with a one-thread pool
(``--cpu-devices 1``, whose ``--cpu-threads auto`` gives this config one thread), and the
default (``--cpu-devices auto``: the 4 seeds over one device per core): wall clock and the
command's own summary line.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))

from startup import train_runs, wall  # noqa: E402

# Updates per timed run: long enough (about 0.3-2 s) that timer and dispatch are noise.
UPDATES = {"cartpole": 100, "cartpole-2048": 8, "pendulum": 8, "breakout": 4}

# The classic CartPole config at the sizes around ppojax.runtime.compiling's SMALL_ROLLOUT and
# SMALL_MINIBATCH, where ``--cpu-threads auto`` switches (not run unless named in --configs).
BOUNDARY = {
    "cartpole-16envs": {"num_envs": 16},
    "cartpole-64envs": {"num_envs": 64},
    "cartpole-wide": {"hidden_sizes": (256, 256)},
    "cartpole-wide-8envs": {"num_envs": 8, "hidden_sizes": (256, 256)},
}
BOUNDARY_UPDATES = {"cartpole-16envs": 40, "cartpole-64envs": 12, "cartpole-wide": 16}


def child(config_name: str, seeds: int, pool_threads: int, library: str, devices: int) -> None:
    """Compile and time one config in this process (run by the parent, pinned or not), with a
    thread pool of ``pool_threads`` threads (0: as many as the cores this process may use),
    trained by ``library``: ppojax's ``run_updates`` or rejax's ``train`` (compare.py's); with
    ``devices`` > 1, ppojax's seeds split over that many CPU devices."""
    import ppojax

    # first: building compare's configs imports gymnax, which starts JAX
    ppojax.use_cpu_devices(devices)
    if pool_threads:
        ppojax.limit_cpu_threads(pool_threads)
    import jax
    from compare import CONFIGS

    if config_name in BOUNDARY:
        config = ppojax.PPOConfig(**BOUNDARY[config_name])
        updates = BOUNDARY_UPDATES.get(config_name, 12)
    else:
        config, updates = CONFIGS[config_name], UPDATES[config_name]
    keys = jax.random.split(jax.random.key(0), seeds)
    start = time.perf_counter()
    call = (rejax_call if library == "rejax" else ppojax_call)(config, keys, updates)
    compile_s = time.perf_counter() - start
    jax.block_until_ready(call())
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        jax.block_until_ready(call())
        runs.append(time.perf_counter() - start)
    best = min(runs)
    print(
        json.dumps(
            {
                "compile_s": round(compile_s, 3),
                "ms_per_update": round(best / updates * 1e3, 3),
                "env_steps_per_s": round(seeds * config.batch_size * updates / best),
                "cores_seen": len(os.sched_getaffinity(0)),
                "pool_threads": pool_threads or len(os.sched_getaffinity(0)),
                "devices": len(jax.devices()),
            }
        )
    )


def rejax_call(config: Any, keys: Any, updates: int) -> Callable[[], Any]:
    """rejax's compiled ``train`` of ``updates`` updates (compare.py's, its own compiler
    options), as a call of no arguments."""
    from compare import rejax_runner

    lower, run, _, _ = rejax_runner(config.replace(total_timesteps=updates * config.batch_size))
    return functools.partial(run, lower(keys).compile(), keys)


def ppojax_call(config: Any, keys: Any, updates: int) -> Callable[[], Any]:
    """ppojax's compiled ``run_updates`` of ``updates`` updates from fresh states, the seeds
    over the process's devices as ``parallel.runs_sharding`` lays out a folder's runs."""
    import jax

    import ppojax
    from ppojax.ppo.train import init_state, run_updates
    from ppojax.runtime.sharding import jit_over_runs, place_runs

    keys = place_runs(keys, keys.shape[0])
    program = jit_over_runs(
        jax.vmap(lambda key: run_updates(config, init_state(config, key), updates)),
        keys.shape[0],
    )
    compiled = program.lower(keys).compile(compiler_options=ppojax.compiler_options())
    return functools.partial(compiled, keys)


# Pins itself to one core, then becomes the command (the affinity survives exec).
PIN_AND_EXEC = (
    "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])}); "
    "os.execv(sys.argv[2], sys.argv[2:])"
)


def launcher(one_core: bool) -> list[str]:
    """The command prefix that starts a process on one core, or none for all cores."""
    if not one_core:
        return []
    return [sys.executable, "-c", PIN_AND_EXEC, str(min(os.sched_getaffinity(0)))]


# mode: (pinned to one core, thread pool size passed to the child, CPU devices (0: one per
# core, where the seeds divide evenly), ppojax train's flags)
MODES = {
    "all cores": (False, 0, 1, ["--cpu-devices", "1", "--cpu-threads", "all"]),
    "one core": (True, 0, 1, ["--cpu-devices", "1", "--cpu-threads", "all"]),
    # --cpu-threads auto: one thread for these small configs
    "one-thread pool": (False, 1, 1, ["--cpu-devices", "1"]),
    "devices": (False, 0, 0, []),  # ppojax train's default: --cpu-devices auto
}
# With --rejax, for the classic config: rejax as it ships (every core), and given a one-thread pool.
REJAX_MODES = {"rejax, all cores": 0, "rejax, one-thread pool": 1}


def programs(
    config_names: list[str],
    seed_counts: list[int],
    other_seed_counts: list[int],
    rounds: int,
    with_rejax: bool,
) -> list[dict]:
    from ppojax.runtime.compiling import auto_cpu_devices

    results = []
    for name in config_names:
        for seeds in seed_counts if name == "cartpole" else other_seed_counts:
            split = auto_cpu_devices(seeds)
            modes = {
                mode: (one_core, pool, devices or split, "ppojax")
                for mode, (one_core, pool, devices, _) in MODES.items()
                if devices or split
            }
            if with_rejax and name == "cartpole":
                modes.update(
                    {mode: (False, pool, 1, "rejax") for mode, pool in REJAX_MODES.items()}
                )
            samples = {mode: [] for mode in modes}
            for _ in range(rounds):
                for mode, (one_core, pool, devices, library) in modes.items():
                    command = [*launcher(one_core), sys.executable, __file__, "--child"]
                    command += [name, str(seeds), str(pool), library, str(devices)]
                    _, out = wall(command, cwd=tempfile.gettempdir())
                    samples[mode].append(json.loads(out.strip().splitlines()[-1]))
            row = summarize(name, seeds, samples)
            print(json.dumps(row), flush=True)
            results.append(row)
    return results


def summarize(name: str, seeds: int, samples: dict[str, list[dict]]) -> dict:
    """One config's row: each mode's medians over the rounds, and the speedups between modes."""
    row: dict[str, Any] = {"config": name, "seeds": seeds}
    for mode, runs in samples.items():
        row[mode] = {
            key: statistics.median(run[key] for run in runs)
            for key in ("compile_s", "ms_per_update", "env_steps_per_s")
        }
        for key in ("cores_seen", "pool_threads", "devices"):
            row[mode][key] = runs[0][key]
        row[mode]["runs"] = runs

    def ratio(slower: str, faster: str) -> float:
        return round(row[slower]["ms_per_update"] / row[faster]["ms_per_update"], 3)

    for mode, key in (("one core", "one_core"), ("one-thread pool", "one_thread_pool")):
        row[f"{key}_speedup"] = ratio("all cores", mode)
    if "devices" in row:
        row["devices_speedup"] = ratio("all cores", "devices")
        row["devices_vs_one_thread_pool"] = ratio("one-thread pool", "devices")
    if "rejax, all cores" in row:
        # ppojax train's default (split over devices where the seeds divide evenly, else a
        # one-thread pool for these small configs) against rejax as it ships
        default = "devices" if "devices" in row else "one-thread pool"
        row["default_vs_rejax"] = ratio("rejax, all cores", default)
        row["pool_vs_rejax"] = ratio("rejax, all cores", "one-thread pool")
        row["rejax_pool_speedup"] = ratio("rejax, all cores", "rejax, one-thread pool")
    return row


def cli_runs() -> dict:
    ppojax_bin = str(Path(sys.executable).with_name("ppojax"))
    results = {}
    for mode, (one_core, _, _, flags) in MODES.items():
        with tempfile.TemporaryDirectory(prefix="ppojax-threads-") as workdir:
            results[mode] = train_runs(ppojax_bin, Path(workdir), launcher(one_core), flags)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--configs", nargs="+", default=list(UPDATES), choices=[*UPDATES, *BOUNDARY]
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 4, 8], help="for cartpole")
    parser.add_argument(
        "--other-seeds", type=int, nargs="+", default=[1], help="for the other configs"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cli", action="store_true", help="also time `ppojax train` end to end")
    parser.add_argument(
        "--rejax", action="store_true", help="also rejax 0.1.3 on the classic config (bench extra)"
    )
    parser.add_argument("--out", type=Path, default=BENCHMARKS / "results")
    parser.add_argument("--tag", default="cpu-2core", help="file name suffix")
    parser.add_argument(
        "--child",
        nargs=5,
        metavar=("CONFIG", "SEEDS", "POOL", "LIBRARY", "DEVICES"),
        help=argparse.SUPPRESS,
    )
    args = parser.parse_args()
    if args.child:
        name, seeds, pool, library, devices = args.child
        child(name, int(seeds), int(pool), library, int(devices))
        return
    from throughput import report_header, write_report

    report = {
        **report_header("threads"),
        "programs": programs(args.configs, args.seeds, args.other_seeds, args.rounds, args.rejax),
    }
    if args.cli:
        report["cli_cartpole_4_seeds"] = cli_runs()
    write_report(report, args.out / f"threads-{args.tag}.json")


if __name__ == "__main__":
    main()
