"""Soak test of crash safety: SIGKILL a checkpointing ``ppojax train`` at random moments, each
time followed by ``--resume``, and compare the end with an uninterrupted run.

    python benchmarks/soak.py [--kills 20] [--updates 400] [--seed 0] [--tag cpu-2core]

The run is CartPole, 4 envs x 16 steps, 2 epochs x 2 minibatches, a 16-unit network, a
checkpoint every 2 updates (the newest 3 kept), ``--no-progress``: mostly checkpoint writes,
so that kills land in them. Each attempt starts the run (the first) or resumes it, waits until
it has completed one checkpoint past the one it resumed from (so that every attempt makes
progress), then waits a random 0-``--window`` seconds more and sends SIGKILL; then the
next attempt resumes. After ``--kills`` kills a last ``--resume`` runs to the end. Its final
checkpoint (every array, parameters and PRNG keys included) and metrics.csv must equal, bit
for bit, those of the same command run once without kills: both run the same compiled chunk
program. Every process shares JAX's persistent compilation cache (``--no-cache`` turns it
off): on a loaded 2-core machine a fresh start compiles for minutes, and the cached executable
is the same program, so the comparison is unchanged. Too slow for the test suite (a start per
kill); tests/test_cli.py kills one run once. Results go to
``benchmarks/results/soak-<tag>.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
from ppojax.experiment import read_experiment, state_template

from ppojax.runs import checkpoints, folder

MACHINE = "2-core AMD EPYC CPU, shared with other jobs"


def train_command(updates: int, out: Path) -> list[str]:
    """The checkpointing CLI run that is killed: ``updates`` updates of 64 env steps."""
    return [
        sys.executable,
        "-m",
        "ppojax",
        "train",
        "CartPole-v1",
        *("--num-envs", "4", "--num-steps", "16", "--total-timesteps", str(64 * updates)),
        *("--update-epochs", "2", "--num-minibatches", "2", "--hidden-sizes", "16"),
        *("--checkpoint-every", "2", "--keep-checkpoints", "3", "--no-progress"),
        *("--out", str(out)),
    ]


def complete_steps(run_dir: Path | None) -> list[int]:
    """Steps of the checkpoints whose save finished (their manifest is written)."""
    if run_dir is None:
        return []
    ckpt_dir = run_dir / folder.CHECKPOINT_DIR
    return sorted(
        int(path.name)
        for path in ckpt_dir.glob("*")
        if path.name.isdigit() and (path / checkpoints.MANIFEST_FILE).exists()
    )


def saves_in_flight(run_dir: Path) -> list[str]:
    """What a kill left half-written: orbax temporary folders and steps without a manifest."""
    ckpt_dir = run_dir / folder.CHECKPOINT_DIR
    if not ckpt_dir.is_dir():
        return []
    return sorted(
        path.name
        for path in ckpt_dir.iterdir()
        if path.is_dir() and not (path / checkpoints.MANIFEST_FILE).exists()
    )


def cached_env(cache: Path | None) -> dict[str, str]:
    """The environment for the CLI processes: JAX's persistent compilation cache in ``cache``
    for every compiled function, however quick to compile (None: no cache). The CLI's own
    cache in the user's ckpt_dir stays off, so the soak never writes there."""
    environment = {**os.environ, "PPOJAX_NO_COMPILE_CACHE": "1"}
    if cache is None:
        return environment
    return {
        **environment,
        "JAX_COMPILATION_CACHE_DIR": str(cache),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }


def attempt(
    command: list[str],
    out: Path,
    run_dir: Path | None,
    window: float,
    rng: random.Random,
    env: dict[str, str],
) -> tuple[dict[str, Any], Path | None]:
    """Start (or resume) the run, kill it once it has made progress plus a random delay."""
    start_steps = complete_steps(run_dir)
    begin = time.monotonic()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    while process.poll() is None:
        run_dir = run_dir or next(iter(out.iterdir()), None)
        steps = complete_steps(run_dir)
        if steps and (not start_steps or steps[-1] > start_steps[-1]):
            break
        time.sleep(0.005)
    delay = rng.uniform(0.0, window)
    time.sleep(delay)
    killed = process.poll() is None
    if killed:
        process.send_signal(signal.SIGKILL)
    _, stderr = process.communicate()
    run_dir = run_dir or next(iter(out.iterdir()))
    row = {
        "killed": killed,
        "seconds_alive": round(time.monotonic() - begin, 3),
        "random_delay_s": round(delay, 3),
        "resumed_from": start_steps[-1] if start_steps else None,
        "newest_complete_checkpoint": (complete_steps(run_dir) or [None])[-1],
        "left_half_written": saves_in_flight(run_dir),
        "warnings": [line for line in stderr.splitlines() if line.startswith("ppojax: warning")],
        "returncode": process.returncode,
    }
    if not killed and process.returncode != 0:
        raise RuntimeError(f"the run failed instead of being killed:\n{stderr}")
    return row, run_dir


