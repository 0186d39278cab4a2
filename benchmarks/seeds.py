"""Seed robustness: each classic preset over 16 fresh seeds, its worst seed and the seeds that
never learn.

    python benchmarks/seeds.py [--tasks Pendulum-v1 ...] [--seeds 16] [--seed 5603]
        [--total-timesteps N] [--out benchmarks/results/seeds.json]

A mean over 4 seeds hides a preset that fails on one seed in four. Each task trains as
benchmarks/learning.py trains it (its preset at its budget, seeds vmapped), over keys split
from one that no test and no preset's tuning used (``--seed`` 5603). Per task the JSON keeps
each seed's final return (the final evaluation where the preset evaluates, else the training
return of the last 5% of updates, as learning.json's headline), their mean, the worst seed, a
uniformly random policy's mean return (measured here over RANDOM_EPISODES episodes), the
published return, the midpoint between the two, the seeds that end below it (seeds that never
learn), each seed's evaluation curve and final entropy (a collapsed std shows there). Each
task's row, with its date, machine, versions and command, replaces that task's old row as
soon as it finishes. The learning table's other rows are listed as not run, with the reason:
MinAtar (10M steps), Brax and Craftax need a GPU for 16 seeds, and the grid worlds have no
published return to set a midpoint.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import learning
import numpy as np
from common import RESULTS, merge_row, read_rows, record, rounded, write_json

DEFAULT_OUT = RESULTS / "seeds.json"
CLASSIC = (
    "CartPole-v1",
    "Acrobot-v1",
    "Pendulum-v1",
    "MountainCarContinuous-v0",
    "MountainCar-v0",
)
FRESH_SEED = 5603  # no test, preset comment or learning.json row uses keys from it
RANDOM_EPISODES = 256
GPU_REASON = "needs a GPU: 16 seeds at this budget take hours on a 2-core CPU"
UNPUBLISHED_REASON = "no published return, so no midpoint to count seeds against"


def random_return(env_id: str, key: Any, episodes: int = RANDOM_EPISODES) -> float:
    """The mean return of ``episodes`` whole episodes of uniformly random actions (each action
    of a Discrete space equally likely; a Box action uniform between its bounds)."""
    import jax

    from ppojax.envs import make_env
    from ppojax.ppo.evaluation import run_episodes

    env = make_env(env_id)
    spec = env.spec

    def act(obs: Any, hidden: Any, act_key: Any, **_: Any) -> tuple[Any, Any]:
        count = jax.tree.leaves(obs)[0].shape[0]
        if spec.discrete:
            return jax.random.randint(act_key, (count,), 0, spec.action_dim), hidden
        low, high = np.asarray(spec.action_low), np.asarray(spec.action_high)
        shape = (count, spec.action_dim)
        return jax.random.uniform(act_key, shape, minval=low, maxval=high), hidden

    stats = jax.jit(lambda k: run_episodes(env, act, k, episodes, deterministic=False))(key)
    return float(np.mean(np.asarray(stats.returns)))


def robustness(finals: list[float], random: float, published: float | None) -> dict[str, Any]:
    """Mean, worst seed, the midpoint between the random and the published return, and the
    seeds below it (none counted without a published return)."""
    values = np.asarray(finals, np.float64)
    midpoint = None if published is None else (random + published) / 2
    below = [] if midpoint is None else [int(i) for i in np.flatnonzero(values < midpoint)]
    return {
        "mean": rounded(values.mean(), 2),
        "worst": rounded(values.min(), 2),
        "worst_seed": int(values.argmin()),
        "random_return": rounded(random, 2),
        "midpoint": None if midpoint is None else rounded(midpoint, 2),
        "never_learn": len(below),
        "never_learn_seeds": below,
    }


def per_seed_curves(metrics: dict[str, np.ndarray]) -> dict[str, Any]:
    """Each seed's evaluation returns (where the preset evaluates) and its policy's entropy at
    the end, to read a stuck seed's story from."""
    curves: dict[str, Any] = {
        "final_entropy_per_seed": [rounded(v) for v in metrics["entropy"][:, -1]]
    }
    evals = metrics.get("eval_return")
    if evals is not None and not np.isnan(evals).all():
        updates = np.flatnonzero(~np.isnan(evals).all(axis=0))
        curves["eval_updates"] = [int(u) + 1 for u in updates]
        curves["eval_return_per_seed"] = [[rounded(v, 1) for v in s] for s in evals[:, updates]]
    return curves


def seed_row(task: str, seeds: int, total_timesteps: int | None, seed: int) -> dict[str, Any]:
    """One task's row: learning.py's row without its curves, and the robustness."""
    import jax

    config, metrics, compile_s, run_s = learning.run_metrics(task, seeds, total_timesteps, seed)
    row = learning.make_row(learning.task_name(task), config, metrics, compile_s, run_s)
    finals = row[f"final_{row['mean_of']}_return_per_seed"]
    published = row["published"]["return"] if row["published"] else None
    random = random_return(row["env_id"], jax.random.key(seed))
    kept = ("task", "env_id", "seeds", "budget", "mean_of", "published", "compile_s", "run_s")
    out = {name: row[name] for name in kept}
    out["final_return_per_seed"] = finals
    out["final_training_return_per_seed"] = row["final_training_return_per_seed"]
    out.update(robustness(finals, random, published))
    out.update(per_seed_curves(metrics))
    out["preset"] = row["preset"]
    return out


def not_run_reason(task: str) -> str:
    gpu = task.endswith("-MinAtar") or task.startswith(("brax/", "craftax/"))
    return GPU_REASON if gpu else UNPUBLISHED_REASON


def not_run_rows(ran: list[str]) -> list[dict[str, Any]]:
    """The learning table's tasks (learning.json's rows) that are not classic presets, nor
    variants (``ENV:cnn``), nor ``ran``, each with the reason."""
    path = learning.DEFAULT_OUT
    tasks = [row["task"] for row in read_rows(path, "learning", "")["tasks"]]
    return [
        {"task": task, "not_run": not_run_reason(task)}
        for task in tasks
        if task not in ran and task not in CLASSIC and ":" not in task
    ]


def merged(path: Path, row: dict[str, Any]) -> dict[str, Any]:
    """The result file at ``path`` with ``row`` in place of its task's old row, rows in
    CLASSIC's order, and the not-run list of the tasks that have no row."""
    results = read_rows(path, "seeds", __doc__.splitlines()[0])
    order = {task: position for position, task in enumerate(CLASSIC)}
    results = merge_row(results, row, "task", lambda task: order.get(task, len(order)))
    results["seeds"] = row["seeds"]
    results["not_run"] = not_run_rows([r["task"] for r in results["tasks"]])
    return results


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=list(CLASSIC))
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--seed", type=int, default=FRESH_SEED, help="keys split from key(seed)")
    parser.add_argument("--total-timesteps", type=int, help="override every budget (smoke runs)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    for task in args.tasks:
        row = seed_row(task, args.seeds, args.total_timesteps, args.seed)
        row.update(seed=args.seed, **record(__file__, argv))
        write_json(args.out, merged(args.out, row))
        print(
            f"{task}: mean {row['mean']}, worst {row['worst']}, random {row['random_return']}, "
            f"midpoint {row['midpoint']}, never learn {row['never_learn']} of {row['seeds']}, "
            f"per seed {row['final_return_per_seed']}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
