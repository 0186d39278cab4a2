"""PBT against random search: ``ppojax.pbt`` with a population of 16 against the best of 16
random configurations trained for the same env steps, on the same search space, repeated.

    python benchmarks/pbt.py [--tasks Pendulum-v1 Asterix-MinAtar] [--reps 4]
        [--population 16] [--total-timesteps N] [--interval K] [--fraction 0.25]
        [--explore perturb|resample] [--label NAME] [--cpu-devices N]
        [--out benchmarks/results/pbt.json]
    python benchmarks/pbt.py --smoke          two tiny repetitions, results in a temporary folder
    python benchmarks/pbt.py --plot-only      redraw pbt.png from pbt.json
    python benchmarks/pbt.py --table          print the results as a markdown table

Both methods of a repetition are one compiled program each, from one key:

- **PBT**: ``ppojax.pbt(config, key, population, interval, search, fraction, explore)``.
- **Random search**: the same call with ``interval = num_updates``: one interval, after which
  (the run's last) nobody is replaced, so it is the vmapped sweep of the 16 drawn
  configurations (tests/test_pbt.py checks that equality bit for bit).

So the two start from the same 16 configurations and networks, train the same env steps
(population x budget per member) and differ only by exploit and explore: a paired comparison.
Repetition r uses ``jax.random.fold_in(key(seed), r)``. Each program is compiled once and run
for every repetition.

Per member, the final training return is benchmarks/learning.py's (the mean episode_return
over the last 5% of updates) and the final evaluation return the in-loop evaluation after the
last update (the preset's eval_every, deterministic actions). "Best" is the member with the
highest final training return, "mean" the mean over all members. Per task the JSON keeps the
settings, every repetition's per-member finals, the best member's training curve (about 100
points), one repetition's PBT schedules and lineage, timings, date, machine, versions and
the command. Rows are keyed by task and ``--label`` (tuning variants sit beside the default).
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path
from typing import Any

import common
import numpy as np
from learning import final_eval_returns, final_training_returns

DEFAULT_OUT = common.RESULTS / "pbt.json"
CURVE_POINTS = 100

# The search spaces, each bracketing the task's preset. Pendulum: the learning rate over 1.5
# decades around the preset's 1e-3; clip eps and GAE lambda around PPO's usual 0.2 and 0.95;
# gamma, which Pendulum's preset had to lower from 0.99 to 0.95 (its reward is dense and the
# swing-up short), so the search has a setting that matters; no entropy bonus (a Gaussian
# policy's entropy bonus only slows Pendulum, the preset has none). MinAtar: the issue's
# learning rate and entropy ranges (discrete actions, where exploration pays), clip and lambda.
SEARCH: dict[str, dict[str, tuple[Any, ...]]] = {
    "Pendulum-v1": {
        "learning_rate": (1e-4, 3e-3, "log"),
        "clip_eps": (0.1, 0.3, "linear"),
        "gae_lambda": (0.8, 0.99, "linear"),
        "gamma": (0.9, 0.99, "linear"),
    },
    "MinAtar": {
        "learning_rate": (1e-4, 3e-3, "log"),
        "ent_coef": (0.0, 0.02, "linear"),
        "clip_eps": (0.1, 0.3, "linear"),
        "gae_lambda": (0.8, 0.99, "linear"),
    },
}


def task_search(env_id: str) -> dict[str, tuple[Any, ...]]:
    """The search space of ``env_id`` (every MinAtar game shares one)."""
    return SEARCH["MinAtar" if env_id.endswith("-MinAtar") else env_id]


def default_interval(num_updates: int) -> int:
    """The largest divisor of ``num_updates`` that leaves at least 10 intervals."""
    return max(k for k in range(1, max(1, num_updates // 10) + 1) if num_updates % k == 0)


def compiled_pbt(config: Any, population: int, interval: int, search: dict, args: Any) -> Any:
    """``key -> PBTOutput`` compiled for ``config``; the seconds it took to compile."""
    import jax

    import ppojax
    from ppojax.runtime.sharding import runs_sharding

    sharding = runs_sharding(population)  # None on one device
    program = functools.partial(
        ppojax.pbt,
        population=population,
        interval=interval,
        search=search,
        fraction=args.fraction,
        explore_mode=args.explore,
        mesh=None if sharding is None else sharding.mesh,
    )
    start = time.perf_counter()
    compiled = jax.jit(program).lower(config, jax.random.key(0)).compile()
    return functools.partial(compiled, config), time.perf_counter() - start


def best_curve(returns: np.ndarray, member: int) -> list[float | None]:
    """One member's episode_return [updates] as about CURVE_POINTS stretch means."""
    stretches = np.array_split(returns[member], min(CURVE_POINTS, returns.shape[1]))
    return [common.rounded(common.nanmean(stretch)) for stretch in stretches]


