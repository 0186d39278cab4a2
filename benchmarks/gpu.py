"""ppojax against rejax 0.1.3 on one GPU: env steps/s of each library's own jit(vmap(train)).

    python benchmarks/gpu.py [--parts works inside rlhf] [--works NAME ...]
        [--out benchmarks/results/gpu.json] [--mirror DIR] [--smoke]

Parts (``--parts``, default ``works``; a run of some parts keeps the others' sections of an
existing ``--out``, each section with its own date and command):

- ``works``: the works and ceilings below (``works``, ``ceilings``; ~4-5 min on an H200);
- ``inside``: ppojax's update from inside (benchmarks/gpu_parts.py): one update split into
  rollout (the "rollout alone" ceiling), GAE and epochs at 8192 and 65536 envs; one minibatch
  step's kernels, flops and bytes; each kernels candidate on and off, paired (``inside``);
- ``rlhf``: ``ppojax.rlhf``'s PPO and GRPO steps on a GPT-2-small-shaped model: seconds per
  step, response tokens/s, TFLOP/s (benchmarks/rlhf_speed.py; ``rlhf``).

The works, all on CartPole-v1 with PureJaxRL's classic PPO config (4 envs x 128 steps, 4
epochs x 4 minibatches, lr 2.5e-4 annealed in ppojax (rejax 0.1.3 has no annealing), 64-64
tanh), differ in agents (vmapped keys) and envs per agent:

- "1 agent x 4 envs": 244 updates (125k steps), latency-bound;
- "1 agent x 8192 envs", "1 agent x 65536 envs": 96 and 16 updates, about 100M and 134M
  steps, ~2 s each at GPU.md's ~52M and ~74M steps/s;
- "2048 agents x 4 envs": 5e5 steps each (976 updates), PureJaxRL's headline.

Each library's ``jax.jit(jax.vmap(train))`` over keys is compiled ahead of time (lowering and
compiling timed apart from running), then the two run alternating in this process, best of
up to 3 repeats (2 for 2048 agents; no further pair once a work's runs took 30 s, 90 s for
2048 agents), each waited for with ``block_until_ready``. Where a work trains
to its end (1 x 4 and 2048 x 4) both report the final policy's return by one protocol: the
mean over agents of 16 episodes with sampled actions. ppojax plays them in its compiled loop
(``eval_every`` = the number of updates: one evaluation, after the last update, inside the
timed run: a handicap of ~500 sequential steps against 976 x 144); rejax's policies are played
after its timed runs by this script (``algo.make_act`` and gymnax). ppojax's training return
(last 5% of updates) is kept too.

Ceilings, same process, measured first (seconds): gymnax's CartPole alone under vmap with
random actions, at 8192 and 65536 envs. Not measured: ppojax's rollout alone (no public
rollout function) and RLHF steps (benchmarks/rlhf.py has no GPT-2-small timing).

Writes ``--out`` (default benchmarks/results/gpu.json) after every work, each work in its own
try/except (an error is recorded and the rest go on), then a bar chart beside it (gpu.png).
rejax needs gymnax's LegacyStepAPIWrapper on gymnax 1.0 (shared/KNOWN-ISSUES.md). Uses only
ppojax's public API and benchmarks/common.py. ``--smoke``: every size shrunk to seconds on a
CPU.
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from common import (
    RESULTS,
    env_alone,
    failure,
    keys_for,
    nanmean,
    now,
    pyplot,
    record,
    rejax_algo,
    result_path,
    rounded,
    timed,
    write_json,
)
from gpu_parts import ENV_ID, EVAL_EPISODES, classic_config
from learning import final_training_returns

import ppojax

DEFAULT_OUT = RESULTS / "gpu.json"

# name: (agents, envs per agent, updates, timed repeats at most, final return measured, and
# the run seconds of both libraries together after which no further repeat starts). In this
# order: the 65536-env work last, since rejax's run there is the least predictable (GPU.md has
# no figure for it).
WORKS: dict[str, tuple[int, int, int, int, bool, float]] = {
    "1 agent x 4 envs": (1, 4, 244, 3, True, 30.0),
    "1 agent x 8192 envs": (1, 8192, 96, 3, False, 30.0),
    "2048 agents x 4 envs": (2048, 4, 976, 2, True, 90.0),
    "1 agent x 65536 envs": (1, 65536, 16, 3, False, 30.0),
}
SMOKE_WORKS: dict[str, tuple[int, int, int, int, bool, float]] = {
    "1 agent x 4 envs": (1, 4, 8, 1, True, 30.0),
    "1 agent x 8192 envs": (1, 64, 2, 1, False, 30.0),
    "2048 agents x 4 envs": (4, 4, 8, 1, True, 30.0),
    "1 agent x 65536 envs": (1, 256, 2, 1, False, 30.0),
}
# env alone: (envs, steps of the scan)
CEILINGS = {"env alone, 8192 envs": (8192, 20_000), "env alone, 65536 envs": (65536, 20_000)}
SMOKE_CEILINGS = {"env alone, 8192 envs": (64, 200), "env alone, 65536 envs": (256, 200)}


# --------------------------------------------------------------------------------------------
# The two libraries: lower(keys) -> jax.stages.Lowered, run(compiled, keys) -> output


def ppojax_library(config: ppojax.PPOConfig) -> dict[str, Any]:
    train = jax.jit(jax.vmap(ppojax.train, in_axes=(None, 0)))
    return {
        "lower": lambda keys: train.lower(config, keys),
        "options": ppojax.compiler_options(),  # what ppojax compiles with (None on a GPU)
        "run": lambda compiled, keys: compiled(config, keys),
    }


def rejax_library(config: ppojax.PPOConfig) -> dict[str, Any]:
    algo = rejax_algo(config)
    train = jax.jit(jax.vmap(algo.train))
    return {
        "algo": algo,
        "lower": lambda keys: train.lower(keys),
        "options": None,
        "run": lambda compiled, keys: compiled(keys),
    }


# --------------------------------------------------------------------------------------------
# Final returns


def ppojax_returns(out: Any) -> dict[str, float | None]:
    """The final evaluation (mean over agents) and the training return of the last 5% of
    updates (mean over agents)."""
    training = np.asarray(out.metrics["episode_return"], np.float64)  # [agents, updates]
    evaluation = np.asarray(out.metrics["eval_return"], np.float64)[:, -1]
    return {
        "final": rounded(nanmean(evaluation), 2),
        "training": rounded(nanmean(final_training_returns(training)), 2),
    }


def rejax_final_return(algo: Any, out: Any, key: jax.Array, episodes: int) -> float | None:
    """Mean over agents of ``episodes`` episodes of each trained rejax policy, sampled actions
    (``algo.make_act``), on gymnax's env with its own time limit."""
    import gymnax

    env, params = gymnax.make(ENV_ID)
    limit = int(params.max_steps_in_episode)
    states = out[0]  # rejax's train returns (train state, evaluation)

    def agent_return(ts: Any, key: jax.Array) -> jax.Array:
        act = algo.make_act(ts)

        def episode(key: jax.Array) -> jax.Array:
            reset_key, key = jax.random.split(key)
            obs, state = env.reset(reset_key, params)

            def step(carry: tuple, _: None) -> tuple:
                obs, state, key, total, alive = carry
                key, act_key, step_key = jax.random.split(key, 3)
                obs, state, reward, terminated, truncated, _ = env.step(
                    step_key, state, act(obs, act_key), params
                )
                total = total + reward * alive
                alive = alive * (1.0 - jnp.logical_or(terminated, truncated))
                return (obs, state, key, total, alive), None

            start = (obs, state, key, jnp.float32(0), jnp.float32(1))
            (_, _, _, total, _), _ = jax.lax.scan(step, start, None, limit)
            return total

        return jax.vmap(episode)(jax.random.split(key, episodes)).mean()

    agents = jax.tree.leaves(states)[0].shape[0]
    returns = jax.jit(jax.vmap(agent_return))(states, jax.random.split(key, agents))
    return rounded(np.mean(np.asarray(returns)), 2)


