"""ppojax against rejax on the same PPO configurations, in the same process, runs alternating.

    python benchmarks/compare.py [--configs cartpole cartpole-2048 pendulum breakout]
                                 [--seeds 1 8] [--pairs 5] [--cpu-devices 1] [--cpu-threads N]
                                 [--tag cpu-2core] [--jax-defaults] [--compile-repeats N]
    python benchmarks/compare.py --readme README.md    (the README's table from the results)

(the default configs; ``cartpole-65536`` and ``breakout-1024`` are GPU sizes, run by
``benchmarks/gpu.sh``)

For every configuration and seed count, both libraries' ``jit(vmap(train))`` are compiled
``--compile-repeats`` times (default ``--pairs``), alternating which goes first, each time
from a fresh lowering with JAX's caches cleared and after one throwaway compile that sets up
the compiler (compile time is the median, measured apart from run time; the trace and
lowering before it are timed too), each the way the library compiles its own runs: ppojax with
``ppojax.compiler_options()`` (on CPU: LLVM level 2 and copy insertion's region analysis),
rejax with XLA's defaults; ``--jax-defaults`` compiles ppojax with XLA's defaults too, the
program a user gets from ``jax.jit(jax.vmap(ppojax.train))`` in Python. Each is then compiled
once more with the other set of options (XLA's defaults or ppojax's), timed only, for the
report, which also gives each compiled program's size (fusions and HLO instructions). Then
both run ``--pairs`` times each with fresh keys, alternating which library goes first. A
pair's ratio is ppojax's env steps/s over rejax's (run time only); the report gives the
median ratio.
Final returns come from the same evaluation for both libraries: 128 episodes of each trained
policy (sampled actions) through ppojax's evaluator.

In the same run, the speed limits of the CartPole configuration: the environment alone under
vmap with random actions, and the rollout alone (env + policy forward pass, no update), so the
report shows what fraction of the achievable speed the full training loop reaches. For the
2048-env configuration it counts the FLOPs per env step and measures a matmul of the same
shapes, for the achieved fraction of the machine's matmul throughput.

``--cpu-devices N`` gives the process N CPU devices (``ppojax.use_cpu_devices``) before JAX
starts. ppojax's seeds are then split over them as ``ppojax train`` splits a run folder's runs
(``parallel.runs_sharding``, where the seeds divide evenly); rejax's ``jit(vmap(train))`` runs
as it ships, on JAX's default device with the process's thread pool. ``--cpu-threads N``
sizes that pool (``ppojax.limit_cpu_threads``) for both libraries alike.

rejax 0.1.3 (``pip install -e '.[bench]'``) uses gymnax's old five-value ``step``; its env is
wrapped in ``LegacyStepAPIWrapper`` (see KNOWN-ISSUES). rejax's periodic evaluation is switched
off for the timed runs (ppojax's training loop has none either).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from common import env_alone, keys_for, pyplot, record, rejax_algo, timed, with_block, write_json

import ppojax
from ppojax.ppo.rollout import collect_rollout, rollout_start
from ppojax.ppo.train import init_state, make_agent
from ppojax.runs.policy import evaluate, make_act
from ppojax.runtime.launches import program_size
from ppojax.runtime.sharding import jit_over_runs, place_runs

EVAL_EPISODES = 128


def cpu_settings(argv: list[str]) -> tuple[int, int | None]:
    """``--cpu-devices`` and ``--cpu-threads``, read before the configs below start JAX
    (building a PPOConfig imports gymnax, which computes at import)."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--cpu-devices", type=int, default=1)
    early.add_argument("--cpu-threads", type=int, default=None)
    known, _ = early.parse_known_args(argv)
    return known.cpu_devices, known.cpu_threads


if __name__ == "__main__":
    _devices, _threads = cpu_settings(sys.argv[1:])
    ppojax.use_cpu_devices(_devices)
    if _threads:
        ppojax.limit_cpu_threads(_threads)

