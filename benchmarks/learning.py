"""Learning: ppojax's presets at their budgets, seeds vmapped, against gymnax's published PPO.

    python benchmarks/learning.py [--tasks CartPole-v1 Breakout-MinAtar:cnn ...] [--seeds 4]
        [--jobs N] [--total-timesteps N] [--out benchmarks/results/learning.json] [--smoke]
    python benchmarks/learning.py --plot-only      redraw learning.png from learning.json
    python benchmarks/learning.py --table          print the results as a markdown table

A task is an env id with an optional variant, ``ENV[:mlp|cnn|bf16]``:
``PPOConfig.preset(ENV)``, with ``encoder="cnn"`` for ``:cnn`` (the preset's hidden layers
after MinAtar's one 3x3 conv of 16 channels), ``compute_dtype="bfloat16"`` for ``:bf16``.
Each task runs ``jax.jit(jax.vmap(ppojax.train, in_axes=(None, 0)))`` over
``--seeds`` keys at the preset's budget (``--total-timesteps`` overrides it, for smoke
tests), compiled ahead of time (compile seconds apart from run seconds).

Per task the JSON keeps: the config (every PPOConfig field), the budget, each seed's final
training return (mean ``episode_return`` over the last 5% of updates, sampled actions) and,
where the preset sets ``eval_every``, each seed's final in-loop evaluation return
(``eval_return`` of the evaluation after the last update), their means, gymnax-blines'
published PPO figure, compile and run seconds, date, machine, versions, the command, and the
learning curves downsampled to about 100 points (mean, min and max over seeds against env
steps), so ``--plot-only`` redraws the figure without training.

``--jobs N`` runs the tasks in N subprocesses at once (compiles dominate short tasks); on a
GPU each gets ``XLA_PYTHON_CLIENT_MEM_FRACTION`` = 0.9 / N unless that is set already, and
run seconds then include the time the processes share the device (``jobs`` is recorded).
Results merge into ``--out``: a run of some tasks replaces only their rows, and the file is
written (atomically) after each task, so a run that is killed keeps every finished task.
This script uses only ppojax's public API and the helpers of benchmarks/common.py.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from common import (
    RESULTS,
    command_line,
    markdown_table,
    merge_row,
    nanmean,
    pyplot,
    read_rows,
    record,
    result_path,
    rounded,
    with_block,
    write_json,
)

DEFAULT_OUT = RESULTS / "learning.json"

# gymnax-blines' PPO (github.com/RobertTLange/gymnax-blines, agents/<env>/ppo.yaml and the
# learning curves of its README, as gymnax's README reports them): evaluation return of the
# final policy and the env steps it trained for; MinAtar with 256-256 MLPs on the flat frame.
PUBLISHED: dict[str, tuple[float, int]] = {
    "CartPole-v1": (500, 150_000),
    "Acrobot-v1": (-80, 500_000),
    "Pendulum-v1": (-130, 1_000_000),
    "MountainCarContinuous-v0": (92, 1_000_000),
    "MountainCar-v0": (-118, 250_000),
    "Asterix-MinAtar": (15, 10_000_000),
    "Breakout-MinAtar": (28, 10_000_000),
    "Freeway-MinAtar": (58, 10_000_000),
    "SpaceInvaders-MinAtar": (131, 10_000_000),
}
PUBLISHED_SOURCE = "gymnax-blines PPO, evaluation return, MLP"
# Returns reported as a share of the most an episode can score, as the Craftax paper reports
# them: Craftax-Classic pays 1 for each of its 22 achievements, the first time in an episode
# (its +-0.1 health changes sum to about 0 over an episode).
MAX_RETURN: dict[str, float] = {"craftax/Craftax-Classic-Symbolic-v1": 22.0}
TASKS = tuple(PUBLISHED)  # the default: the nine gymnax tasks, each with its preset's encoder
# a task's suffix -> the fields it sets on the preset
VARIANTS: dict[str, dict[str, str]] = {
    "mlp": {"encoder": "mlp"},
    "cnn": {"encoder": "cnn"},
    "bf16": {"compute_dtype": "bfloat16"},
}
CURVE_POINTS = 100
FINAL_FRACTION = 0.05  # the final training return: the last 5% of updates


# --------------------------------------------------------------------------------------------
# Tasks and their configs


def parse_task(task: str) -> tuple[str, str | None]:
    """``"Breakout-MinAtar:cnn"`` -> ("Breakout-MinAtar", "cnn"); no suffix -> (id, None)."""
    env_id, _, variant = task.partition(":")
    if variant and variant not in VARIANTS:
        raise SystemExit(
            f"task {task!r}: the suffix must be one of {tuple(VARIANTS)}, got {variant!r}"
        )
    return env_id, variant or None


def variant_fields(variant: str | None) -> dict[str, str]:
    return VARIANTS[variant] if variant is not None else {}


def config_variant(config: Any) -> str:
    """The suffix that names ``config``'s variant of its preset: bf16, else its encoder."""
    return "bf16" if config.compute_dtype == "bfloat16" else config.encoder