# --------------------------------------------------------------------------------------------
# Works and ceilings


def compile_library(library: dict[str, Any], agents: int) -> float:
    """Lower and compile (timed together) into ``library["compiled"]``; the seconds."""
    start = time.perf_counter()
    lowered = library["lower"](keys_for(agents, 0))
    library["compiled"] = lowered.compile(compiler_options=library["options"])
    return time.perf_counter() - start


LIBRARIES = {"ppojax": ppojax_library, "rejax": rejax_library}


def measure_work(name: str, spec: tuple[int, int, int, int, bool, float], episodes: int) -> dict:
    """Both libraries on one work: compile each, then alternating timed runs (a pair at
    least; no further pair once the runs so far took ``spec[5]`` seconds). A library that
    fails (its error recorded) leaves the other's figures standing."""
    agents, envs, updates, repeats, final, max_run_s = spec
    config = classic_config(envs, updates, final)
    steps = agents * config.num_updates * config.batch_size
    work: dict[str, Any] = {
        "name": name,
        "agents": agents,
        "envs_per_agent": envs,
        "num_steps": config.num_steps,
        "updates": config.num_updates,
        "env_steps": steps,
    }
    libraries = {}
    for library_name, make in LIBRARIES.items():
        try:
            library = make(config)
            work[f"{library_name}_compile_s"] = round(compile_library(library, agents), 2)
            libraries[library_name] = {**library, "seconds": [], "out": None}
        except Exception as error:
            work[f"{library_name}_error"] = failure(error)
    for repeat in range(repeats):
        spent = sum(sum(library["seconds"]) for library in libraries.values())
        if repeat > 0 and spent >= max_run_s:
            break
        order = ("ppojax", "rejax") if repeat % 2 == 0 else ("rejax", "ppojax")
        for library_name in (name for name in order if name in libraries):
            library = libraries[library_name]
            keys = keys_for(agents, repeat)
            try:
                start = time.perf_counter()
                library["out"] = jax.block_until_ready(library["run"](library["compiled"], keys))
                library["seconds"].append(time.perf_counter() - start)
            except Exception as error:
                work[f"{library_name}_error"] = failure(error)
                del libraries[library_name]
    for library_name, library in libraries.items():
        if library["seconds"]:
            work[f"{library_name}_run_s"] = [round(s, 3) for s in library["seconds"]]
            work[f"{library_name}_steps_per_s"] = round(steps / min(library["seconds"]))
    work["repeats"] = max((len(library["seconds"]) for library in libraries.values()), default=0)
    if "ppojax_steps_per_s" in work and "rejax_steps_per_s" in work:
        ratio = work["ppojax_steps_per_s"] / work["rejax_steps_per_s"]
        work["ppojax_over_rejax"] = round(ratio, 3)
    if final:
        final_returns(work, libraries, episodes)
    return work


