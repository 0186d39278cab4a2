"""Compile seconds of the classic CartPole config, and what each switch adds to them.

    python benchmarks/compile.py [--seeds 1] [--repeats 2] [--tag cpu-2core]

For the baseline (``PPOConfig()``: 4 envs x 128 steps, 4 epochs x 4 minibatches) and for each
option switched on alone, ``jax.jit(jax.vmap(ppojax.train))`` is traced (``lower``) and compiled
(``compile``) in a fresh process, ``--repeats`` times, alternating the variants; the median of
each is reported, and the difference to the baseline. A fresh process per measurement keeps
JAX's in-memory caches of one variant from shortening the next.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import machine_description  # noqa: E402

VARIANTS: dict[str, dict] = {
    "baseline": {},
    "normalize_observations": {"normalize_observations": True},
    "normalize_rewards": {"normalize_rewards": True},
    "vf_clip_eps=0.2": {"vf_clip_eps": 0.2},
    "target_kl=0.02 (early stop)": {"target_kl": 0.02},
    "policy_objective=penalty (adaptive beta)": {"policy_objective": "penalty"},
    "eval_every=10": {"eval_every": 10},
    "recurrent=gru": {"recurrent": "gru", "recurrent_size": 64},
}

MEASURE = """
import json, sys, time
import jax
import ppojax
settings, seeds = json.loads(sys.argv[1]), int(sys.argv[2])
config = ppojax.PPOConfig(**settings)
keys = jax.random.split(jax.random.key(0), seeds)
train = jax.jit(jax.vmap(ppojax.train, in_axes=(None, 0)))
start = time.perf_counter()
lowered = train.lower(config, keys)
traced = time.perf_counter()
lowered.compile()
done = time.perf_counter()
print(json.dumps({"lower_s": traced - start, "compile_s": done - traced}))
"""


def measure(settings: dict, seeds: int) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", MEASURE, json.dumps(settings), str(seeds)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PPOJAX_NO_COMPILE_CACHE": "1"},
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--tag", default="cpu-2core", help="file name suffix")
    parser.add_argument("--note", default="", help="recorded in the JSON (e.g. machine load)")
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    for _ in range(args.repeats):
        for name, settings in VARIANTS.items():
            runs[name].append(measure(settings, args.seeds))
            print(name, json.dumps(runs[name][-1]), flush=True)
    rows = []
    for name, measured in runs.items():
        lower = statistics.median(run["lower_s"] for run in measured)
        compile_s = statistics.median(run["compile_s"] for run in measured)
        rows.append(
            {
                "variant": name,
                "settings": VARIANTS[name],
                "lower_s": round(lower, 2),
                "compile_s": round(compile_s, 2),
                "total_s": round(lower + compile_s, 2),
            }
        )
    base = rows[0]["total_s"]
    for row in rows:
        row["added_s"] = round(row["total_s"] - base, 2)
    report = {
        "benchmark": "compile",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join(shlex.quote(arg) for arg in sys.argv),
        "machine": machine_description(),
        "note": args.note,
        "seeds": args.seeds,
        "rows": rows,
        "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"compile-{args.tag}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    for row in rows:
        print(f"{row['variant']:45s} {row['total_s']:6.2f} s  ({row['added_s']:+.2f})")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