def task_config(task: str, total_timesteps: int | None = None) -> Any:
    """The task's preset, with its variant's fields and the budget override."""
    import ppojax

    env_id, variant = parse_task(task)
    overrides: dict[str, Any] = dict(variant_fields(variant))
    if total_timesteps is not None:
        overrides["total_timesteps"] = total_timesteps
    return ppojax.PPOConfig.preset(env_id, **overrides)


def preset_value(env_id: str, name: str) -> Any:
    """A field of ``env_id``'s preset, read without building the config: building one imports
    the env's suite, which starts JAX's backend, and a --jobs parent must leave the GPU to
    its children."""
    import ppojax

    preset = ppojax.PRESETS.get(env_id, {})
    if name in preset:
        return preset[name]
    return {f.name: f.default for f in dataclasses.fields(ppojax.PPOConfig)}[name]


def task_name(task: str) -> str:
    """The row's name: the env id when the variant is the preset itself, else ``id:variant``."""
    env_id, variant = parse_task(task)
    fields = variant_fields(variant)
    if all(preset_value(env_id, name) == value for name, value in fields.items()):
        return env_id
    return f"{env_id}:{variant}"


def config_fields(config: Any) -> dict[str, Any]:
    """Every PPOConfig field as JSON values (tuples as lists, env_kwargs as a dict)."""
    fields = {}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if isinstance(value, tuple):
            value = list(value)
        elif isinstance(value, dict):
            value = dict(value)
        elif isinstance(value, np.generic):
            value = value.item()
        fields[field.name] = value
    return fields


def json_value(value: Any) -> Any:
    """``value`` as the result file stores it (tuples as lists)."""
    return json.loads(json.dumps(value, default=list))


def preset_drift(row: dict) -> dict[str, Any]:
    """The fields whose value in today's preset differs from the config the row was measured
    with, as recorded then: {name: recorded value}. Read from ``ppojax.PRESETS`` and the
    config's defaults, without building the config (that would import the env's suite)."""
    import ppojax

    env_id, variant = parse_task(row["task"])
    today = {f.name: f.default for f in dataclasses.fields(ppojax.PPOConfig)}
    today.update(ppojax.PRESETS.get(env_id, {}), env_id=env_id, **variant_fields(variant))
    recorded = row.get("preset", {})
    return {
        name: recorded[name]
        for name, value in today.items()
        if name in recorded and json_value(value) != json_value(recorded[name])
    }


# --------------------------------------------------------------------------------------------
# Numbers from the metrics


def final_training_returns(returns: np.ndarray) -> np.ndarray:
    """[seeds]: each seed's mean episode_return over the last 5% of updates (at least one)."""
    last = max(1, math.ceil(FINAL_FRACTION * returns.shape[1]))
    return nanmean(returns[:, -last:], axis=1)


def final_eval_returns(evals: np.ndarray) -> np.ndarray:
    """[seeds]: each seed's eval_return of the last update that has one (the last update
    always does when eval_every is set)."""
    finals = []
    for seed in evals:
        done = np.flatnonzero(~np.isnan(seed))
        finals.append(seed[done[-1]] if done.size else np.nan)
    return np.asarray(finals)