# Breakout-MinAtar's settings here, at any number of envs: an MLP on the flattened 10x10x4 frame.
BREAKOUT = dict(
    env_id="Breakout-MinAtar",
    num_steps=128,
    update_epochs=4,
    num_minibatches=8,
    learning_rate=5e-4,
    hidden_sizes=(256, 256),
    activation="relu",
)

CONFIGS: dict[str, ppojax.PPOConfig] = {
    # The classic CartPole config: 4 envs x 128 steps, 4 epochs x 4 minibatches, 500k steps.
    "cartpole": ppojax.PPOConfig(),
    # Many envs per update: 2048 envs x 16 steps, 4 epochs x 4 minibatches of 8192.
    "cartpole-2048": ppojax.PPOConfig(num_envs=2048, num_steps=16, total_timesteps=2_097_152),
    # ppojax's Pendulum preset (obs and reward normalization, 256-256 networks) at 500k steps.
    "pendulum": ppojax.PPOConfig.preset("Pendulum-v1", total_timesteps=524_288),
    # GPU sizes (benchmarks/gpu.sh): 65,536 CartPole envs x 16 steps, 20 updates, and
    # Breakout-MinAtar at 1,024 envs, 20 updates.
    "cartpole-65536": ppojax.PPOConfig(
        num_envs=65_536, num_steps=16, total_timesteps=65_536 * 16 * 20
    ),
    "breakout-1024": ppojax.PPOConfig(**BREAKOUT, num_envs=1024, total_timesteps=1024 * 128 * 20),
    # Breakout-MinAtar with an MLP on the flattened 10x10x4 frame, a short budget.
    "breakout": ppojax.PPOConfig(**BREAKOUT, num_envs=64, total_timesteps=524_288),
}

# What a run without --configs compares: the sizes a 2-core CPU trains in minutes.
CPU_CONFIGS = ("cartpole", "cartpole-2048", "pendulum", "breakout")

# Seed counts and timed pairs unless --seeds / --pairs say otherwise: the classic config at
# 1 and 8 seeds, 5 pairs; every other one at 1 seed, 3 pairs.
DEFAULT_SEEDS = {"cartpole": (1, 8)}
DEFAULT_PAIRS = {"cartpole": 5}


# --------------------------------------------------------------------------------------------
# The two libraries, each as (jitted train over seeds, steps per seed, act for evaluation)


def ppojax_runner(config: ppojax.PPOConfig):
    # the seeds over the process's devices, as ppojax train lays out a run folder's runs
    def run(compiled, keys):
        return compiled(config, place_runs(keys, keys.shape[0]))

    def lower(keys):
        train_seeds = jit_over_runs(jax.vmap(ppojax.train, in_axes=(None, 0)), keys.shape[0])
        return train_seeds.lower(config, place_runs(keys, keys.shape[0]))

    def act(out, seed: int):
        return make_act(config, jax.tree.map(lambda leaf: leaf[seed], out.state))

    def training_returns(out) -> np.ndarray:
        returns = np.asarray(out.metrics["episode_return"])[:, -10:]
        return np.nanmean(returns, axis=1)

    return lower, run, act, training_returns


def rejax_runner(config: ppojax.PPOConfig):
    algo = rejax_algo(config)
    train_seeds = jax.jit(jax.vmap(algo.train))

    def lower(keys):
        return train_seeds.lower(keys)

    def run(compiled, keys):
        return compiled(keys)

    def act(out, seed: int):
        train_state = jax.tree.map(lambda leaf: leaf[seed], out[0])
        core = jax.jit(algo.make_act(train_state))

        def batched(obs, key, deterministic=False):
            keys = jax.random.split(key, obs.shape[0])
            return jax.vmap(core)(obs, keys)

        return batched

    def training_returns(out) -> np.ndarray:
        return np.full(jax.tree.leaves(out)[0].shape[0], np.nan)

    return lower, run, act, training_returns


RUNNERS = {"ppojax": ppojax_runner, "rejax": rejax_runner}


