"""Settings of the continuous-control presets, one change at a time.

    python benchmarks/exploration.py [--seeds 4] [--out benchmarks/results/exploration.json]

The learning table's MountainCarContinuous and Pendulum rows (benchmarks/learning.py) use
their presets; this trains the same presets, 4 seeds vmapped at the same 1M budget, with one
change each, for the presets' comments and the docs of the fields they change:
``action_noise_correlation`` (0.0 is white noise; MountainCarContinuous's preset has 0.95),
``state_dependent_std`` (gymnax-blines' Gaussian policy), and Pendulum's earlier gamma 0.95
and clip 0.2. Each row is the one
``learning.run_task`` makes (final evaluation per seed and its mean, the curves) with the
change beside it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
from pathlib import Path
from typing import Any

import learning

VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("MountainCarContinuous-v0", {"action_noise_correlation": 0.0}),
    (
        "MountainCarContinuous-v0",
        {"action_noise_correlation": 0.0, "state_dependent_std": True, "init_log_std": 0.5},
    ),
    ("Pendulum-v1", {"action_noise_correlation": 0.5}),
    ("Pendulum-v1", {"state_dependent_std": True}),
    ("Pendulum-v1", {"gamma": 0.95, "clip_eps": 0.2}),
]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--out", type=Path, default=learning.RESULTS / "exploration.json")
    args = parser.parse_args(argv)
    rows = []
    for task, changes in VARIANTS:
        row = learning.run_task(task, args.seeds, None, 0, changes)
        row["changes"] = changes
        print(f"{changes}: {learning.describe(row)}", flush=True)
        rows.append(row)
    result = {
        "benchmark": "exploration",
        "description": __doc__.splitlines()[0],
        "rows": rows,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": learning.machine(),
        "versions": learning.versions(),
        "command": shlex.join(["python", "benchmarks/exploration.py", *argv]),
    }
    learning.write_atomic(args.out, json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