def band(values: np.ndarray) -> dict[str, list]:
    """Mean, min and max over seeds (axis 0) of [seeds, points], NaN-aware, as JSON lists."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=RuntimeWarning)
        stats = {
            "mean": np.nanmean(values, axis=0),
            "min": np.nanmin(values, axis=0),
            "max": np.nanmax(values, axis=0),
        }
    return {name: [rounded(v) for v in series] for name, series in stats.items()}


def training_curve(returns: np.ndarray, batch_size: int) -> dict[str, list]:
    """The training return in about CURVE_POINTS equal stretches of updates: each seed's mean
    over a stretch, then mean/min/max over seeds, at the env steps where the stretch ends."""
    stretches = np.array_split(np.arange(returns.shape[1]), min(CURVE_POINTS, returns.shape[1]))
    per_seed = np.stack([nanmean(returns[:, part], axis=1) for part in stretches], axis=1)
    steps = [int((part[-1] + 1) * batch_size) for part in stretches]
    return {"env_steps": steps, **band(per_seed)}


def eval_curve(evals: np.ndarray, batch_size: int) -> dict[str, list]:
    """The evaluations' returns (every eval_every updates and the last) against env steps."""
    updates = np.flatnonzero(~np.isnan(evals).all(axis=0))
    return {
        "env_steps": [int((u + 1) * batch_size) for u in updates],
        **band(evals[:, updates]),
    }


def hardware(row: dict) -> str:
    """One phrase for the table: the accelerator's name, or the CPU's model and cores."""
    found = row.get("machine", {})
    if found.get("backend") not in (None, "cpu"):
        return found.get("device", "?")
    return f"{found.get('cpu', '?')} ({found.get('cores', '?')} cores)"


# --------------------------------------------------------------------------------------------
# One task


def run_task(task: str, seeds: int, total_timesteps: int | None, seed: int) -> dict:
    """Compile and run one task over ``seeds`` keys; the row the JSON keeps for it."""
    config, metrics, compile_s, run_s = run_metrics(task, seeds, total_timesteps, seed)
    return make_row(task_name(task), config, metrics, compile_s, run_s)


def run_metrics(
    task: str, seeds: int, total_timesteps: int | None, seed: int
) -> tuple[Any, dict[str, np.ndarray], float, float]:
    """``run_task``'s run: the config, the metrics [seeds, updates], compile and run seconds."""
    import jax

    import ppojax

    config = task_config(task, total_timesteps)
    train_seeds = jax.jit(jax.vmap(ppojax.train, in_axes=(None, 0)))
    keys = jax.random.split(jax.random.key(seed), seeds)
    start = time.perf_counter()
    compiled = train_seeds.lower(config, keys).compile()
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    out = jax.block_until_ready(compiled(config, keys))
    run_s = time.perf_counter() - start
    metrics = {name: np.asarray(values, np.float64) for name, values in out.metrics.items()}
    return config, metrics, compile_s, run_s


def make_row(
    name: str, config: Any, metrics: dict[str, np.ndarray], compile_s: float, run_s: float
) -> dict:
    """The JSON's row for task ``name`` trained with ``config``: ``metrics`` [seeds, updates]."""
    returns = metrics["episode_return"]
    seeds = returns.shape[0]
    budget = config.num_updates * config.batch_size
    training = final_training_returns(returns)
    row: dict[str, Any] = {
        "task": name,
        "env_id": config.env_id,
        "encoder": config.encoder,
        "seeds": seeds,
        "budget": budget,
        "final_training_return_per_seed": [rounded(v, 2) for v in training],
        "final_training_return_mean": rounded(nanmean(training), 2),
        "final_eval_return_per_seed": None,
        "final_eval_return_mean": None,
    }
    if config.eval_every is not None:
        evals = metrics["eval_return"]
        finals = final_eval_returns(evals)
        row["final_eval_return_per_seed"] = [rounded(v, 2) for v in finals]
        row["final_eval_return_mean"] = rounded(nanmean(finals), 2)
    published = PUBLISHED.get(config.env_id)
    row.update(
        {
            # the headline: the evaluation's return where there is one (as published)
            "mean": row["final_eval_return_mean"]
            if row["final_eval_return_mean"] is not None
            else row["final_training_return_mean"],
            "mean_of": "eval" if row["final_eval_return_mean"] is not None else "training",
            "max_return": MAX_RETURN.get(config.env_id),
            "published": None
            if published is None
            else {"return": published[0], "env_steps": published[1], "source": PUBLISHED_SOURCE},
            "compile_s": round(compile_s, 2),
            "run_s": round(run_s, 2),
            "env_steps_per_s": round(seeds * budget / run_s),
            "preset": config_fields(config),
            "curve": training_curve(returns, config.batch_size),
            "eval_curve": None
            if config.eval_every is None
            else eval_curve(metrics["eval_return"], config.batch_size),
        }
    )
    return row