def compare_pair(
    config: ppojax.PPOConfig,
    seeds: int,
    pairs: int,
    jax_defaults: bool = False,
    compile_repeats: int | None = None,
) -> dict:
    """Compile both libraries, then ``pairs`` alternating timed runs of each. With
    ``jax_defaults`` ppojax compiles with XLA's default options, as rejax does: the program a
    user gets from ``jax.jit(jax.vmap(ppojax.train))``."""
    steps = seeds * config.num_updates * config.batch_size
    libraries = {}
    # what each library uses
    options = {"ppojax": None if jax_defaults else ppojax.compiler_options(), "rejax": None}
    for name, make in RUNNERS.items():
        lower, run, act, training_returns = make(config)
        libraries[name] = {
            "lower": lower,
            "run": run,
            "act": act,
            "training_returns": training_returns,
            "compile_times": [],
            "lower_times": [],
            "run_seconds": [],
            "out": None,
        }
    # The process's first compile also sets up the compiler (~0.5 s on a 2-core CPU): a
    # throwaway compile takes that, then each library compiles ``compile_repeats`` times
    # (default ``pairs``), alternating, each from a fresh lowering with JAX's caches cleared
    # (a Lowered compiles only once).
    jax.jit(lambda x: jnp.sin(x) * 2.0).lower(1.0).compile()
    for repeat in range(compile_repeats or pairs):
        order = list(RUNNERS) if repeat % 2 == 0 else list(reversed(RUNNERS))
        for name in order:
            library = libraries[name]
            jax.clear_caches()
            start = time.perf_counter()
            library["lowered"] = library["lower"](keys_for(seeds, 0))
            library["lower_times"].append(time.perf_counter() - start)
            start = time.perf_counter()
            library["compiled"] = library["lowered"].compile(compiler_options=options[name])
            library["compile_times"].append(time.perf_counter() - start)
    for library in libraries.values():
        library["compile_seconds"] = statistics.median(library["compile_times"])
        library["program"] = program_size(library["compiled"])
    for name, library in libraries.items():
        other = ppojax.compiler_options() if options[name] is None else None
        start = time.perf_counter()
        library["lowered"].compile(compiler_options=other)
        library["compile_seconds_other_options"] = time.perf_counter() - start
    for repeat in range(pairs):
        order = list(RUNNERS) if repeat % 2 == 0 else list(reversed(RUNNERS))
        for name in order:
            library = libraries[name]
            keys = keys_for(seeds, repeat)
            start = time.perf_counter()
            library["out"] = jax.block_until_ready(library["run"](library["compiled"], keys))
            library["run_seconds"].append(time.perf_counter() - start)
    ratios = [
        rejax_seconds / ppojax_seconds
        for ppojax_seconds, rejax_seconds in zip(
            libraries["ppojax"]["run_seconds"], libraries["rejax"]["run_seconds"], strict=True
        )
    ]
    result: dict[str, Any] = {
        "seeds": seeds,
        "env_steps": steps,
        "ratios": [round(ratio, 3) for ratio in ratios],
        "median_ratio": round(statistics.median(ratios), 3),
    }
    for name, library in libraries.items():
        out = library["out"]
        final = [
            float(np.mean(evaluate(config, library["act"](out, seed), EVAL_EPISODES, seed=seed)))
            for seed in range(seeds)
        ]
        median_seconds = statistics.median(library["run_seconds"])
        result[name] = {
            "compile_options": options[name],
            "compile_seconds": round(library["compile_seconds"], 2),
            "compile_seconds_each": [round(value, 2) for value in library["compile_times"]],
            # tracing and lowering to StableHLO, before XLA's compile: the rest of the wait
            "lower_seconds": round(statistics.median(library["lower_times"]), 2),
            "compile_seconds_other_options": round(library["compile_seconds_other_options"], 2),
            "program": library["program"],
            "run_seconds": [round(value, 3) for value in library["run_seconds"]],
            "env_steps_per_second": round(steps / median_seconds),
            "eval_return_per_seed": [round(value, 1) for value in final],
            "eval_return_mean": round(float(np.mean(final)), 1),
            "training_return_last_10_updates": [
                round(float(value), 1) for value in library["training_returns"](out)
            ],
        }
    return result


