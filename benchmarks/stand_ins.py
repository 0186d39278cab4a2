"""What the stand-ins of ppojax/runtime/kernels.py are worth: paired against the plain forms.

    python benchmarks/stand_ins.py [--seeds 1 8] [--rounds 5] [--timesteps 131072]

The classic CartPole config (4 envs x 128 steps, 4 epochs of 4 minibatches), trained as a user
trains seeds from Python: ``jax.jit(jax.vmap(ppojax.train))`` with JAX's default options.
For each seed count it compiles one program per variant: every stand-in on, every one off
(``kernels.plain()``), and each one off alone (when there are several). Compile time is
measured apart. Then the variants run in rounds with fresh keys, the order rotating each
round, and each variant's run time is compared with the all-on program's in the same round;
a variant's figure is the median over rounds of (all-on steps/s) / (variant steps/s), so
1.25 means the stand-ins it switched off were worth 25%. Writes benchmarks/results/stand_ins.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax
import numpy as np
from common import RESULTS, record, write_json

import ppojax
from ppojax.runtime import kernels

RESULT = RESULTS / "stand_ins.json"


def variants() -> dict[str, tuple[str, ...] | None]:
    """name -> the stand-ins switched off (None: none)."""
    table: dict[str, tuple[str, ...] | None] = {"all stand-ins": None, "all plain": ()}
    if len(kernels.STAND_INS) > 1:
        for name in kernels.STAND_INS:
            table[f"plain {name}"] = (name,)
    return table


def compile_variant(config: ppojax.PPOConfig, seeds: int, off: tuple[str, ...] | None):
    keys = jax.random.split(jax.random.key(0), seeds)
    # a fresh function object per variant, so jit traces it again under the switch
    program = jax.jit(jax.vmap(lambda c, k: ppojax.train(c, k), in_axes=(None, 0)))
    start = time.perf_counter()
    if off is None:
        compiled = program.lower(config, keys).compile()
    else:
        with kernels.plain(*off):
            compiled = program.lower(config, keys).compile()
    return compiled, time.perf_counter() - start


def measure(seeds: int, rounds: int, timesteps: int) -> dict:
    config = ppojax.PPOConfig(total_timesteps=timesteps)  # the classic config
    table = variants()
    # one throwaway compile first: the process's first pays one-time costs (backend start,
    # tracing caches) that would otherwise land on whichever variant comes first
    compile_variant(config, seeds, None)
    compiled, compile_s = {}, {}
    for name, off in table.items():
        compiled[name], compile_s[name] = compile_variant(config, seeds, off)
        print(f"  {seeds} seeds, {name}: compiled in {compile_s[name]:.1f} s", flush=True)
    names = list(table)
    run_s: dict[str, list[float]] = {name: [] for name in names}
    returns: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        keys = jax.random.split(jax.random.key(round_index + 1), seeds)
        order = names[round_index % len(names) :] + names[: round_index % len(names)]
        for name in order:
            start = time.perf_counter()
            out = jax.block_until_ready(compiled[name](config, keys))
            run_s[name].append(time.perf_counter() - start)
            final = np.nanmean(np.asarray(out.metrics["episode_return"])[:, -10:])
            returns[name].append(float(final))
    steps = config.num_updates * config.num_envs * config.num_steps * seeds
    report = {}
    for name in names:
        pairs = zip(run_s[name], run_s["all stand-ins"], strict=True)
        worth = [variant / all_on for variant, all_on in pairs]
        report[name] = {
            "compile_seconds": round(compile_s[name], 2),
            "run_seconds": [round(s, 3) for s in run_s[name]],
            "env_steps_per_second": round(steps / statistics.median(run_s[name])),
            # how much faster the all-on program ran than this one, round by round
            "stand_ins_worth": round(statistics.median(worth), 3),
            "mean_training_return_last_10_updates": round(statistics.mean(returns[name]), 1),
        }
        print(f"  {seeds} seeds, {name}: {report[name]}", flush=True)
    return {"seeds": seeds, "env_steps": steps, "variants": report}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--timesteps", type=int, default=131_072)
    args = parser.parse_args()
    runs = [measure(seeds, args.rounds, args.timesteps) for seeds in args.seeds]
    result = {
        "benchmark": "stand_ins",
        **record(__file__, sys.argv[1:]),
        "config": {
            key: getattr(ppojax.PPOConfig(total_timesteps=args.timesteps), key)
            for key in ("env_id", "num_envs", "num_steps", "total_timesteps", "update_epochs")
        },
        "runs": runs,
    }
    write_json(RESULT, result)
    print(f"wrote {RESULT}")


if __name__ == "__main__":
    main()