def row_from_run(run_dir: Path) -> dict:
    """The row of a ``ppojax train ENV --seeds N`` run folder of a preset, computed as for a
    run of this script from its metrics.csv and summary.json: for runs made elsewhere (a
    GPU machine, a CLI run). Refused unless the folder's config is today's preset."""
    from ppojax.runs import folder
    from ppojax.runs.settings import read_experiment

    experiment, _ = read_experiment(run_dir)
    config = experiment.config
    if experiment.grid:
        raise SystemExit(f"--from-run {run_dir}: a sweep's folder; a row is one preset's seeds")
    _, metrics = folder.read_metrics(Path(run_dir) / folder.METRICS_FILE)
    summary = folder.read_json(Path(run_dir) / folder.SUMMARY_FILE)
    metrics = {name: np.asarray(values, np.float64) for name, values in metrics.items()}
    name = task_name(f"{config.env_id}:{config_variant(config)}")
    row = make_row(name, config, metrics, summary["compile_seconds"], summary["run_seconds"])
    drift = preset_drift(row)
    if drift:
        raise SystemExit(
            f"--from-run {run_dir}: its config differs from the {name} preset in "
            f"{', '.join(sorted(drift))}; a row is the preset's result"
        )
    return row


def row_line(row: dict) -> str:
    published = row["published"]
    against = "" if published is None else f" (published {published['return']})"
    return (
        f"{row['task']}: {row['mean_of']} return {row['mean']}{against}, per seed "
        f"{row['final_eval_return_per_seed'] or row['final_training_return_per_seed']}; "
        f"compile {row['compile_s']} s, run {row['run_s']} s, {row['env_steps_per_s']:,} steps/s"
    )


# --------------------------------------------------------------------------------------------
# The result file


def read_results(path: Path) -> dict:
    return read_rows(path, "learning", __doc__.splitlines()[0])


def row_order(name: str) -> tuple:
    """Rows in TASKS' order, each env's preset row before its variants, unknown tasks last."""
    env_id, variant = parse_task(name)
    position = TASKS.index(env_id) if env_id in TASKS else len(TASKS)
    return (position, env_id, variant or "")


def save_row(path: Path, row: dict, mirror: Path | None) -> None:
    """Put ``row`` into the file at ``path`` in place of its task's old row (if any)."""
    write_json(path, merge_row(read_results(path), row, "task", row_order), mirror)


# --------------------------------------------------------------------------------------------
# The figure and the table


