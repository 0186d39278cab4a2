"""SFT then RL on both shipped text envs from the shell: ``ppojax rlhf --env ID --sft-steps N``
as a user types it, held-out success before SFT, after SFT and after RL read from each run
folder's summary.json.

    python benchmarks/agents_shell.py                 # both envs, seeds 0 and 1
    python benchmarks/agents_shell.py --toy --out /tmp/agents_shell.json   # the test's sizes
    python benchmarks/agents_shell.py --algorithm ppo # the same with PPO: agents_shell_ppo.json
    python benchmarks/agents_shell.py --table         # the markdown table of the result file

The sizes are benchmarks/agents_sft.py's, which learned through the Python API: a 2-layer
transformer of width 64 from random weights, 300 SFT steps on 64 demonstrations of the
guessing game (10 values, 4 turns) or 192 of the calculator (3-digit sums, 3 turns), then
GRPO for 200 or 100 steps of 8 resets x 8 episodes at learning rate 3e-4; 512 held-out
episodes, sampled. ``--algorithm ppo`` trains PPO instead at agents_sft.py's PPO sizes: 64
resets of one episode a step, a critic (the SFT model with a zeroed value head) trained alone
for the first 10 steps, into benchmarks/results/agents_shell_ppo.json. Each run is its own
process (``python -m ppojax rlhf``), timed whole, compile included. The result file
(benchmarks/results/agents_shell.json) keeps each run's command, its seconds and its three
held-out rows, and whether RL beat SFT on every seed.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common

RESULT = common.RESULTS / "agents_shell.json"
RESULT_PPO = common.RESULTS / "agents_shell_ppo.json"
SHARED = ["--sft-steps", "300", "--d-model", "64", "--num-heads", "4", "--num-layers", "2",
          "--learning-rate", "3e-4", "--batch-size", "8", "--group-size", "8",
          "--eval-episodes", "512"]  # fmt: skip
ENVS = {
    "guessing": ["--env", "guessing", "--env-arg", "num_values=10", "--turns", "4",
                 "--sft-demos", "64", "--steps", "200"],
    "calculator": ["--env", "calculator", "--env-arg", "num_digits=3", "--turns", "3",
                   "--turn-len", "9", "--sft-demos", "192", "--steps", "100"],
}  # fmt: skip
# --toy's sizes, after the full ones: argparse keeps a flag's last value
TOY = ["--sft-steps", "3", "--sft-demos", "8", "--steps", "2", "--batch-size", "2",
       "--group-size", "2", "--eval-episodes", "8", "--d-model", "16",
       "--num-layers", "1"]  # fmt: skip
# agents_sft.py's PPO sizes: as many episodes a step as GRPO's 8 x 8, one per reset (PPO's
# baseline is the critic, not a group), the critic warmed up alone first
PPO = ["--algorithm", "ppo", "--batch-size", "64", "--group-size", "1",
       "--critic-warmup-steps", "10"]  # fmt: skip
PPO_TOY = ["--group-size", "1", "--critic-warmup-steps", "1"]
STAGES = {"held_out_start": "start", "held_out_sft": "sft", "held_out": "rl"}


def run_flags(env: str, seed: int, toy: bool, algorithm: str = "grpo") -> list[str]:
    """The ``ppojax rlhf`` flags of one run (later flags override earlier ones)."""
    ppo = algorithm == "ppo"
    sizes = [*(PPO if ppo else []), *(TOY if toy else []), *(PPO_TOY if ppo and toy else [])]
    return [*ENVS[env], *SHARED, *sizes, "--seed", str(seed)]


def run_once(env: str, seed: int, toy: bool, work: Path, algorithm: str = "grpo") -> dict[str, Any]:
    """One ``ppojax rlhf`` run of ``env`` at ``seed`` into ``work``: its command, seconds and
    held-out rows (success, return, turns at each stage)."""
    flags = run_flags(env, seed, toy, algorithm)
    command = [sys.executable, "-m", "ppojax", "rlhf", *flags, "--no-progress", "--out", str(work)]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=common.ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"ppojax rlhf {shlex.join(flags)} exited {done.returncode}: "
                           f"{done.stderr.strip().splitlines()[-1:]}")  # fmt: skip
    printed = done.stdout.splitlines()
    run_dir = Path(next(line for line in printed if line.startswith("run folder: ")).split(": ")[1])
    summary = json.loads((run_dir / "summary.json").read_text())
    held_out = {
        name: {key: summary[part][key] for key in ("success", "return", "turns")}
        for part, name in STAGES.items()
    }
    return {
        "env": env,
        "seed": seed,
        "command": shlex.join(["ppojax", "rlhf", *flags]),
        "seconds": round(seconds, 1),
        "success_rule": summary["held_out"]["success_rule"],
        "episodes": summary["held_out"]["episodes"],
        "held_out": held_out,
        "printed": printed[1:],
    }


def table(result: dict[str, Any]) -> str:
    """The markdown table of a result file: success (and turns) at each stage, per run."""
    header = ["env", "seed", "success at step 0", "after SFT", "after RL", "turns after SFT",
              "after RL", "seconds"]  # fmt: skip
    rows = []
    for run in result["runs"]:
        stage = run["held_out"]
        rows.append([run["env"], run["seed"], f"{stage['start']['success']:.3f}",
                     f"{stage['sft']['success']:.3f}", f"{stage['rl']['success']:.3f}",
                     f"{stage['sft']['turns']:.2f}", f"{stage['rl']['turns']:.2f}",
                     f"{run['seconds']:.0f}"])  # fmt: skip
    return common.markdown_table(header, rows)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2, help="seeds 0..N-1 (2)")
    parser.add_argument("--envs", nargs="+", choices=list(ENVS), default=list(ENVS))
    parser.add_argument("--algorithm", choices=("grpo", "ppo"), default="grpo")
    parser.add_argument(
        "--out", type=Path, help="the result file (agents_shell.json; ppo: agents_shell_ppo.json)"
    )
    parser.add_argument("--work", type=Path, help="keep the run folders here (a temp folder)")
    parser.add_argument("--toy", action="store_true", help="the test's sizes, a few steps")
    parser.add_argument("--table", action="store_true", help="print --out's table and stop")
    args = parser.parse_args(argv)
    args.out = args.out or (RESULT_PPO if args.algorithm == "ppo" else RESULT)
    if args.table:
        print(table(json.loads(args.out.read_text())))
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        work = args.work or Path(scratch)
        runs = [run_once(env, seed, args.toy, work, args.algorithm) for env in args.envs
                for seed in range(args.seeds)]  # fmt: skip
    learned = {
        env: all(r["held_out"]["rl"]["success"] > r["held_out"]["sft"]["success"]
                 for r in runs if r["env"] == env)
        for env in args.envs
    }  # fmt: skip
    result = {
        **common.record(__file__, argv),
        "description": __doc__.split("\n\n")[0].replace("\n", " "),
        "algorithm": args.algorithm,
        "runs": runs,
        "rl_beats_sft_on_every_seed": learned,
    }
    common.write_json(args.out, result)
    print(table(result))
    print(f"RL beat SFT on every seed: {learned}; {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