def method_numbers(out: Any) -> dict[str, Any]:
    """One method's finals of one repetition: per member, best and mean, the best's curve."""
    returns = np.asarray(out.metrics["episode_return"], np.float64)  # [P, updates]
    training = final_training_returns(returns)
    best = int(np.nanargmax(np.nan_to_num(training, nan=-np.inf)))
    numbers: dict[str, Any] = {
        "final_training_return": [common.rounded(v, 2) for v in training],
        "best_member": best,
        "best": common.rounded(training[best], 2),
        "mean": common.rounded(common.nanmean(training), 2),
        "best_curve": best_curve(returns, best),
    }
    if "eval_return" in out.metrics:
        evals = final_eval_returns(np.asarray(out.metrics["eval_return"], np.float64))
        numbers["final_eval_return"] = [common.rounded(v, 2) for v in evals]
        numbers["best_eval"] = common.rounded(evals[best], 2)
        numbers["mean_eval"] = common.rounded(common.nanmean(evals), 2)
    return numbers


def schedules(out: Any, numbers: dict[str, Any]) -> dict[str, Any]:
    """One repetition's PBT records: hyperparameters {field: [P, G]}, lineage [P, G] and the
    members' final training returns (for colouring by rank)."""
    return {
        "hyperparams": {
            name: np.asarray(values, np.float64).round(6).tolist()
            for name, values in out.hyperparams.items()
        },
        "lineage": np.asarray(out.lineage).tolist(),
        "final_training_return": numbers["final_training_return"],
    }


def run_task(task: str, args: argparse.Namespace) -> dict[str, Any]:
    """Both methods on ``task`` for ``args.reps`` repetitions: the task's row."""
    import jax

    import ppojax

    overrides = {} if args.total_timesteps is None else {"total_timesteps": args.total_timesteps}
    config = ppojax.PPOConfig.preset(task, **overrides)
    search = task_search(task)
    interval = args.interval or default_interval(config.num_updates)
    pbt_run, pbt_compile = compiled_pbt(config, args.population, interval, search, args)
    reused = reusable_search(args, task, config, search) if args.reuse_search else None
    search_run, search_compile = (
        (None, 0.0)
        if reused is not None
        else compiled_pbt(config, args.population, config.num_updates, search, args)
    )
    reps, seconds = [], {"pbt": 0.0, "search": 0.0}
    for rep in range(args.reps):
        key = jax.random.fold_in(jax.random.key(args.seed), rep)
        numbers = {}
        for method, run in (("pbt", pbt_run), ("search", search_run)):
            if run is None:  # the search does not depend on the PBT settings: reuse it
                numbers[method] = reused["repetitions"][rep][method]
                continue
            start = time.perf_counter()
            out = jax.device_get(jax.block_until_ready(run(key)))
            seconds[method] += time.perf_counter() - start
            numbers[method] = method_numbers(out)
            if method == "pbt" and rep == 0:
                first_schedules = schedules(out, numbers[method])
        reps.append({"rep": rep, **numbers})
        print(
            f"{task} rep {rep}: PBT best {numbers['pbt']['best']} mean {numbers['pbt']['mean']}"
            f" | search best {numbers['search']['best']} mean {numbers['search']['mean']}"
            f" ({seconds['pbt'] + seconds['search']:.0f} s so far)",
            flush=True,
        )
    budget = config.num_updates * config.batch_size
    if reused is not None:
        search_compile, seconds["search"] = reused["compile_s"]["search"], reused["run_s"]["search"]
    return {
        "task": task,
        "label": args.label,
        "search_from": None if reused is None else reused["name"],
        "name": row_name(task, args.label),
        "population": args.population,
        "reps": args.reps,
        "seed": args.seed,
        "budget_per_member": budget,
        "preset_budget": ppojax.PPOConfig.preset(task).num_updates
        * ppojax.PPOConfig.preset(task).batch_size,
        "total_env_steps_per_method": args.population * budget,
        "num_updates": config.num_updates,
        "batch_size": config.batch_size,
        "interval": interval,
        "fraction": args.fraction,
        "explore": args.explore,
        "search": {name: list(spec) for name, spec in search.items()},
        "summary": summarize(reps),
        "repetitions": reps,
        "schedules_rep0": first_schedules,
        "compile_s": {"pbt": round(pbt_compile, 2), "search": round(search_compile, 2)},
        "run_s": {name: round(value, 2) for name, value in seconds.items()},
    }