def plot(path: Path, figure_path: Path) -> None:
    """One panel per task: the training return's mean over seeds, min-max band, final
    evaluations as points, the published figure dashed."""
    plt = pyplot()

    rows = read_results(path)["tasks"]
    if not rows:
        print(f"{path}: no tasks to plot")
        return
    columns = min(4, len(rows))
    lines = math.ceil(len(rows) / columns)
    figure, axes = plt.subplots(lines, columns, figsize=(4.2 * columns, 3.2 * lines), squeeze=False)
    for axis, row in zip(axes.ravel(), rows, strict=False):
        curve = row["curve"]
        steps = np.asarray(curve["env_steps"], float)
        values = {k: np.asarray(curve[k], dtype=float) for k in ("mean", "min", "max")}
        axis.fill_between(steps, values["min"], values["max"], alpha=0.25, color="tab:blue")
        axis.plot(steps, values["mean"], color="tab:blue", label=f"training ({row['seeds']} seeds)")
        evals = row.get("eval_curve")
        if evals and evals["env_steps"]:
            axis.errorbar(
                evals["env_steps"],
                np.asarray(evals["mean"], dtype=float),
                yerr=[
                    np.asarray(evals["mean"], dtype=float) - np.asarray(evals["min"], dtype=float),
                    np.asarray(evals["max"], dtype=float) - np.asarray(evals["mean"], dtype=float),
                ],
                fmt="o",
                markersize=3,
                color="tab:orange",
                label="evaluation",
            )
        published = row.get("published")
        if published:
            axis.axhline(
                published["return"],
                color="gray",
                linestyle="--",
                label=f"published {published['return']:g}",
            )
        axis.set_title(f"{row['task']}: {row['mean_of']} {row['mean']}", fontsize=9)
        axis.set_xlabel("env steps per seed", fontsize=8)
        axis.tick_params(labelsize=7)
        axis.legend(fontsize=7)
    for axis in axes.ravel()[len(rows) :]:
        axis.set_visible(False)
    first = rows[0]
    figure.suptitle(
        f"ppojax presets, training return (band: min-max over seeds) - {hardware(first)}, "
        f"jax {first['versions']['jax']}, {first['date'][:10]}",
        fontsize=10,
    )
    figure.tight_layout()
    figure_path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(figure_path, dpi=100)
    plt.close(figure)
    print(f"wrote {figure_path}")


def steps_text(steps: int) -> str:
    """10_000_000 -> "10M", 999_424 -> "1M", 150_000 -> "150k": budgets are whole multiples
    of a batch, so they fall a little short of the round number they were set to."""
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if steps >= 0.99 * size:
            value = steps / size
            close = value >= 9.5 or abs(value - round(value)) < 0.05
            return f"{round(value)}{unit}" if close else f"{value:.1f}{unit}"
    return str(steps)


def seeds_text(row: dict) -> str:
    """The per-seed returns the mean is of, to one decimal."""
    key = f"final_{row['mean_of']}_return_per_seed"
    values = row.get(key) or []
    return ", ".join(f"{value:.1f}" for value in values)


def fresh_seeds_cell(task: str, robustness: dict) -> str:
    """The worst of seeds.py's fresh seeds and how many never learn, "not run" for a task it
    lists as not run, "-" for one it does not know (a variant)."""
    for row in robustness.get("tasks", []):
        if row["task"] == task:
            return f"{row['worst']:.1f}; {row['never_learn']} of {row['seeds']}"
    for row in robustness.get("not_run", []):
        if row["task"] == task:
            return "not run (GPU)" if "GPU" in row["not_run"] else "not run (no midpoint)"
    return "-"


def learning_table(rows: list[dict], link: str, robustness: dict | None = None) -> str:
    """task | budget | mean | per seed | published | hardware | link, one line per task; a
    task measured with an earlier version of its preset is marked *, and a line under the
    table gives the values it was measured with where today's preset differs. With
    ``robustness`` (seeds.json's contents), a column after the per-seed returns: the worst
    fresh seed and how many seeds never learn."""
    earlier: list[str] = []
    lines = []
    for row in rows:
        published = row.get("published")
        shown = (
            "-"
            if published is None
            else f"{published['return']:g} @{steps_text(published['env_steps'])}"
        )
        if published is not None and row["encoder"] != "mlp":
            shown += " (MLP)"
        mean = "-" if row["mean"] is None else f"{row['mean']:.1f} ({row['mean_of']})"
        drift = preset_drift(row)
        if drift:
            earlier.append(
                f"{row['task']}: "
                + ", ".join(f"{name} {json.dumps(value)}" for name, value in drift.items())
            )
        if row["mean"] is not None and row.get("max_return"):
            mean += f", {100 * row['mean'] / row['max_return']:.1f}% of max"
        task = row["task"] + (" *" if drift else "")
        fresh = () if robustness is None else (fresh_seeds_cell(row["task"], robustness),)
        figure = f"[{Path(link).name}]({link})"
        line = (task, steps_text(row["budget"]), mean, seeds_text(row), *fresh)
        lines.append((*line, shown, hardware(row), figure))
    fresh_head = (
        () if robustness is None else (f"{robustness['seeds']} fresh seeds: worst; never learn",)
    )
    header = ("task", "budget", "mean of 4 seeds", "per seed", *fresh_head)
    table = markdown_table((*header, "published PPO", "hardware", "plot"), lines)
    if earlier:
        note = "\\* measured with an earlier preset, where it differed: "
        table += "\n\n" + note + "; ".join(earlier)
    return table