def final_arrays(run_dir: Path) -> list[np.ndarray]:
    """Every leaf of the final checkpoint (PRNG keys as their data)."""
    experiment, _ = read_experiment(run_dir)
    state, _ = checkpoints.restore_checkpoint(run_dir, state_template(experiment))
    return [np.asarray(leaf) for leaf in jax.tree.leaves(checkpoints.to_savable(state))]


def same_end(run_dir: Path, reference: Path) -> dict[str, bool]:
    """Whether the final checkpoint and metrics.csv equal the reference run's, bit for bit."""
    pairs = zip(final_arrays(run_dir), final_arrays(reference), strict=True)
    arrays = all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in pairs)
    metrics = (run_dir / folder.METRICS_FILE).read_bytes() == (
        reference / folder.METRICS_FILE
    ).read_bytes()
    return {"final_arrays_equal": arrays, "metrics_csv_equal": metrics}


def soak(kills: int, updates: int, window: float, seed: int, work: Path, cache: bool) -> dict:
    """Run the reference, then the killed run with ``kills`` kills and a last resume."""
    rng = random.Random(seed)
    env = cached_env(work / "jax-cache" if cache else None)
    begin = time.monotonic()
    whole = subprocess.run(
        train_command(updates, work / "whole"), capture_output=True, text=True, env=env
    )
    if whole.returncode != 0:
        raise RuntimeError(whole.stderr)
    whole_seconds = time.monotonic() - begin
    out = work / "killed"
    out.mkdir()
    command, run_dir, rows = train_command(updates, out), None, []
    while sum(row["killed"] for row in rows) < kills:
        row, run_dir = attempt(command, out, run_dir, window, rng, env)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if not row["killed"]:
            break  # it finished before the kill: no more kills possible
        command = [sys.executable, "-m", "ppojax", "train", "--resume", str(run_dir)]
        command.append("--no-progress")
    if rows[-1]["killed"]:
        last = subprocess.run(command, capture_output=True, text=True, env=env)
        if last.returncode != 0:
            raise RuntimeError(last.stderr)
    summary = folder.read_json(run_dir / folder.SUMMARY_FILE)
    return {
        "kills_asked": kills,
        "kills_delivered": sum(row["killed"] for row in rows),
        "kills_during_a_save": sum(bool(row["left_half_written"]) for row in rows),
        "checkpoints_passed_over": sum(len(row["warnings"]) for row in rows),
        "uninterrupted_seconds": round(whole_seconds, 1),
        "soak_seconds": round(time.monotonic() - begin - whole_seconds, 1),
        "last_resume_from_update": summary["resumed_from_update"],
        **same_end(run_dir, next((work / "whole").iterdir())),
        "attempts": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs to deliver (20)")
    parser.add_argument("--updates", type=int, default=400, help="updates of the run (400)")
    parser.add_argument("--window", type=float, default=1.0, help="random delay bound, s (1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random delays")
    parser.add_argument("--tag", default="cpu-2core", help="results/soak-<tag>.json")
    parser.add_argument("--no-cache", action="store_true", help="no compilation cache")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        cache = not args.no_cache
        result = soak(args.kills, args.updates, args.window, args.seed, Path(work), cache)
    result = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": MACHINE,
        "command": "python benchmarks/soak.py " + " ".join(sys.argv[1:]),
        "run": " ".join(train_command(args.updates, Path("OUT"))[3:]),
        "compilation_cache": not args.no_cache,
        **result,
    }
    path = Path(__file__).parent / "results" / f"soak-{args.tag}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({key: value for key, value in result.items() if key != "attempts"}, indent=2))
    if not (result["final_arrays_equal"] and result["metrics_csv_equal"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