def reusable_search(
    args: argparse.Namespace, task: str, config: Any, search: dict
) -> dict[str, Any] | None:
    """The task's default row in --out when it ran the same search (space, population,
    budget, seed, repetitions), whose random-search numbers a variant can take; else None."""
    for row in read_results(args.out)["tasks"]:
        same = row["name"] == task and row["search"] == {k: list(v) for k, v in search.items()}
        same = same and row["population"] == args.population and row["seed"] == args.seed
        same = same and row["reps"] == args.reps and row["num_updates"] == config.num_updates
        if same:
            print(f"{task}: random search taken from the row {row['name']!r}", flush=True)
            return row
    print(f"{task}: no matching random search in {args.out}; running it", flush=True)
    return None


def summarize(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """Each method's best and mean averaged over repetitions, and PBT's wins."""
    summary: dict[str, Any] = {}
    for method in ("pbt", "search"):
        for stat in ("best", "mean", "best_eval", "mean_eval"):
            values = [rep[method].get(stat) for rep in reps]
            if None not in values:
                summary[f"{method}_{stat}"] = common.rounded(np.mean(values), 2)
    summary["pbt_best_wins"] = sum(rep["pbt"]["best"] > rep["search"]["best"] for rep in reps)
    return summary


def row_name(task: str, label: str | None) -> str:
    return task if not label else f"{task} [{label}]"


# --------------------------------------------------------------------------------------------
# The result file, the figure and the table


def read_results(path: Path) -> dict[str, Any]:
    return common.read_rows(path, "pbt", __doc__.splitlines()[0])


def summary_table(rows: list[dict[str, Any]]) -> str:
    """Final training return per row, averaged over repetitions: PBT best and mean, search
    best and mean, the best members' final evaluation return, PBT's wins, the settings."""
    header = (
        "task",
        "budget per member",
        "PBT best",
        "PBT mean",
        "search best",
        "search mean",
        "best's eval: PBT / search",
        "PBT best wins",
        "interval, fraction, explore",
    )
    lines = []
    for row in rows:
        s = row["summary"]
        settings = f"{row['interval']} of {row['num_updates']} updates, {row['fraction']}"
        lines.append(
            (
                row["name"],
                f"{row['budget_per_member']:,}",
                s["pbt_best"],
                s["pbt_mean"],
                s["search_best"],
                s["search_mean"],
                f"{s.get('pbt_best_eval')} / {s.get('search_best_eval')}",
                f"{s['pbt_best_wins']}/{row['reps']}",
                f"{settings}, {row['explore']}",
            )
        )
    return common.markdown_table(header, lines)


def repetitions_table(rows: list[dict[str, Any]]) -> str:
    """Per row and repetition: PBT best and mean, search best and mean (final training
    return)."""
    header = ("task", "rep", "PBT best", "PBT mean", "search best", "search mean")
    lines = [
        (row["name"], rep["rep"], rep["pbt"]["best"], rep["pbt"]["mean"])
        + (rep["search"]["best"], rep["search"]["mean"])
        for row in rows
        for rep in row["repetitions"]
    ]
    return common.markdown_table(header, lines)


def plot(path: Path, figure_path: Path) -> None:
    """Per task: the best member's training return for both methods (mean over repetitions,
    min-max band), the same over the second half of training (where the two are close), then
    repetition 0's PBT schedules, one line per member coloured by final rank (darkest: the
    best)."""
    plt = common.pyplot()
    import matplotlib.ticker

    rows = read_results(path)["tasks"]
    if not rows:
        return
    columns = 2 + max(len(row["search"]) for row in rows)
    thousands = matplotlib.ticker.FuncFormatter(lambda x, _: f"{x / 1e3:g}k")
    figure, axes = plt.subplots(
        len(rows), columns, figsize=(3.8 * columns, 3.2 * len(rows)), squeeze=False
    )
    for line, row in zip(axes, rows, strict=True):
        for axis, half in ((line[0], False), (line[1], True)):
            plot_best_curves(axis, row, half)
        plot_schedules(line[2:], row, plt)
        for axis in line:
            axis.xaxis.set_major_formatter(thousands)
    figure.tight_layout()
    figure.savefig(figure_path, dpi=100)
    plt.close(figure)


def plot_best_curves(axis: Any, row: dict[str, Any], second_half: bool) -> None:
    for method, colour in (("pbt", "tab:red"), ("search", "tab:blue")):
        curves = np.array([rep[method]["best_curve"] for rep in row["repetitions"]], float)
        steps = np.linspace(0, row["budget_per_member"], curves.shape[1] + 1)[1:]
        if second_half:
            curves, steps = curves[:, len(steps) // 2 :], steps[len(steps) // 2 :]
        label = "PBT" if method == "pbt" else "random search"
        axis.fill_between(steps, curves.min(0), curves.max(0), color=colour, alpha=0.2)
        style = "-" if method == "pbt" else "--"
        axis.plot(steps, curves.mean(0), style, color=colour, label=f"{label}, best member")
    title = f"{row['name']}: {row['reps']} reps" + (", second half" if second_half else "")
    axis.set_title(title, fontsize="small")
    axis.set_xlabel("env steps per member")
    axis.set_ylabel("training return")
    axis.legend(fontsize="small")
    axis.grid(alpha=0.3)


def plot_schedules(axes: Any, row: dict[str, Any], plt: Any) -> None:
    schedule = row["schedules_rep0"]
    finals = np.array(schedule["final_training_return"], dtype=float)
    rank = np.argsort(np.argsort(-np.nan_to_num(finals, nan=-np.inf)))
    colours = plt.cm.viridis(rank / max(len(rank) - 1, 1))
    for axis, (name, spec) in zip(axes, row["search"].items(), strict=False):
        values = np.array(schedule["hyperparams"][name], dtype=float)
        # one more point at the run's end, so the last interval shows its width
        values = np.concatenate([values, values[:, -1:]], axis=1)
        steps = np.arange(values.shape[1]) * row["interval"] * row["batch_size"]
        for member in np.argsort(-rank):  # the best drawn last, on top
            axis.step(steps, values[member], where="post", color=colours[member], lw=1)
        if spec[2] == "log":
            axis.set_yscale("log")
        axis.set_title(f"PBT {name} (rep 0; dark: best)", fontsize="small")
        axis.set_xlabel("env steps per member")
        axis.grid(alpha=0.3)
    for axis in axes[len(row["search"]) :]:
        axis.set_visible(False)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=["Pendulum-v1"], help="env ids")
    parser.add_argument("--reps", type=int, default=4, help="independent repetitions")
    parser.add_argument("--population", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0, help="rep r uses fold_in(key(seed), r)")
    parser.add_argument("--total-timesteps", type=int, help="budget per member (default preset)")
    parser.add_argument("--interval", type=int, help="updates between exploit steps")
    parser.add_argument("--fraction", type=float, default=0.25)
    parser.add_argument("--explore", choices=("perturb", "resample"), default="perturb")
    parser.add_argument("--label", help="a name for a variant's row (default: none)")
    parser.add_argument(
        "--reuse-search",
        action="store_true",
        help="take the random search from the task's unlabelled row when it matches",
    )
    parser.add_argument("--out", type=Path, help=f"the JSON (default {DEFAULT_OUT})")
    parser.add_argument(
        "--cpu-devices",
        type=int,
        default=1,
        help="CPU devices the population is split over, as `ppojax pbt --cpu-devices` splits it",
    )
    parser.add_argument("--smoke", action="store_true", help="2 tiny reps, temporary results")
    parser.add_argument("--plot-only", action="store_true", help="redraw the PNG from the JSON")
    parser.add_argument("--table", action="store_true", help="print the JSON as markdown")
    args = parser.parse_args(argv)
    if args.smoke:
        args.reps, args.population = 2, 4
        args.total_timesteps = args.total_timesteps or 4 * 4096
        args.interval = args.interval or 2
    args.out = common.result_path(args.out, args.smoke, DEFAULT_OUT.name)
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.table:
        rows = read_results(args.out)["tasks"]
        print(summary_table(rows) + "\n\n" + repetitions_table(rows))
        return 0
    if not args.plot_only:
        if args.cpu_devices > 1:
            import ppojax

            ppojax.use_cpu_devices(args.cpu_devices)
        for task in args.tasks:
            row = {**run_task(task, args), **common.record(__file__, argv)}
            common.write_json(args.out, common.merge_row(read_results(args.out), row, "name"))
            print(summary_table([row]), flush=True)
    plot(args.out, args.out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