TABLE_START, TABLE_END = "<!-- learning-table:start -->", "<!-- learning-table:end -->"


# --------------------------------------------------------------------------------------------
# Running many tasks


class Runner:
    """Runs tasks in subprocesses, ``jobs`` at a time; merges each row as it arrives."""

    def __init__(self, args: argparse.Namespace, command: str) -> None:
        self.args = args
        self.command = command
        self.children: set[subprocess.Popen] = set()
        self.lock = threading.Lock()
        self.failed: list[str] = []

    def child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.args.jobs > 1:
            env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{0.9 / self.args.jobs:.3f}")
        return env

    def worker_command(self, task: str, row_out: Path) -> list[str]:
        command = [sys.executable, str(Path(__file__).resolve()), "--worker", task]
        command += ["--row-out", str(row_out), "--seeds", str(self.args.seeds)]
        command += ["--seed", str(self.args.seed), "--command", self.command]
        command += ["--jobs", str(self.args.jobs)]
        budget = budget_for(task, self.args)
        if budget is not None:
            command += ["--total-timesteps", str(budget)]
        return command

    def run_one(self, task: str, logs: Path) -> None:
        row_out = logs / f"{task.replace('/', '_').replace(':', '_')}.row.json"
        log = logs / f"{task.replace('/', '_').replace(':', '_')}.log"
        with open(log, "w") as log_file:
            child = subprocess.Popen(
                self.worker_command(task, row_out),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=self.child_env(),
            )
            with self.lock:
                self.children.add(child)
            code = child.wait()
            with self.lock:
                self.children.discard(child)
        if code != 0 or not row_out.exists():
            tail = log.read_text()[-3000:]
            with self.lock:
                self.failed.append(task)
                print(f"FAILED {task} (exit {code}); the end of its log:\n{tail}", flush=True)
            return
        row = json.loads(row_out.read_text())
        with self.lock:
            save_row(self.args.out, row, self.args.mirror)
            print(row_line(row), flush=True)

    def stop(self, *_: Any) -> None:
        """On SIGTERM/SIGINT: end the children (their finished rows are already written)."""
        with self.lock:
            for child in self.children:
                child.kill()
        print("stopped; finished tasks are in the JSON", flush=True)
        os._exit(1)

    def run(self, tasks: list[str]) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        with tempfile.TemporaryDirectory(prefix="learning-") as logs:
            with concurrent.futures.ThreadPoolExecutor(self.args.jobs) as pool:
                for future in [pool.submit(self.run_one, task, Path(logs)) for task in tasks]:
                    future.result()


def expected_cost(task: str) -> float:
    """For running the longest tasks first: the budget, twice for a CNN."""
    env_id, encoder = parse_task(task)
    budget = preset_value(env_id, "total_timesteps")
    return budget * (2.0 if encoder == "cnn" else 1.0)


def budget_for(task: str, args: argparse.Namespace) -> int | None:
    """--total-timesteps; with --smoke two updates of the task's preset (the smallest run that
    still has a final stretch); else None (the preset's budget)."""
    if args.total_timesteps is not None or not args.smoke:
        return args.total_timesteps
    env_id, _ = parse_task(task)
    return 2 * preset_value(env_id, "num_envs") * preset_value(env_id, "num_steps")


def run_in_process(args: argparse.Namespace, tasks: list[str], command: str) -> list[str]:
    failed = []
    for task in tasks:
        try:
            row = run_task(task, args.seeds, budget_for(task, args), args.seed)
            row = finish_row(row, command, args)
        except Exception as error:  # one task's failure must not lose the others
            print(f"FAILED {task}: {type(error).__name__}: {error}", flush=True)
            failed.append(task)
            continue
        save_row(args.out, row, args.mirror)
        print(row_line(row), flush=True)
    return failed