def final_returns(work: dict, libraries: dict, episodes: int) -> None:
    """Each library's final return into ``work``, by the protocol the docstring gives."""
    work["final_return_protocol"] = (
        f"mean over agents of {episodes} sampled-action episodes of the final policy"
    )
    if libraries.get("ppojax", {}).get("out") is not None:
        returns = ppojax_returns(libraries["ppojax"]["out"])
        work["ppojax_final_return"] = returns["final"]
        work["ppojax_training_return"] = returns["training"]
    if libraries.get("rejax", {}).get("out") is not None:
        try:
            rejax = libraries["rejax"]
            key = jax.random.key(7)
            work["rejax_final_return"] = rejax_final_return(
                rejax["algo"], rejax["out"], key, episodes
            )
        except Exception as error:
            work["rejax_final_return_error"] = failure(error)


def env_ceiling(envs: int, steps: int) -> dict:
    """gymnax's CartPole alone under vmap, random actions, auto-reset included: steps/s."""
    run = env_alone(ENV_ID, envs, steps)
    start = time.perf_counter()
    compiled = jax.jit(run).lower(jax.random.key(0)).compile()
    compile_s = time.perf_counter() - start
    seconds = [timed(compiled, jax.random.key(repeat))[1] for repeat in range(3)]
    return {
        "envs": envs,
        "steps": steps,
        "compile_s": round(compile_s, 2),
        "run_s": [round(s, 4) for s in seconds],
        "steps_per_s": round(envs * steps / min(seconds)),
    }


# --------------------------------------------------------------------------------------------
# The report


