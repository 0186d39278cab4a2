"""One env per adapter suite, trained long enough to show learning on a CPU.

    python benchmarks/envs.py [--seeds 2] [--suites NAME ...] [--out DIR] [--tag cpu-2core]

For each suite: ``jit(vmap(train))`` over ``--seeds`` seeds compiled once (timed on its own),
then run once; the JSON keeps per seed the mean episode return of the first and of the last
10 updates that ended an episode, env steps/s (all seeds, run time only) and compile seconds;
the PNG the learning curves. ``--suites`` reruns only those; the other rows stay as they
were, each with its own command, date and machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

import ppojax
from ppojax.runs.folder import rolling_mean

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import machine_description  # noqa: E402

# Each suite's preset (ppojax.PRESETS: 16 envs x 64 steps, 4 x 4 minibatches, lr 5e-4, 64-64
# tanh MLPs as for CartPole), Snake on a 6x6 board with a 100-step limit, the brax pendulum on
# brax's default backend with its 1000-step limit; Playground's cartpole with its own preset.
SUITE_CONFIGS: dict[str, dict[str, Any]] = {
    "jumanji": dict(
        env_id="jumanji/Snake-v1",
        env_kwargs={"num_rows": 6, "num_cols": 6, "time_limit": 100},
    ),
    "xminigrid": dict(env_id="xminigrid/MiniGrid-Empty-5x5"),
    # NAVIX's reward is 1 at the goal whatever the time taken: a 20-step limit (100 by default)
    # makes the return the share of episodes that find the goal quickly
    "navix": dict(env_id="navix/Navix-Empty-5x5-v0", env_kwargs={"max_steps": 20}),
    "brax": dict(env_id="brax/inverted_pendulum"),
    "playground": dict(env_id="playground/CartpoleBalance"),
    "craftax": dict(env_id="craftax/Craftax-Classic-Symbolic-v1"),
}


def train_suite(settings: dict[str, Any], seeds: int) -> dict[str, Any]:
    """Compile and run ``seeds`` seeds of one config; returns its row of the JSON."""
    config = ppojax.PPOConfig.preset(**settings)
    keys = jax.random.split(jax.random.key(0), seeds)
    train = jax.jit(jax.vmap(ppojax.train, in_axes=(None, 0)))
    start = time.perf_counter()
    compiled = train.lower(config, keys).compile()
    compile_seconds = time.perf_counter() - start
    start = time.perf_counter()
    returns = np.asarray(jax.block_until_ready(compiled(config, keys)).metrics["episode_return"])
    run_seconds = time.perf_counter() - start
    smooth = rolling_mean(returns)
    return {
        "config": {**settings, "env_kwargs": dict(config.env_kwargs)},
        "seeds": seeds,
        "compile_seconds": round(compile_seconds, 2),
        "run_seconds": round(run_seconds, 2),
        "env_steps_per_second": round(seeds * config.num_updates * config.batch_size / run_seconds),
        "return_first_10_updates": ends_mean(returns, slice(None, 10)),
        "return_last_10_updates": ends_mean(returns, slice(-10, None)),
        "curve_env_steps": ((np.arange(returns.shape[1]) + 1) * config.batch_size).tolist(),
        "curve_mean_return": np.nanmean(smooth, axis=0).round(4).tolist(),
    }


def ends_mean(returns: np.ndarray, which: slice) -> list[float]:
    """Per seed, the mean episode return of ``which`` of its updates that ended an episode
    (the first or last 10): with 1000-step episodes most updates end none."""
    return [round(float(row[np.isfinite(row)][which].mean()), 3) for row in returns]


def plot(rows: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(rows), figsize=(5 * len(rows), 3.5))
    for axis, row in zip(np.atleast_1d(axes), rows.values(), strict=True):
        steps, curve = np.asarray(row["curve_env_steps"]), np.asarray(row["curve_mean_return"])
        finite = np.isfinite(curve)  # long episodes end in few updates: join those points
        axis.plot(steps[finite], curve[finite])
        axis.set_title(f"{row['config']['env_id']} ({row['seeds']} seeds)")
        axis.set_xlabel("env steps")
        axis.set_ylabel("episode return (10-update mean)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def kept_rows(path: Path, rerun: list[str]) -> dict[str, dict[str, Any]]:
    """The rows of ``path`` for the suites not in ``rerun``, each carrying its measurement's
    command, date and machine (a file of the older layout keeps those once, at the top)."""
    if not path.exists():
        return {}
    old = json.loads(path.read_text())
    shared = {name: old[name] for name in ("command", "date_utc", "machine") if name in old}
    return {suite: {**shared, **row} for suite, row in old["suites"].items() if suite not in rerun}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--suites", nargs="+", default=list(SUITE_CONFIGS))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--tag", default="cpu-2core")
    parser.add_argument("--machine-note", default="2-core AMD EPYC CPU")
    args = parser.parse_args()
    path = args.out / f"envs-{args.tag}.json"
    # Suites not rerun keep their rows from the file, each with the command, date and machine
    # it was measured with.
    rows = kept_rows(path, args.suites)
    command = "python " + shlex.join(sys.argv)
    machine = {"note": args.machine_note, **machine_description()}
    for suite in args.suites:
        row = train_suite(SUITE_CONFIGS[suite], args.seeds)
        print(suite, {k: v for k, v in row.items() if not k.startswith("curve")})
        date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        rows[suite] = {"command": command, "date_utc": date, "machine": machine, **row}
    rows = {suite: rows[suite] for suite in SUITE_CONFIGS if suite in rows}
    args.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"suites": rows}, indent=1) + "\n")
    plot(rows, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png')}")


if __name__ == "__main__":
    main()
