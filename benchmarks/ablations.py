"""The classic PPO mistakes made visible: each remedy switched off in turn.

    python benchmarks/ablations.py [--seeds 4] [--envs CartPole-v1 Pendulum-v1]

For each env's baseline config (CartPole-v1: the classic config; Pendulum-v1: its preset, with
observation and reward normalization) every variant is trained by one
``jax.jit(jax.vmap(ppojax.train))`` call over the seeds. Learning curves (mean and min-max band
over seeds) go to ``results/ablations.png``; final returns (mean of the last 10 updates, per
seed) and the settings to ``results/ablations.json``. An update in which no episode ended
carries the seed's previous value forward.
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
import numpy as np
from throughput import machine_description

import ppojax

VARIANTS: dict[str, dict] = {
    "baseline": {},
    "no advantage normalization": {"normalize_advantages": False},
    "no entropy bonus": {"ent_coef": 0.0},
    "20 epochs": {"update_epochs": 20},
    "no value clipping": {"vf_clip_eps": None},
    "no reward normalization": {"normalize_rewards": False},
}


def variants_for(config: ppojax.PPOConfig) -> dict[str, dict]:
    """The variants that switch something off in ``config`` (a remedy it does not use is
    skipped: its 'off' run would repeat the baseline)."""
    chosen = {}
    for name, changes in VARIANTS.items():
        if changes and all(getattr(config, k) == v for k, v in changes.items()):
            continue
        chosen[name] = changes
    return chosen


def forward_fill(returns: np.ndarray) -> np.ndarray:
    """[seeds, updates] with each NaN (no episode ended in that update) replaced by the seed's
    last finished episode's value, so curves have no gaps; leading NaNs stay."""
    filled = returns.copy()
    for u in range(1, filled.shape[1]):
        gap = np.isnan(filled[:, u])
        filled[gap, u] = filled[gap, u - 1]
    return filled


def run_variant(config: ppojax.PPOConfig, seeds: int) -> dict:
    keys = jax.random.split(jax.random.key(0), seeds)
    start = time.perf_counter()
    out = jax.block_until_ready(jax.jit(jax.vmap(ppojax.train, in_axes=(None, 0)))(config, keys))
    seconds = time.perf_counter() - start
    raw = np.asarray(out.metrics["episode_return"])  # [seeds, updates]
    final = [float(np.nanmean(row[-10:])) for row in raw]
    returns = forward_fill(raw)
    return {
        "final_returns": final,
        "final_return_mean": float(np.mean(final)),
        "seconds_including_compile": round(seconds, 1),
        "env_steps": np.asarray(out.metrics["env_steps"])[0].tolist(),
        "curve_mean": returns.mean(axis=0).tolist(),
        "curve_min": returns.min(axis=0).tolist(),
        "curve_max": returns.max(axis=0).tolist(),
        "entropy_mean": np.asarray(out.metrics["entropy"]).mean(axis=0).tolist(),
    }


def plot(results: dict[str, dict[str, dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(results), figsize=(6.5 * len(results), 4.2))
    for axis, (env_id, variants) in zip(np.atleast_1d(axes), results.items(), strict=True):
        for name, result in variants.items():
            steps = np.asarray(result["env_steps"])
            line = axis.plot(steps, result["curve_mean"], label=name, lw=1.4)[0]
            axis.fill_between(
                steps, result["curve_min"], result["curve_max"], color=line.get_color(), alpha=0.12
            )
        axis.set_title(f"{env_id}: one remedy off at a time")
        axis.set_xlabel("env steps")
        axis.set_ylabel("episode return (mean over seeds, band = min..max)")
        axis.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--envs", nargs="+", default=["CartPole-v1", "Pendulum-v1"])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    results: dict[str, dict[str, dict]] = {}
    for env_id in args.envs:
        base = ppojax.PPOConfig.preset(env_id)
        results[env_id] = {}
        for name, changes in variants_for(base).items():
            result = run_variant(base.replace(**changes), args.seeds)
            result["changes"] = dict(changes)
            results[env_id][name] = result
            print(
                f"{env_id:12s} {name:28s} final return {result['final_return_mean']:8.1f} "
                f"per seed {np.round(result['final_returns'], 1)} "
                f"({result['seconds_including_compile']} s)",
                flush=True,
            )
    args.out.mkdir(parents=True, exist_ok=True)
    plot(results, args.out / "ablations.png")
    report = {
        "benchmark": "ablations",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join(shlex.quote(arg) for arg in sys.argv),
        "machine": machine_description(),
        "seeds": args.seeds,
        "final_return": "mean episode return over the last 10 updates",
        "results": results,
    }
    (args.out / "ablations.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out / 'ablations.json'} and {args.out / 'ablations.png'}")


if __name__ == "__main__":
    main()