def gpu_driver() -> str | None:
    try:
        found = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
        return found.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def header(argv: list[str]) -> dict[str, Any]:
    return {
        "benchmark": "gpu: ppojax vs rejax 0.1.3, CartPole-v1, PureJaxRL's classic PPO config",
        **record(__file__, argv, "rejax", "distrax"),
        "gpu": jax.devices()[0].device_kind,
        "driver": gpu_driver(),
        "notes": [
            "steps/s: env steps of all agents over the best run's seconds (run time only)",
            "rejax 0.1.3 keeps its learning rate constant; ppojax anneals it (the classic config)",
            "ppojax's timed runs of works with a final return include its one evaluation",
        ],
        "works": [],
        "ceilings": [],
    }


def plot(report: dict, path: Path) -> None:
    """Grouped bars: ppojax and rejax env steps/s per work (log scale), env ceilings dashed."""
    plt = pyplot()

    works = [work for work in report["works"] if "ppojax_steps_per_s" in work]
    if not works:
        return
    figure, axis = plt.subplots(figsize=(9, 4.2))
    positions = np.arange(len(works))
    for offset, library in ((-0.2, "ppojax"), (0.2, "rejax")):
        values = [work.get(f"{library}_steps_per_s") or 0 for work in works]
        bars = axis.bar(positions + offset, values, width=0.4, label=library)
        for bar, value in zip(bars, values, strict=True):
            if value:
                axis.annotate(
                    f"{value / 1e6:.3g}M",
                    (bar.get_x() + bar.get_width() / 2, value),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
    for ceiling in report["ceilings"]:
        if "steps_per_s" in ceiling:
            axis.axhline(ceiling["steps_per_s"], color="gray", linestyle="--", linewidth=0.8)
            axis.annotate(
                f"{ceiling['name']}: {ceiling['steps_per_s'] / 1e6:.3g}M",
                (len(works) - 0.5, ceiling["steps_per_s"]),
                ha="right",
                va="bottom",
                fontsize=7,
                color="gray",
            )
    axis.set_xticks(positions, [work["name"] for work in works], fontsize=8)
    axis.set_yscale("log")
    axis.set_ylabel("env steps / s (best run, run time only)")
    axis.legend()
    axis.set_title(
        f"CartPole-v1, classic PPO config - {report['gpu']}, jax {report['machine']['jax']}, "
        f"{report['date'][:10]}",
        fontsize=9,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    print(f"wrote {path}", flush=True)


# --------------------------------------------------------------------------------------------
# The parts beside the works

PARTS = ("works", "inside", "rlhf")
# envs of the phase split and the minibatch step; (envs, updates) of the candidate pairs
INSIDE_ENVS, SMOKE_INSIDE_ENVS = (8192, 65536), (16,)
CANDIDATE_WORKS = ((4, 100), (8192, 20), (65536, 8))
SMOKE_CANDIDATE_WORKS = ((4, 2),)


def kept_sections(report: dict, args: argparse.Namespace) -> dict:
    """``report`` over an existing ``--out``: the sections of the parts not run are kept, the
    header (date, versions) is this run's, and so are the works unless ``works`` runs."""
    if not args.out.exists():
        return report
    kept = json.loads(args.out.read_text())
    if "works" not in args.parts:
        report["works"] = kept.get("works", [])
        report["ceilings"] = kept.get("ceilings", [])
        report["works_date"] = kept.get("works_date", kept.get("date"))
        report["works_command"] = kept.get("works_command", kept.get("command"))
    for part in ("inside", "rlhf"):
        if part not in args.parts and part in kept:
            report[part] = kept[part]
    return report


def inside_rows(smoke: bool, rows: list[dict], saved: Callable[[], None]) -> None:
    """benchmarks/gpu_parts.py's rows into ``rows``, each saved as it comes: phases and
    minibatch steps, then the candidates."""
    import gpu_parts

    def add(row: dict) -> None:
        rows.append(row)
        saved()
        print(json.dumps(row), flush=True)

    def add_guarded(measure: Callable[[], dict], about: dict) -> None:
        try:
            add(measure())
        except Exception as error:  # a candidate that fails there leaves the others' rows
            add({**about, "error": failure(error)})

    for envs in SMOKE_INSIDE_ENVS if smoke else INSIDE_ENVS:
        add(gpu_parts.phases(envs, repeats=2 if smoke else 5))
        steps = [((), None)] + [(("pallas_ppo_loss",), tile) for tile in gpu_parts.PALLAS_TILES]
        for names, tile in steps[:2] if smoke else steps:
            add_guarded(
                functools.partial(gpu_parts.minibatch_step, envs, 3 if smoke else 20, names, tile),
                {"candidates": list(names), "tile": tile, "envs": envs},
            )
    pairs = 1 if smoke else 3
    for envs, updates in SMOKE_CANDIDATE_WORKS if smoke else CANDIDATE_WORKS:
        for names in gpu_parts.candidate_sets():
            add_guarded(
                functools.partial(gpu_parts.candidate_pair, envs, updates, names, pairs),
                {"candidates": list(names), "envs": envs},
            )


def rlhf_rows(smoke: bool, rows: list[dict], saved: Callable[[], None]) -> None:
    import rlhf_speed

    rows.extend(rlhf_speed.rlhf_step_times(smoke=smoke))
    saved()


def measure_part(part: str, report: dict, args: argparse.Namespace, argv: list[str]) -> int:
    """Run ``part`` into ``report[part]``, saved as its rows come (a timeout keeps those
    measured); 1 if it failed (its error recorded)."""
    section: dict[str, Any] = {
        "date": now(),
        "gpu": report["gpu"],
        "command": report["command"],
        "rows": [],
    }
    report[part] = section
    began = time.perf_counter()

    def saved() -> None:
        section["wall_s"] = round(time.perf_counter() - began, 1)
        write_json(args.out, report, args.mirror)

    try:
        (inside_rows if part == "inside" else rlhf_rows)(args.smoke, section["rows"], saved)
    except Exception as error:  # the other parts go on
        section["error"] = failure(error)
    saved()
    return 1 if "error" in section else 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=["works"])
    parser.add_argument("--works", nargs="+", choices=list(WORKS), default=list(WORKS))
    parser.add_argument("--no-ceilings", action="store_true")
    parser.add_argument("--out", type=Path, help=f"the JSON (default {DEFAULT_OUT})")
    parser.add_argument("--mirror", type=Path, help="also copy the JSON and PNG into this folder")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, results in /tmp")
    args = parser.parse_args(argv)
    args.out = result_path(args.out, args.smoke, DEFAULT_OUT.name)
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    works = SMOKE_WORKS if args.smoke else WORKS
    ceilings = SMOKE_CEILINGS if args.smoke else CEILINGS
    episodes = 2 if args.smoke else EVAL_EPISODES
    report = header(argv)
    machine = report["machine"]
    print(
        f"{report['gpu']} ({machine['backend']}), driver {report['driver']}, jax {machine['jax']}"
    )
    report = kept_sections(report, args)
    failed = 0
    for part in ("inside", "rlhf"):
        if part in args.parts:
            failed += measure_part(part, report, args, argv)
    if "works" not in args.parts:
        print(f"wrote {args.out}", flush=True)
        return 1 if failed else 0
    # the ceilings first: seconds in all, so a part cut off by its timeout still has them
    for name, (envs, steps) in ({} if args.no_ceilings else ceilings).items():
        try:
            ceiling = {"name": name, **env_ceiling(envs, steps)}
        except Exception as error:
            ceiling = {"name": name, "error": failure(error)}
            failed += 1
        report["ceilings"].append(ceiling)
        write_json(args.out, report, args.mirror)
        print(json.dumps(ceiling), flush=True)
    for name in args.works:
        began = time.perf_counter()
        try:
            work = measure_work(name, works[name], episodes)
        except Exception as error:  # one work's failure must not lose the others
            work = {"name": name, "error": failure(error)}
        failed += any(key.endswith("error") for key in work)
        work["wall_s"] = round(time.perf_counter() - began, 1)
        report["works"].append(work)
        write_json(args.out, report, args.mirror)
        print(json.dumps(work), flush=True)
    figure = args.out.with_suffix(".png")
    plot(report, figure)
    if args.mirror is not None and figure.exists():
        (args.mirror / figure.name).write_bytes(figure.read_bytes())
    print(f"wrote {args.out}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