# --------------------------------------------------------------------------------------------
# The limits: env alone, rollout alone, FLOPs and matmul


def compile_and_time(function, *args, repeats: int = 3) -> tuple[float, float]:
    """(compile seconds, median run seconds) of ``jax.jit(function)(*args)``."""
    start = time.perf_counter()
    compiled = jax.jit(function).lower(*args).compile()
    compile_seconds = time.perf_counter() - start
    seconds = [timed(compiled, *args)[1] for _ in range(repeats)]
    return compile_seconds, statistics.median(seconds)


def env_only(config: ppojax.PPOConfig, seeds: int) -> dict:
    """Env steps/s of the raw gymnax env under vmap with uniformly random actions (auto-reset
    included), the same number of steps and envs as training."""
    envs = seeds * config.num_envs
    steps = config.num_updates * config.num_steps
    run = env_alone(config.env_id, envs, steps)
    compile_seconds, seconds = compile_and_time(run, jax.random.key(0))
    return {
        "compile_seconds": round(compile_seconds, 2),
        "env_steps_per_second": round(envs * steps / seconds),
    }


def rollout_only(config: ppojax.PPOConfig, seeds: int) -> dict:
    """Env steps/s of ppojax's rollout (env + actor/critic forward pass + action sampling),
    num_updates rollouts of num_steps with fixed parameters, vmapped over seeds."""
    agent = make_agent(config)

    def one_seed(key):
        state = init_state(config, key)
        carry = rollout_start(state)

        def rollout(carry, _):
            carry, transitions = collect_rollout(agent, config, state.params, carry)
            return carry, transitions.reward.sum()

        _, rewards = jax.lax.scan(rollout, carry, None, config.num_updates)
        return rewards.sum()

    keys = jax.random.split(jax.random.key(0), seeds)
    compile_seconds, seconds = compile_and_time(jax.vmap(one_seed), keys)
    steps = seeds * config.num_updates * config.batch_size
    return {
        "compile_seconds": round(compile_seconds, 2),
        "env_steps_per_second": round(steps / seconds),
    }


def mlp_flops(sizes: tuple[int, ...]) -> int:
    """Multiply-adds x 2 of one sample through dense layers of ``sizes``."""
    return sum(2 * a * b for a, b in zip(sizes[:-1], sizes[1:], strict=True))


def flops_per_env_step(config: ppojax.PPOConfig) -> dict:
    """Dense-layer FLOPs per env step: the rollout's forward pass of actor and critic, plus
    per epoch one forward and backward pass (backward = 2 x forward) over every sample."""
    spec = make_agent(config).env.spec
    actor = mlp_flops((spec.obs_dim, *config.hidden_sizes, spec.action_dim))
    critic = mlp_flops((spec.obs_dim, *config.hidden_sizes, 1))
    forward = actor + critic
    total = forward + config.update_epochs * 3 * forward
    return {"forward": forward, "per_env_step": total}


