"""Pendulum-v1's best achievable return: finite-horizon value iteration on a grid.

    python benchmarks/pendulum_optimum.py [--angles 301] [--velocities 241] [--torques 41]
        [--episodes 2000] [--out benchmarks/results/pendulum_optimum.json]

The learning table compares ppojax's Pendulum preset with gymnax-blines' published -130; this
bounds what any policy can score. gymnax's Pendulum-v1 (the same as Gym's): 200 steps, reward
-(angle^2 + 0.1 velocity^2 + 0.001 torque^2), starts uniform in [-pi, pi] x [-1, 1]. The
value V_k(angle, velocity) of k steps to go is computed for k = 1..200 on a grid (bilinear
interpolation between points, the angle periodic) over a grid of torques in [-2, 2]; the
greedy policy of those values then plays ``--episodes`` episodes from uniform starts in the
exact dynamics, and the file keeps their mean return, its standard error, and the means a
finer grid gives (so the grid's error shows). A grid policy is a lower bound on the optimum;
the values at the starts are an estimate of it. NumPy only.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import shlex
import sys
import time
from pathlib import Path

import numpy as np
from machine import machine_description

RESULTS = Path(__file__).resolve().parent / "results"
GRAVITY, MASS, LENGTH, DT, MAX_SPEED, MAX_TORQUE, STEPS = 10.0, 1.0, 1.0, 0.05, 8.0, 2.0, 200


def wrap(angle: np.ndarray) -> np.ndarray:
    """The angle in [-pi, pi), as the reward's angle_normalize."""
    return (angle + np.pi) % (2 * np.pi) - np.pi


def step(angle: np.ndarray, velocity: np.ndarray, torque: np.ndarray | float):
    """gymnax's Pendulum-v1 step: (next angle, next velocity, reward)."""
    reward = -(wrap(angle) ** 2 + 0.1 * velocity**2 + 0.001 * np.square(torque))
    accel = 3 * GRAVITY / (2 * LENGTH) * np.sin(angle) + 3.0 / (MASS * LENGTH**2) * torque
    velocity = np.clip(velocity + accel * DT, -MAX_SPEED, MAX_SPEED)
    return angle + velocity * DT, velocity, reward


class Grid:
    """Bilinear interpolation of values on angles [-pi, pi] x velocities [-8, 8]."""

    def __init__(self, angles: int, velocities: int):
        self.shape = (angles, velocities)
        self.angle = np.linspace(-np.pi, np.pi, angles)
        self.velocity = np.linspace(-MAX_SPEED, MAX_SPEED, velocities)

    def __call__(self, values: np.ndarray, angle: np.ndarray, velocity: np.ndarray):
        rows, cols = self.shape
        fi = (wrap(angle) + np.pi) / (2 * np.pi) * (rows - 1)
        fj = (velocity + MAX_SPEED) / (2 * MAX_SPEED) * (cols - 1)
        i = np.clip(np.floor(fi).astype(int), 0, rows - 2)
        j = np.clip(np.floor(fj).astype(int), 0, cols - 2)
        a, b = fi - i, fj - j
        return (
            (1 - a) * (1 - b) * values[i, j]
            + a * (1 - b) * values[i + 1, j]
            + (1 - a) * b * values[i, j + 1]
            + a * b * values[i + 1, j + 1]
        )


def value_iteration(grid: Grid, torques: np.ndarray) -> list[np.ndarray]:
    """[V_0, ..., V_200] on the grid, V_k the best return of k steps to go."""
    angle, velocity = np.meshgrid(grid.angle, grid.velocity, indexing="ij")
    moves = [step(angle, velocity, torque) for torque in torques]
    values = [np.zeros(grid.shape)]
    for _ in range(STEPS):
        q = [reward + grid(values[-1], a, v) for a, v, reward in moves]
        values.append(np.max(q, axis=0))
    return values


def play(grid: Grid, values: list[np.ndarray], torques: np.ndarray, starts: np.ndarray):
    """Returns [N] of the greedy policy of ``values`` from ``starts`` [N, 2]."""
    angle, velocity = starts[:, 0].copy(), starts[:, 1].copy()
    total = np.zeros(len(angle))
    for t in range(STEPS):
        to_go = values[STEPS - t - 1]
        q = [
            reward + grid(to_go, a, v)
            for a, v, reward in (step(angle, velocity, u) for u in torques)
        ]
        torque = torques[np.argmax(q, axis=0)]
        angle, velocity, reward = step(angle, velocity, torque)
        total += reward
    return total


def solve(angles: int, velocities: int, torques: int, starts: np.ndarray) -> dict:
    grid, actions = Grid(angles, velocities), np.linspace(-MAX_TORQUE, MAX_TORQUE, torques)
    start = time.perf_counter()
    values = value_iteration(grid, actions)
    returns = play(grid, values, actions, starts)
    estimate = grid(values[STEPS], starts[:, 0], starts[:, 1])
    return {
        "grid": {"angles": angles, "velocities": velocities, "torques": torques},
        "greedy_return_mean": round(float(returns.mean()), 2),
        "greedy_return_std": round(float(returns.std()), 2),
        "greedy_return_stderr": round(float(returns.std() / math.sqrt(len(returns))), 2),
        "value_at_starts_mean": round(float(estimate.mean()), 2),
        "seconds": round(time.perf_counter() - start, 1),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--angles", type=int, default=301)
    parser.add_argument("--velocities", type=int, default=241)
    parser.add_argument("--torques", type=int, default=41)
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "pendulum_optimum.json")
    args = parser.parse_args(argv)
    starts = np.random.default_rng(args.seed).uniform(
        [-np.pi, -1.0], [np.pi, 1.0], size=(args.episodes, 2)
    )
    runs = [solve(args.angles, args.velocities, args.torques, starts)]
    # a grid about 1.5x finer each way: how far the grid's own error moves the result
    finer = (args.angles * 3 // 2 | 1, args.velocities * 3 // 2 | 1, args.torques * 2 - 1)
    runs.append(solve(*finer, starts))
    for run in runs:
        print(json.dumps(run), flush=True)
    result = {
        "benchmark": "pendulum_optimum",
        "description": __doc__.splitlines()[0],
        "env": "Pendulum-v1 (gymnax): 200 steps, starts uniform in [-pi, pi] x [-1, 1]",
        "episodes": args.episodes,
        "runs": runs,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_description(),
        "numpy": np.__version__,
        "command": shlex.join(["python", "benchmarks/pendulum_optimum.py", *argv]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