def finish_row(row: dict, command: str, args: argparse.Namespace) -> dict:
    """Add when, where and how the row was made."""
    task_command = ["--tasks", row["task"], "--seeds", str(args.seeds)]
    if args.total_timesteps is not None or args.smoke:
        task_command += ["--total-timesteps", str(row["budget"])]
    row.update(record(__file__, task_command))
    row.update({"jobs": args.jobs, "command": command, "task_command": row["command"]})
    return row


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), help="ENV[:mlp|cnn|bf16] ...")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0, help="keys split from key(seed)")
    parser.add_argument("--jobs", type=int, default=1, help="tasks in parallel subprocesses")
    parser.add_argument("--total-timesteps", type=int, help="override every preset's budget")
    parser.add_argument("--out", type=Path, help=f"the JSON (default {DEFAULT_OUT})")
    parser.add_argument("--mirror", type=Path, help="also copy the JSON and PNG into this folder")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="2 updates per task, 2 seeds, results in a temporary folder unless --out",
    )
    parser.add_argument(
        "--from-run",
        type=Path,
        nargs="+",
        metavar="RUN_DIR",
        help="merge the rows of `ppojax train ENV --seeds N` run folders of presets",
    )
    parser.add_argument("--run-command", help="with --from-run: the command that made them")
    parser.add_argument("--plot-only", action="store_true", help="redraw the PNG from the JSON")
    parser.add_argument("--table", action="store_true", help="print the JSON as markdown")
    parser.add_argument(
        "--readme", type=Path, help="write the table into this README's learning-table block"
    )
    parser.add_argument(
        "--link", default="benchmarks/results/learning.png", help="the table's link target"
    )
    # internal: one task in a subprocess of a --jobs run
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--row-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--command", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.seeds = 2 if "--seeds" not in argv else args.seeds
    args.out = result_path(args.out, args.smoke, DEFAULT_OUT.name)
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    figure_path = args.out.with_suffix(".png")
    if args.table or args.readme:
        seeds_path = args.out.with_name("seeds.json")  # seeds.py's result, beside this one
        robustness = read_results(seeds_path) if seeds_path.exists() else None
        table = learning_table(read_results(args.out)["tasks"], args.link, robustness)
        if args.readme:
            text = args.readme.read_text()
            args.readme.write_text(with_block(text, TABLE_START, TABLE_END, table))
        else:
            print(table)
        return 0
    if args.plot_only:
        plot(args.out, figure_path)
        return 0
    if args.from_run:
        for run_dir in args.from_run:
            row = row_from_run(run_dir)
            made_by = args.run_command or f"ppojax train {row['env_id']} --seeds {row['seeds']}"
            row = finish_row(row, made_by, args)
            row["task_command"] = made_by
            save_row(args.out, row, args.mirror)
            print(row_line(row), flush=True)
        plot(args.out, figure_path)
        return 0
    if args.worker:  # one task, its row to --row-out for the parent to merge
        row = run_task(args.worker, args.seeds, args.total_timesteps, args.seed)
        write_json(args.row_out, finish_row(row, args.command, args))
        return 0
    command = command_line(__file__, argv)
    for task in args.tasks:
        parse_task(task)
    tasks = sorted(args.tasks, key=expected_cost, reverse=True)
    print(f"{len(tasks)} task(s), {args.seeds} seeds, {args.jobs} job(s) -> {args.out}", flush=True)
    if args.jobs > 1:
        runner = Runner(args, command)
        runner.run(tasks)
        failed = runner.failed
    else:
        failed = run_in_process(args, tasks, command)
    if read_results(args.out)["tasks"]:
        plot(args.out, figure_path)
        if args.mirror is not None:  # the JSON is mirrored as each row is saved
            (args.mirror / figure_path.name).write_bytes(figure_path.read_bytes())
    if failed:
        print(f"failed: {' '.join(failed)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