def matmul_throughput(config: ppojax.PPOConfig) -> dict:
    """FLOP/s of the update's dense layers alone: [minibatch, a] x [a, b] products of the
    networks' shapes, forward and both backward products, as one jitted loop."""
    spec = make_agent(config).env.spec
    rows = config.minibatch_size
    shapes = []
    for out_dim in (spec.action_dim, 1):
        sizes = (spec.obs_dim, *config.hidden_sizes, out_dim)
        shapes += list(zip(sizes[:-1], sizes[1:], strict=True))
    key = jax.random.key(0)
    inputs = [jax.random.normal(key, (rows, a)) for a, _ in shapes]
    weights = [jax.random.normal(key, (a, b)) * 0.01 for a, b in shapes]
    grads_out = [jax.random.normal(key, (rows, b)) for _, b in shapes]
    loops = 200

    def run(inputs, weights, grads_out):
        def body(carry, _):
            total = carry
            for x, w, g in zip(inputs, weights, grads_out, strict=True):
                y = (x + total) @ w  # forward
                dx = g @ w.T  # backward to the input
                dw = x.T @ (g + total)  # backward to the weights
                total = total + y.sum() * 1e-9 + dx.sum() * 1e-9 + dw.sum() * 1e-9
            return total, None

        total, _ = jax.lax.scan(body, jnp.float32(0), None, loops)
        return total

    _, seconds = compile_and_time(run, inputs, weights, grads_out)
    flops = loops * sum(3 * 2 * rows * a * b for a, b in shapes)
    return {"rows": rows, "shapes": shapes, "flops_per_second": round(flops / seconds)}


def xla_flops(config: ppojax.PPOConfig) -> float | None:
    """FLOPs of one update as XLA's cost analysis counts them (all ops, not just matmuls)."""
    state = init_state(config, jax.random.key(0))
    from ppojax.ppo.train import run_updates

    lowered = jax.jit(functools.partial(run_updates, config, num_updates=1)).lower(state)
    analysis = lowered.compile().cost_analysis()
    if isinstance(analysis, list):
        analysis = analysis[0]
    return float(analysis.get("flops", float("nan"))) if analysis else None


# --------------------------------------------------------------------------------------------


def config_record(config: ppojax.PPOConfig) -> dict:
    return {
        field.name: getattr(config, field.name)
        for field in dataclasses.fields(config)
        if field.name
        in (
            "env_id",
            "num_envs",
            "num_steps",
            "total_timesteps",
            "update_epochs",
            "num_minibatches",
            "hidden_sizes",
            "activation",
            "learning_rate",
            "normalize_observations",
            "normalize_rewards",
        )
    }


