"""What a user waits for: import time, CLI startup, and `ppojax train` end to end, cold and warm.

    python benchmarks/startup.py [--repeats 5] [--before PATH] [--tag cpu-2core]

Every figure is a fresh process's wall clock, as a user sees it:

- ``import ppojax`` and ``import jax`` (median of ``--repeats`` processes), and
  ``ppojax --help`` (CLI startup: arguments parsed, nothing trained). With ``--before PATH``
  (a checkout of an older ppojax, e.g. ``git worktree add /tmp/before <commit>``) the same
  import is timed for that tree, first on ``PYTHONPATH``.
- ``ppojax train CartPole-v1 --seeds 4`` twice with an empty compilation cache folder
  (``XDG_CACHE_HOME`` pointed at a fresh temporary folder): the first run compiles and fills
  the cache, the second loads its programs from there. Each run's own summary line
  (compile s, run s) is recorded beside its wall clock.
- rejax 0.1.3 (the ``bench`` extra) training the same config (4 seeds, vmapped) in a fresh
  process: import, compile, run and wall clock, for the comparison the wall clock of a first
  ``ppojax train`` is measured against.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import report_header, write_report  # noqa: E402

SUMMARY = re.compile(r"compile ([\d.]+) s, run ([\d.]+) s, ([\d,]+) env steps/s")

REJAX_SCRIPT = """
import time
start = time.perf_counter()
import jax
import gymnax
from rejax import PPO
sys_path = __import__("sys").path
sys_path.insert(0, {benchmarks!r})
from compare import legacy_step_env
imported = time.perf_counter()
env, env_params = gymnax.make("CartPole-v1")
algo = PPO.create(
    env=legacy_step_env(env), env_params=env_params, num_envs=4, num_steps=128, num_epochs=4,
    num_minibatches=4, total_timesteps=499_712, eval_freq=499_712,
    skip_initial_evaluation=True, learning_rate=2.5e-4, max_grad_norm=0.5, gamma=0.99,
    gae_lambda=0.95, clip_eps=0.2, ent_coef=0.01, vf_coef=0.5,
    agent_kwargs={{"activation": "tanh", "hidden_layer_sizes": (64, 64)}},
)
algo = algo.replace(eval_callback=lambda algo, ts, key: jax.numpy.zeros(()))
keys = jax.random.split(jax.random.key(0), 4)
train = jax.jit(jax.vmap(algo.train))
compile_start = time.perf_counter()
compiled = train.lower(keys).compile()
compiled_at = time.perf_counter()
jax.block_until_ready(compiled(keys))
done = time.perf_counter()
print(__import__("json").dumps({{"import_s": imported - start,
      "compile_s": compiled_at - compile_start, "run_s": done - compiled_at,
      "in_process_s": done - start}}))
"""


def wall(command: list[str], env: dict[str, str] | None = None, cwd: str | None = None):
    """(seconds, stdout) of one process, which must succeed."""
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, check=False)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} failed:\n{result.stderr[-3000:]}")
    return seconds, result.stdout


def median_wall(command: list[str], repeats: int, env: dict[str, str] | None = None) -> dict:
    # From a neutral folder: ``python -c`` puts the current folder first on sys.path, ahead of
    # PYTHONPATH, so run from a checkout it would import that checkout's ppojax.
    seconds = [wall(command, env, cwd=tempfile.gettempdir())[0] for _ in range(repeats)]
    return {
        "median_s": round(statistics.median(seconds), 3),
        "runs_s": [round(s, 3) for s in seconds],
    }


def train_runs(
    ppojax_bin: str, workdir: Path, launcher: Sequence[str] = (), flags: Sequence[str] = ()
) -> list[dict]:
    """``ppojax train CartPole-v1 --seeds 4`` twice on one fresh compilation cache, started
    through ``launcher`` (a command prefix) when given, with ``flags`` added."""
    cache_home = Path(tempfile.mkdtemp(prefix="xdg-cache-", dir=workdir))
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home)}
    env.pop("PPOJAX_NO_COMPILE_CACHE", None)
    command = [*launcher, ppojax_bin, "train", "CartPole-v1", "--seeds", "4", *flags]
    command += ["--out", str(workdir / "runs")]
    runs = []
    for name in ("first (empty cache)", "second (warm cache)"):
        seconds, out = wall(command, env)
        match = SUMMARY.search(out)
        runs.append(
            {
                "run": name,
                "wall_s": round(seconds, 2),
                "compile_s": float(match.group(1)) if match else None,
                "train_s": float(match.group(2)) if match else None,
                "env_steps_per_s": int(match.group(3).replace(",", "")) if match else None,
                "summary_line": match.group(0) if match else None,
            }
        )
        print(json.dumps(runs[-1]), flush=True)
    return runs


def rejax_run(workdir: Path) -> dict:
    script = REJAX_SCRIPT.format(benchmarks=str(Path(__file__).resolve().parent))
    seconds, out = wall([sys.executable, "-c", script], cwd=str(workdir))
    inner = json.loads(out.strip().splitlines()[-1])  # the dict the script printed
    result = {"wall_s": round(seconds, 2), **{k: round(v, 2) for k, v in inner.items()}}
    print(json.dumps({"rejax": result}), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--before", type=Path, help="an older ppojax checkout to time beside")
    parser.add_argument("--skip-rejax", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--tag", default="cpu-2core", help="file name suffix")
    parser.add_argument("--note", default="", help="recorded in the JSON (e.g. machine load)")
    args = parser.parse_args()
    python = sys.executable
    ppojax_bin = str(Path(python).with_name("ppojax"))
    report = {
        **report_header("startup"),
        "note": args.note,
        "import_jax": median_wall([python, "-c", "import jax"], args.repeats),
        "import_ppojax": median_wall([python, "-c", "import ppojax"], args.repeats),
        "cli_help": median_wall([ppojax_bin, "--help"], args.repeats),
    }
    if args.before:
        env = {**os.environ, "PYTHONPATH": str(args.before.resolve())}
        report["import_ppojax_before"] = {
            "tree": str(args.before),
            **median_wall([python, "-c", "import ppojax"], args.repeats, env),
        }
    print(json.dumps({k: v for k, v in report.items() if k.startswith(("import", "cli"))}))
    with tempfile.TemporaryDirectory(prefix="ppojax-startup-") as workdir:
        report["train_cartpole_4_seeds"] = train_runs(ppojax_bin, Path(workdir))
        if not args.skip_rejax:
            report["rejax_cartpole_4_seeds"] = rejax_run(Path(workdir))
    write_report(report, args.out / f"startup-{args.tag}.json")


if __name__ == "__main__":
    main()
