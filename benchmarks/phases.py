"""Where one PPO update's time goes, from a trace of the compiled training loop.

    python benchmarks/phases.py [--seeds 1 8] [--num-envs 4] [--updates 50]

Runs ``--updates`` updates of the classic CartPole config (or ``--num-envs`` envs) under
``jax.profiler.trace`` and adds up the time of every compiled kernel (XLA thunk), grouped by
the phase its op belongs to: ppojax labels its phases with ``jax.named_scope`` (rollout, gae,
epochs/shuffle, epochs/loss_and_grad, epochs/optimizer, post_update_kl), and the kernels'
names map to those labels through the compiled HLO's metadata. Reports microseconds per
update per phase, the kernels launched per update, and the heaviest kernels.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import glob
import gzip
import json
import re
import shlex
import sys
import tempfile
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import machine_description  # noqa: E402

import ppojax  # noqa: E402
from ppojax.ppo.train import init_state, run_updates  # noqa: E402

PHASES = (
    "shuffle",
    "loss_and_grad",
    "optimizer",
    "epochs",
    "post_update_kl",
    "gae",
    "rollout",
)


def kernel_phases(hlo_text: str) -> dict[str, str]:
    """Kernel (instruction) name -> ppojax phase, from the op_name metadata of the HLO."""
    phases = {}
    for line in hlo_text.splitlines():
        match = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = .*op_name=\"([^\"]*)\"", line)
        if not match:
            continue
        name, op_name = match.groups()
        scopes = op_name.split("/")
        phases[name] = next((phase for phase in PHASES if phase in scopes), "other")
    return phases


def trace_events(log_dir: str) -> list[dict]:
    path = glob.glob(f"{log_dir}/**/*perfetto_trace.json.gz", recursive=True)[0]
    with gzip.open(path) as file:
        data = json.load(file)
    return data["traceEvents"] if isinstance(data, dict) else data


def profile(config: ppojax.PPOConfig, seeds: int, updates: int) -> dict:
    keys = jax.random.split(jax.random.key(0), seeds)
    states = jax.jit(jax.vmap(lambda key: init_state(config, key)))(keys)
    run = jax.jit(jax.vmap(lambda state: run_updates(config, state, updates)))
    compiled = run.lower(states).compile()
    phases = kernel_phases(compiled.as_text())
    jax.block_until_ready(compiled(states))  # warm up
    start = time.perf_counter()
    jax.block_until_ready(compiled(states))
    wall = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as log_dir:
        with jax.profiler.trace(log_dir, create_perfetto_trace=True):
            jax.block_until_ready(compiled(states))
        events = trace_events(log_dir)
    per_phase = collections.Counter()
    per_kernel = collections.Counter()
    launches = 0
    for event in events:
        if event.get("ph") != "X" or event["name"] not in phases:
            continue
        if event["name"].startswith(("while", "call", "conditional")):
            continue  # these spans contain other kernels' spans
        per_phase[phases[event["name"]]] += event.get("dur", 0.0)
        per_kernel[event["name"]] += event.get("dur", 0.0)
        launches += 1
    kernel_total = sum(per_phase.values())
    return {
        "seeds": seeds,
        "updates": updates,
        "wall_microseconds_per_update_untraced": round(wall / updates * 1e6, 1),
        "kernel_microseconds_per_update": round(kernel_total / updates, 1),
        "kernel_launches_per_update": round(launches / updates),
        "phases_microseconds_per_update": {
            phase: round(per_phase[phase] / updates, 1)
            for phase in (*PHASES, "other")
            if per_phase[phase]
        },
        "heaviest_kernels_microseconds_per_update": {
            f"{name} ({phases[name]})": round(total / updates, 1)
            for name, total in per_kernel.most_common(12)
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--updates", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write")
    args = parser.parse_args()
    config = ppojax.PPOConfig(num_envs=args.num_envs, num_steps=args.num_steps)
    report = {
        "benchmark": "profile",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join(shlex.quote(arg) for arg in sys.argv),
        "machine": machine_description(),
        "results": [],
    }
    for seeds in args.seeds:
        result = profile(config, seeds, args.updates)
        report["results"].append(result)
        print(json.dumps(result, indent=1), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
