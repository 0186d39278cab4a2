"""What ``ppojax train`` and ``ppojax sweep`` print when a run ends: timings, the learning
curve, final returns, the reset pool's repeats and the divergence guard's skipped steps."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ppojax.runs.experiment import RunResult


def print_report(result: RunResult) -> None:
    """What ran, timings, the learning curve, final returns and the run folder."""
    experiment, config = result.experiment, result.experiment.config
    print(
        f"ppojax PPO on {config.env_id}: {experiment.num_runs} run(s) = {experiment.seeds} "
        f"seed(s) x {experiment.num_runs // experiment.seeds} grid point(s), "
        f"{config.num_updates} updates x {config.batch_size} steps"
    )
    rate = result.env_steps / max(result.run_seconds, 1e-9)
    print(
        f"compile {result.compile_seconds:.1f} s, run {result.run_seconds:.1f} s, "
        f"{rate:,.0f} env steps/s{cache_note()}"
    )
    metrics = result.metrics
    print_learning_curve(metrics["episode_return"], config.batch_size, metrics["episode_length"])
    print_final_returns(result)
    print_final_eval_returns(result)
    line = reset_pool_line(config.reset_pool, result.metrics)
    if line:
        print(line)
    print_divergence(result)
    if result.run_dir is not None:
        print(f"run folder: {result.run_dir}")


def cache_note() -> str:
    """How many programs this process loaded from the compilation cache, when it is on."""
    from ppojax.runtime import cache

    if not cache.cache_enabled():
        return ""
    counts = cache.cache_counts()
    return (
        f" ({counts['hits']} program(s) loaded from the compilation cache, "
        f"{counts['misses']} compiled into it)"
    )


def print_learning_curve(returns: np.ndarray, batch_size: int, lengths: np.ndarray) -> None:
    """Mean over runs of the 10-update rolling mean return and episode length at ten points;
    returns and lengths [runs, U]. Where no episode ended in a run's 10 updates (episodes
    longer than 10 rollouts), its latest window that had one stands in. The length shows
    learning where the return cannot (a goal reward of 1 whatever the time taken)."""
    from ppojax.runs.plots import rolling_mean

    smooth_returns, smooth_lengths = (
        carried_forward(rolling_mean(values)) for values in (returns, lengths)
    )
    print(f"{'env steps':>12}  {'mean return':>12}  {'mean length':>12}")
    for update in np.unique(np.linspace(0, returns.shape[1] - 1, 10).astype(int)):
        means = [mean_of(smooth[:, update]) for smooth in (smooth_returns, smooth_lengths)]
        print(f"{(update + 1) * batch_size:>12,}  {means[0]:>12.1f}  {means[1]:>12.1f}")


def carried_forward(values: np.ndarray) -> np.ndarray:
    """Each NaN along the last axis replaced by the latest finite value before it (NaN until
    the first)."""
    finite = np.isfinite(values)
    positions = np.where(finite, np.arange(values.shape[-1]), 0)
    latest = np.maximum.accumulate(positions, axis=-1)
    filled = np.take_along_axis(values, latest, axis=-1)
    return np.where(np.maximum.accumulate(finite, axis=-1), filled, np.nan)


def mean_of(values: np.ndarray) -> float:
    """The mean of the finite values, NaN when there is none."""
    return float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")


def reset_pool_line(reset_pool: int | None, metrics: dict[str, np.ndarray]) -> str | None:
    """With ``reset_pool`` set, how many of the finished episodes (all runs and updates) began
    from a start an earlier episode of the same env and rollout had used; None without it."""
    if reset_pool is None:
        return None
    repeated = int(np.sum(metrics["repeated_starts"]))
    finished = int(np.sum(metrics["episodes_finished"]))
    share = 100.0 * repeated / finished if finished else 0.0
    hint = "; a larger --reset-pool draws more fresh starts" if repeated else ""
    return (
        f"reset pool of {reset_pool} start(s) per env per rollout: {repeated:,} of {finished:,} "
        f"finished episodes ({share:.1f}%) began from a start already used{hint}"
    )


def print_final_returns(result: RunResult) -> None:
    """Each seed's final return (mean of its last 10 updates), per grid point."""
    from ppojax.runs.experiment import final_return_table

    print("final return (mean of the last 10 updates):")
    print_return_rows(final_return_table(result))
    print("final episode length (mean of the last 10 updates):")
    print_return_rows(final_return_table(result, "episode_length"))


def print_final_eval_returns(result: RunResult) -> None:
    """Each seed's last evaluation return, per grid point; nothing without evaluation."""
    from ppojax.runs.experiment import final_return_table

    if "eval_return" not in result.metrics:
        return
    config = result.experiment.config
    mode = "deterministic" if config.eval_deterministic else "sampled"
    print(f"final evaluation return ({config.eval_episodes} episodes, {mode} actions):")
    print_return_rows(final_return_table(result, "eval_return"))


def print_return_rows(rows: list[dict]) -> None:
    """One line per grid point of ``final_return_table``: each seed's value, mean and std."""
    from ppojax.ppo.summary import point_label

    for row in rows:
        label = point_label(row["point"]) or "per seed"
        seeds = " ".join(f"{value:.1f}" for value in row["per_seed"])
        mean = float("nan") if row["mean"] is None else row["mean"]
        std = float("nan") if row["std"] is None else row["std"]
        print(f"  {label}: {seeds}  (mean {mean:.1f} +- {std:.1f} over seeds)")


def print_divergence(result: RunResult) -> None:
    """One line per run with steps that were not finite (skipped by the divergence guard, or
    applied without it); nothing when none had any."""
    from ppojax.ppo.summary import point_label

    guarded = result.experiment.config.divergence_guard
    for row in result.divergence:
        if row["nonfinite_steps"] == 0:
            continue
        run = result.runs[row["run"]]
        point = {name: value for name, value in run.items() if name not in ("run", "seed")}
        which = ", ".join(filter(None, [f"seed {run['seed']}", point_label(point)]))
        if not guarded:
            print(
                f"not finite, run {row['run']} ({which}): {row['nonfinite_steps']} minibatch "
                f"step(s) with a NaN or inf loss or gradients, first at update "
                f"{row['first_update']}, applied (divergence_guard is off)"
            )
            continue
        state = "recovered" if row["recovered"] else "NOT recovered: its last update skipped steps"
        print(
            f"divergence guard, run {row['run']} ({which}): {row['nonfinite_steps']} minibatch "
            f"step(s) skipped (NaN or inf), first at update {row['first_update']}; {state}"
        )
