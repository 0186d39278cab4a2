"""Policy architectures: CNN against MLP on MinAtar, and what a recurrent core costs.

    python benchmarks/encoders.py [--timesteps 10000000] [--seeds 1] [--cartpole-timesteps
        500000] [--repeats 2] [--out benchmarks/results] [--tag cpu-2core]
    python benchmarks/encoders.py --plot-only A.json [B.json ...] [--plot-out C.png]

MinAtar part: Breakout-MinAtar and Asterix-MinAtar, each trained with the CNN encoder
(MinAtar's one 3x3 conv of 16 channels, then a 128-unit layer) and with an MLP (256-256), both
relu, 64 envs x 128 steps, 4 epochs x 8 minibatches, lr 5e-4, ``--timesteps`` env steps
(the learning rate anneals over them, so shorter runs are complete runs, not truncated ones).
Reported per run: the mean episode return of the last 10 updates per seed, and env steps/s of
the compiled run (compile timed apart).

Recurrent part (run first): the classic CartPole config (4 envs x 128 steps, 4 x 4)
feed-forward, with a GRU and with an LSTM of 64 units, ``--cartpole-timesteps`` steps:
compile time, steps/s (median of ``--repeats`` runs with fresh keys) and final returns. The
JSON is rewritten after every result, so a long run that is stopped keeps what it measured.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import machine_description  # noqa: E402

import ppojax  # noqa: E402

MINATAR_ENVS = ("Breakout-MinAtar", "Asterix-MinAtar")
# Both start from ppojax's MinAtar preset (ppojax.PRESETS); "mlp" is the preset itself.
ENCODERS = {
    "cnn": {"encoder": "cnn", "cnn_channels": (16,), "hidden_sizes": (128,)},
    "mlp": {"encoder": "mlp", "hidden_sizes": (256, 256)},
}
# gymnax's published PPO returns at 1e7 steps (its README's baseline table), for comparison.
GYMNAX_PPO_BASELINE = {"Breakout-MinAtar": 28, "Asterix-MinAtar": 15}
CORES = {
    "feed-forward": {},
    "gru-64": {"recurrent": "gru", "recurrent_size": 64},
    "lstm-64": {"recurrent": "lstm", "recurrent_size": 64},
}


def timed_runs(config: ppojax.PPOConfig, seeds: int, repeats: int) -> dict:
    """jit(vmap(train)) over ``seeds`` keys: compiled once (timed), run ``repeats`` times."""
    train_seeds = jax.jit(jax.vmap(ppojax.train, in_axes=(None, 0)))
    keys = jax.random.split(jax.random.key(0), seeds)
    start = time.perf_counter()
    compiled = train_seeds.lower(config, keys).compile()
    compile_seconds = time.perf_counter() - start
    seconds, out = [], None
    for repeat in range(repeats):
        keys = jax.random.split(jax.random.key(repeat), seeds)
        start = time.perf_counter()
        out = jax.block_until_ready(compiled(config, keys))
        seconds.append(time.perf_counter() - start)
    steps = seeds * config.num_updates * config.batch_size
    curves = np.asarray(out.metrics["episode_return"])  # [seeds, updates]
    returns = np.nanmean(curves[:, -10:], axis=1)
    # the learning curve, averaged over seeds and over 100 equal stretches of updates
    stretches = np.array_split(np.nanmean(curves, axis=0), min(100, curves.shape[1]))
    return {
        "seeds": seeds,
        "env_steps": steps,
        "compile_seconds": round(compile_seconds, 2),
        "run_seconds": [round(value, 2) for value in seconds],
        "env_steps_per_second": round(steps / statistics.median(seconds)),
        "final_return_last_10_updates_per_seed": [round(float(r), 2) for r in returns],
        "return_curve": {
            "env_steps": [int(steps * (i + 1) / len(stretches)) for i in range(len(stretches))],
            "mean_return": [round(float(np.nanmean(part)), 3) for part in stretches],
        },
    }


def minatar_results(
    envs: list[str], encoders: list[str], timesteps: int, seeds: int, save: Callable[[], None]
) -> Iterator[dict]:
    """Each encoder on each MinAtar env; ``save`` runs after each result (long runs)."""
    for env_id in envs:
        for name in encoders:
            settings = ENCODERS[name]
            config = ppojax.PPOConfig.preset(env_id, total_timesteps=timesteps, **settings)
            result = {
                "env_id": env_id,
                "encoder": name,
                **settings,
                **timed_runs(config, seeds, 1),
                "gymnax_ppo_baseline_at_1e7_steps": GYMNAX_PPO_BASELINE.get(env_id),
            }
            print(json.dumps(result), flush=True)
            yield result
            save()


def recurrent_results(timesteps: int, repeats: int, save: Callable[[], None]) -> Iterator[dict]:
    """Feed-forward, GRU and LSTM policies on the classic CartPole config."""
    for name, settings in CORES.items():
        config = ppojax.PPOConfig(total_timesteps=timesteps, **settings)
        result = {"core": name, **settings, **timed_runs(config, 1, repeats)}
        print(json.dumps(result), flush=True)
        yield result
        save()


def plot_minatar(rows: list[dict], path: Path) -> None:
    """Learning curves per MinAtar env (one line per encoder), gymnax's baseline dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = sorted({row["env_id"] for row in rows})
    figure, axes = plt.subplots(1, len(envs), figsize=(5.5 * len(envs), 3.8), squeeze=False)
    for axis, env_id in zip(axes[0], envs, strict=True):
        for row in (row for row in rows if row["env_id"] == env_id):
            curve = row["return_curve"]
            label = f"{row['encoder']} ({row['env_steps_per_second']:,} steps/s)"
            axis.plot(curve["env_steps"], curve["mean_return"], label=label)
        baseline = GYMNAX_PPO_BASELINE.get(env_id)
        if baseline is not None:
            axis.axhline(baseline, color="gray", linestyle="--", label="gymnax PPO at 1e7")
        axis.set_title(env_id)
        axis.set_xlabel("env steps")
        axis.set_ylabel("training episode return")
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=10_000_000)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--cartpole-timesteps", type=int, default=500_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--skip-minatar", action="store_true")
    parser.add_argument("--skip-recurrent", action="store_true")
    parser.add_argument("--envs", nargs="+", default=list(MINATAR_ENVS))
    parser.add_argument("--encoders", nargs="+", default=list(ENCODERS), choices=list(ENCODERS))
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--tag", default="cpu-2core", help="file name suffix")
    parser.add_argument("--note", default="", help="recorded in the JSON (e.g. machine load)")
    parser.add_argument(
        "--plot-only",
        type=Path,
        nargs="+",
        help="redraw the MinAtar PNG from the runs in these JSONs (no training)",
    )
    parser.add_argument(
        "--plot-out", type=Path, help="where --plot-only writes (default: the first JSON's .png)"
    )
    args = parser.parse_args()
    if args.plot_only:
        rows = [row for path in args.plot_only for row in json.loads(path.read_text())["minatar"]]
        plot_minatar(rows, args.plot_out or args.plot_only[0].with_suffix(".png"))
        return
    report = {
        "benchmark": "encoders",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join(shlex.quote(arg) for arg in sys.argv),
        "machine": machine_description(),
        "note": args.note,
        "minatar_config": {**ppojax.PRESETS["Breakout-MinAtar"], "total_timesteps": args.timesteps},
        "recurrent_cartpole": [],
        "minatar": [],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"encoders-{args.tag}.json"

    def save() -> None:
        path.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {path}", flush=True)

    if not args.skip_recurrent:
        for result in recurrent_results(args.cartpole_timesteps, args.repeats, save):
            report["recurrent_cartpole"].append(result)
    if not args.skip_minatar:
        runs = minatar_results(args.envs, args.encoders, args.timesteps, args.seeds, save)
        for result in runs:
            report["minatar"].append(result)
            plot_minatar(report["minatar"], path.with_suffix(".png"))


if __name__ == "__main__":
    main()
