"""How ppojax scales: env steps/s and compile time against num_envs and vmapped seeds.

    python benchmarks/scaling.py [--envs 4 16 64 256 1024 4096] [--seeds 1 2 4 8 16 32 64]
                                 [--tag cpu-2core]

CartPole-v1, the classic config otherwise (128 steps, 4 epochs x 4 minibatches, 64-64 tanh).
- envs sweep: one seed, num_envs as given, about ``--steps-per-point`` env steps (at least
  two updates).
- seeds sweep: 4 envs, ``jax.jit(jax.vmap(train))`` over the given seed counts, about
  ``--steps-per-seed`` env steps per seed.
Each point is compiled once (timed apart), then run ``--repeats`` times; steps/s uses the median
run time. XLA's memory analysis of each compiled program (arguments, outputs, temporaries) gives
the memory figures. Results: ``results/scaling-<tag>.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import statistics
import sys
from pathlib import Path

from throughput import compile_and_run, machine_description

import ppojax


def memory_bytes(compiled) -> dict:
    """Bytes XLA plans for the program: arguments, outputs, temporaries (None if unknown)."""
    try:
        analysis = compiled.memory_analysis()
    except Exception:  # some backends do not report it
        return {}
    if analysis is None:
        return {}
    names = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes")
    sizes = {name.replace("_size_in_bytes", ""): int(getattr(analysis, name, 0)) for name in names}
    sizes["total"] = sum(sizes.values())
    return sizes


def measure(config: ppojax.PPOConfig, seeds: int, repeats: int) -> dict:
    compiled, compile_seconds, seconds, _ = compile_and_run(config, seeds, repeats)
    steps = seeds * config.num_updates * config.batch_size
    return {
        "num_envs": config.num_envs,
        "seeds": seeds,
        "num_updates": config.num_updates,
        "env_steps": steps,
        "compile_seconds": round(compile_seconds, 2),
        "run_seconds": [round(value, 3) for value in seconds],
        "env_steps_per_second": round(steps / statistics.median(seconds)),
        "memory_bytes": memory_bytes(compiled),
    }


def envs_config(num_envs: int, steps_per_point: int) -> ppojax.PPOConfig:
    batch = num_envs * 128
    updates = max(2, steps_per_point // batch)
    return ppojax.PPOConfig(num_envs=num_envs, total_timesteps=updates * batch)


def report_line(kind: str, result: dict) -> str:
    memory = result["memory_bytes"].get("total")
    memory_text = f", XLA memory {memory / 2**20:.1f} MiB" if memory else ""
    return (
        f"{kind}: envs {result['num_envs']:5d} seeds {result['seeds']:3d}: compile "
        f"{result['compile_seconds']:5.1f} s, {result['env_steps_per_second']:>10,} steps/s"
        f"{memory_text}"
    )


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for axis, (name, key) in zip(axes, (("envs", "num_envs"), ("seeds", "seeds")), strict=True):
        points = report[name]
        x = [point[key] for point in points]
        axis.plot(x, [p["env_steps_per_second"] / 1e3 for p in points], "o-", label="steps/s")
        axis.set_xscale("log", base=2)
        axis.set_xlabel(f"{key} (CartPole-v1)")
        axis.set_ylabel("env steps / s (thousands), run time only")
        twin = axis.twinx()
        twin.plot(x, [p["compile_seconds"] for p in points], "s--", color="tab:orange")
        twin.set_ylabel("compile time (s)", color="tab:orange")
        axis.set_title(f"against {key}")
    figure.suptitle(f"ppojax scaling on {report['machine']['backend']} ({report['date'][:10]})")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, nargs="+", default=[4, 16, 64, 256, 1024, 4096])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--steps-per-point", type=int, default=1_048_576)
    parser.add_argument("--steps-per-seed", type=int, default=131_072)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tag", default="cpu-2core")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    report = {
        "benchmark": "scaling",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join(shlex.quote(arg) for arg in sys.argv),
        "machine": machine_description(),
        "envs": [],
        "seeds": [],
    }
    for num_envs in args.envs:
        result = measure(envs_config(num_envs, args.steps_per_point), 1, args.repeats)
        report["envs"].append(result)
        print(report_line("envs ", result), flush=True)
    seed_config = ppojax.PPOConfig(total_timesteps=args.steps_per_seed)
    for seeds in args.seeds:
        result = measure(seed_config, seeds, args.repeats)
        report["seeds"].append(result)
        print(report_line("seeds", result), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"scaling-{args.tag}.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, args.out / f"scaling-{args.tag}.png")
    print(f"wrote {args.out / f'scaling-{args.tag}.json'} and .png")


if __name__ == "__main__":
    main()