def plot(report: dict, path: Path) -> None:
    plt = pyplot()

    rows = [(name, result) for name, block in report["configs"].items() for result in block["runs"]]
    labels = [f"{name}\n{result['seeds']} seed(s)" for name, result in rows]
    positions = np.arange(len(rows))
    figure, (speed, ratio) = plt.subplots(1, 2, figsize=(12, 4))
    for offset, library in ((-0.2, "ppojax"), (0.2, "rejax")):
        speed.bar(
            positions + offset,
            [result[library]["env_steps_per_second"] / 1e3 for _, result in rows],
            width=0.4,
            label=library,
        )
    limits = report["configs"].get("cartpole", {}).get("limits", {})
    for seeds, limit in limits.items():
        for index, (name, result) in enumerate(rows):
            if name == "cartpole" and str(result["seeds"]) == seeds:
                speed.plot(
                    [index - 0.4, index + 0.4],
                    [limit["rollout_only"]["env_steps_per_second"] / 1e3] * 2,
                    color="black",
                    linestyle="--",
                )
    speed.set_xticks(positions, labels, fontsize=8)
    speed.set_ylabel("env steps / s (thousands), run time only")
    speed.set_yscale("log")
    speed.legend()
    speed.set_title("throughput (dashed: ppojax rollout only)")
    ratio.bar(positions, [result["median_ratio"] for _, result in rows], color="tab:green")
    for index, (_, result) in enumerate(rows):
        ratio.scatter([index] * len(result["ratios"]), result["ratios"], color="black", s=8)
    ratio.axhline(1.0, color="grey", linewidth=0.8)
    ratio.axhline(1.3, color="tab:red", linestyle=":", linewidth=0.8)
    ratio.set_xticks(positions, labels, fontsize=8)
    ratio.set_ylabel("ppojax / rejax env steps/s (pairs; bar = median)")
    figure.suptitle(f"ppojax vs rejax 0.1.3 — {report['date'][:10]}, {report['machine']['cpu']}")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=list(CPU_CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--seeds", type=int, nargs="+", help="seed counts (default per config)")
    parser.add_argument("--pairs", type=int, help="timed runs of each library (default per config)")
    parser.add_argument(
        "--compile-repeats",
        type=int,
        help="timed compiles of each library (default --pairs): compile time varies more than "
        "run time, and its median wants more samples",
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--tag", default="cpu-2core", help="file name suffix")
    parser.add_argument(
        "--jax-defaults",
        action="store_true",
        help="compile ppojax with XLA's default options too (the Python path), not its own",
    )
    parser.add_argument(
        "--cpu-devices",
        type=int,
        default=1,
        help="CPU devices; ppojax's seeds are split over them where they divide evenly",
    )
    parser.add_argument(
        "--cpu-threads", type=int, help="thread pool size, for both libraries (default: cores)"
    )
    parser.add_argument(
        "--readme",
        type=Path,
        help="only rewrite this README's speed table from the result files, and exit",
    )
    args = parser.parse_args()
    if args.readme:
        text = args.readme.read_text()
        args.readme.write_text(readme_with_speed_table(text, speed_table(args.out)))
        print(f"wrote the speed table of {args.readme}")
        return
    report: dict[str, Any] = {
        "benchmark": "compare",
        **record(__file__, sys.argv[1:], "rejax"),
        "cpu_devices": len(jax.devices()),
        "cpu_threads": args.cpu_threads or "one per core",
        "configs": {},
    }
    for name in args.configs:
        config = CONFIGS[name]
        block: dict[str, Any] = {"config": config_record(config), "runs": []}
        for seeds in args.seeds or DEFAULT_SEEDS.get(name, (1,)):
            pairs = args.pairs or DEFAULT_PAIRS.get(name, 3)
            result = compare_pair(config, seeds, pairs, args.jax_defaults, args.compile_repeats)
            block["runs"].append(result)
            print(
                f"{name}, {seeds} seed(s): ppojax {result['ppojax']['env_steps_per_second']:,} "
                f"steps/s (compile {result['ppojax']['compile_seconds']} s, eval return "
                f"{result['ppojax']['eval_return_mean']}), rejax "
                f"{result['rejax']['env_steps_per_second']:,} (compile "
                f"{result['rejax']['compile_seconds']} s, eval return "
                f"{result['rejax']['eval_return_mean']}); median ratio {result['median_ratio']} "
                f"of {result['ratios']}",
                flush=True,
            )
        if name == "cartpole":
            block["limits"] = {}
            for run in block["runs"]:
                seeds = run["seeds"]
                limits = {
                    "env_only": env_only(config, seeds),
                    "rollout_only": rollout_only(config, seeds),
                }
                train_speed = run["ppojax"]["env_steps_per_second"]
                limits["training_fraction_of_rollout_only"] = round(
                    train_speed / limits["rollout_only"]["env_steps_per_second"], 3
                )
                limits["training_fraction_of_env_only"] = round(
                    train_speed / limits["env_only"]["env_steps_per_second"], 3
                )
                block["limits"][str(seeds)] = limits
                print(f"{name}, {seeds} seed(s) limits: {limits}", flush=True)
        if name == "cartpole-2048":
            flops = flops_per_env_step(config)
            matmul = matmul_throughput(config)
            achieved = {}
            for run in block["runs"]:
                speed = run["ppojax"]["env_steps_per_second"]
                achieved[str(run["seeds"])] = {
                    "flops_per_second": round(speed * flops["per_env_step"]),
                    "fraction_of_matmul": round(
                        speed * flops["per_env_step"] / matmul["flops_per_second"], 3
                    ),
                    "rejax_fraction_of_matmul": round(
                        run["rejax"]["env_steps_per_second"]
                        * flops["per_env_step"]
                        / matmul["flops_per_second"],
                        3,
                    ),
                }
            block["flops"] = {
                **flops,
                "xla_flops_per_update": xla_flops(config),
                "matmul": matmul,
                "achieved": achieved,
            }
            print(f"{name} flops: {block['flops']}", flush=True)
        report["configs"][name] = block
        # written after every configuration, so a long run that stops keeps what it measured
        json_path = args.out / f"compare-{args.tag}.json"
        write_json(json_path, report)
    print(f"wrote {json_path}")
    plot(report, args.out / f"compare-{args.tag}.png")


# --------------------------------------------------------------------------------------------
# The README's speed table, generated from the result files

# The result files the table shows, in order; each gets a machine letter.
SPEED_RESULTS = (
    "compare-python-path.json",
    "compare-cpu-2core.json",
    "compare-cartpole-20261203-xeon-devices.json",
)
LABELS = {
    "cartpole": "CartPole, classic (4 envs x 128 steps)",
    "cartpole-2048": "CartPole, 2048 envs x 16 steps",
    "pendulum": "Pendulum preset, 524k steps",
    "breakout": "Breakout-MinAtar MLP, 524k steps",
    "cartpole-65536": "CartPole, 65,536 envs x 16 steps",
    "breakout-1024": "Breakout-MinAtar MLP, 1,024 envs",
}
SPEED_START, SPEED_END = "<!-- speed-table:start -->", "<!-- speed-table:end -->"


def compiled_with(run: dict) -> str:
    # files older than --jax-defaults hold no compile_options: ppojax compiled its own way
    options = run["ppojax"].get("compile_options", "its own")
    return "XLA defaults" if options is None else "ppojax's options"


def pair_text(run: dict, key: str, digits: int = 2) -> str:
    values = [run[name].get(key) for name in ("ppojax", "rejax")]
    if any(value is None for value in values):
        return "-"
    return " / ".join(f"{value:.{digits}f}" if digits else f"{value:g}" for value in values)


def speed_table(results: Path) -> str:
    """The markdown table of every run in the SPEED_RESULTS files, with a line per machine."""
    lines = [
        "| config | seeds | ppojax compiled with | ppojax steps/s | rejax steps/s | ratio "
        "| compile s, ppojax / rejax | fusions, ppojax / rejax | return, ppojax / rejax "
        "| machine | result |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for letter, name in zip("ABCDEFGH", SPEED_RESULTS, strict=False):
        report = json.loads((results / name).read_text())
        link = f"[json](benchmarks/results/{name})"
        figure = results / name.replace(".json", ".png")
        if figure.exists():
            link += f", [plot](benchmarks/results/{figure.name})"
        for config, block in report["configs"].items():
            for run in block["runs"]:
                sizes = [run[lib].get("program", {}).get("fusions") for lib in ("ppojax", "rejax")]
                lines.append(
                    f"| {LABELS.get(config, config)} | {run['seeds']} | {compiled_with(run)} "
                    f"| {run['ppojax']['env_steps_per_second']:,} "
                    f"| {run['rejax']['env_steps_per_second']:,} | {run['median_ratio']:.2f} "
                    f"| {pair_text(run, 'compile_seconds')} "
                    f"| {'-' if None in sizes else ' / '.join(map(str, sizes))} "
                    f"| {pair_text(run, 'eval_return_mean', 1)} | {letter} | {link} |"
                )
                link = "same"
        machine = report["machine"]
        devices = report.get("cpu_devices", 1)
        # the script as run from the repository root, wherever the checkout was
        command = re.sub(r"python \S*benchmarks/", "python benchmarks/", report["command"])
        notes.append(
            f"- {letter}: {machine['cpu']}, {machine['cores']} cores, {devices} JAX CPU "
            f"device{'s' if devices != 1 else ''}, jax {machine['jax']}, rejax "
            f"{report['versions']['rejax']}, {report['date'][:10]}: "
            f"`{command}`"
        )
    return "\n".join(lines) + "\n\n" + "\n".join(notes)


def readme_with_speed_table(readme: str, table: str) -> str:
    """``readme`` with the block between the speed-table markers replaced by ``table``."""
    return with_block(readme, SPEED_START, SPEED_END, table)


if __name__ == "__main__":
    main()
