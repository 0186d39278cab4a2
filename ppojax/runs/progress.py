"""The host side of a PPO run: what it shows and writes while the compiled chunks train.

``ChunkHandler`` is the hook of ``ppojax.runs.loop`` that receives every chunk's metrics and
states and feeds the progress bar (``loop.ProgressBar``), metrics.csv, TensorBoard
(``TensorBoardLog``), Weights & Biases and the checkpoints, as the ``RunOptions``
(``ppojax.runs.options``) ask. ``ppojax.runs.experiment`` runs the chunks and hands them over;
nothing here compiles or traces.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ppojax.ppo.config import PPOConfig
from ppojax.ppo.evaluation import EVAL_METRIC_NAMES
from ppojax.ppo.types import TrainState
from ppojax.runs import checkpoints, folder
from ppojax.runs.loggers import WandbLog
from ppojax.runs.loop import ProgressBar, write_rows
from ppojax.runs.options import RunOptions

# What the bar shows, as {metric: label}: the return, and the episode length beside it, since
# on some tasks (a goal reward of 1 whatever the time taken) only the length shows learning.
BAR_METRICS = {"episode_return": "return", "episode_length": "length", "eval_return": "eval"}


def divergence_report(nonfinite: np.ndarray | None) -> list[dict[str, Any]]:
    """Per run, from ``nonfinite_steps`` [runs, U]: the minibatch steps the guard skipped in
    all, the first update (counted from 1) that skipped any (None if none did), the steps its
    last update skipped, and ``recovered``: whether that last update skipped none. A run
    whose last update still skipped steps has not recovered, whatever happened before."""
    if nonfinite is None:
        return []
    rows = []
    for run, counts in enumerate(np.asarray(nonfinite)):
        hits = np.flatnonzero(counts > 0)
        last = int(counts[-1]) if counts.size else 0
        rows.append(
            {
                "run": run,
                "nonfinite_steps": int(counts.sum()),
                "first_update": int(hits[0]) + 1 if hits.size else None,
                "last_update_skipped": last,
                "recovered": last == 0,
            }
        )
    return rows


class TensorBoardLog:
    """TensorBoard event files, one folder per run, every metric against env steps."""

    def __init__(self, run_dir: Path, runs: Sequence[dict[str, Any]]) -> None:
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            raise ValueError(
                "--tensorboard needs tensorboardX: pip install 'ppojax[tensorboard]'"
            ) from None
        log_dir = Path(run_dir) / folder.TENSORBOARD_DIR
        self.writers = [SummaryWriter(str(log_dir / f"run-{run['run']}")) for run in runs]

    def write(self, first: int, metrics: dict[str, np.ndarray], batch_size: int) -> None:
        for run, writer in enumerate(self.writers):
            for offset in range(next(iter(metrics.values())).shape[1]):
                step = (first + offset + 1) * batch_size
                for name, values in metrics.items():
                    value = float(values[run, offset])
                    # NaN marks an update without an evaluation: no point to draw.
                    if name not in EVAL_METRIC_NAMES or np.isfinite(value):
                        writer.add_scalar(name, value, step)

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


class ChunkHandler:
    """What happens on the host after each chunk: keep the metrics, advance the progress bar,
    append to metrics.csv and TensorBoard, and checkpoint on multiples of checkpoint_every."""

    def __init__(
        self,
        config: PPOConfig,
        runs: list[dict[str, Any]],
        run_dir: Path | None,
        options: RunOptions,
        start: int,
        record: dict[str, Any] | None = None,
    ) -> None:
        """``runs``: one {"run", "seed", **grid point} per run, in run order; ``record``: what
        every checkpoint records of the experiment (see ``checkpoints.open_checkpoints``)."""
        self.config, self.run_dir, self.options = config, run_dir, options
        self.runs = runs
        # Grid values get a prefix: a swept field can share its name with a metric
        # (learning_rate is both).
        self.columns = [
            {
                name if name in ("run", "seed") else f"grid_{name}": value
                for name, value in run.items()
            }
            for run in self.runs
        ]
        self.chunks: list[dict[str, np.ndarray]] = []
        self.warned_divergence = False
        # A resumed run starts from a checkpoint that is already on disk.
        self.saved_step: int | None = start or None
        self.bar = self.checkpoints = self.tensorboard = self.wandb = None
        if options.progress:
            self.bar = ProgressBar(
                config.num_updates,
                start,
                BAR_METRICS,
                scale=len(runs) * config.batch_size,
                description=f"{config.env_id} x{len(runs)}",
            )
        if run_dir is not None:
            self.checkpoints = checkpoints.open_checkpoints(
                run_dir, options.keep_checkpoints, clean=True, record=record
            )
            if options.tensorboard:
                self.tensorboard = TensorBoardLog(run_dir, self.runs)
        if options.wandb is not None:
            self.wandb = WandbLog(options.wandb, config, self.runs, run_dir)

    def __call__(self, first: int, state: TrainState, metrics: dict[str, np.ndarray]) -> None:
        count = next(iter(metrics.values())).shape[1]
        config = self.config
        self.chunks.append(metrics)
        if self.run_dir is not None:
            write_rows(self.run_dir, self.columns, first, metrics)
        if self.tensorboard is not None:
            self.tensorboard.write(first, metrics, config.batch_size)
        if self.wandb is not None:
            self.wandb.log(first, metrics)
        every = self.options.checkpoint_every
        if self.checkpoints is not None and every and (first + count) % every == 0:
            self.save(first + count, state)
        if self.bar is not None:
            self.bar(first, state, metrics)
        self.note_divergence(first, metrics)

    def note_divergence(self, first: int, metrics: dict[str, np.ndarray]) -> None:
        """Say on stderr, once, that the guard skipped steps (an overnight run shows it long
        before its end): the first such update of the chunk and its run."""
        skipped = metrics.get("nonfinite_steps")
        if self.warned_divergence or skipped is None or not skipped.any():
            return
        self.warned_divergence = True
        offset, run = np.argwhere(skipped.T > 0)[0]
        update, steps = first + offset + 1, int(skipped[run, offset])
        if self.config.divergence_guard:
            message = (
                f"ppojax: at update {update} the divergence guard skipped {steps} minibatch "
                f"step(s) of run {run} (a NaN or inf in the loss, gradients or parameters); "
                "training goes on from the last finite parameters"
            )
        else:
            message = (
                f"ppojax: at update {update} {steps} minibatch step(s) of run {run} had a NaN "
                "or inf loss or gradients and were applied (divergence_guard is off): its "
                "parameters are no longer finite; set divergence_guard=True to skip such steps"
            )
        if self.bar is not None:
            self.bar.write(message)
        else:
            print(message, file=sys.stderr, flush=True)

    def save(self, step: int, state: TrainState) -> None:
        checkpoints.save_checkpoint(self.checkpoints, step, state)
        self.saved_step = step

    def finish(self, state: TrainState) -> dict[str, np.ndarray]:
        """Save the final state and close; the metrics [runs, U] of the updates trained here."""
        final = self.config.num_updates
        if self.checkpoints is not None and self.saved_step != final:
            self.save(final, state)
        self.close(failed=False)
        if not self.chunks:
            return {}
        return {name: np.concatenate([c[name] for c in self.chunks], 1) for name in self.chunks[0]}

    def close(self, failed: bool = True) -> None:
        """Close the checkpoint manager, TensorBoard files and the bar (also after an error);
        W&B runs only when ``failed`` (a finished experiment closes them in ``finish_wandb``,
        with its summary)."""
        if self.checkpoints is not None:
            self.checkpoints.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.bar is not None:
            self.bar.close()
        if self.wandb is not None and failed:
            self.wandb.abort()

    def finish_wandb(self, metrics: dict[str, np.ndarray], diverged_runs: list[int]) -> None:
        """The W&B summaries of a finished experiment (its metrics [runs, U] and the runs
        that never recovered from divergence), then close its W&B runs."""
        if self.wandb is not None:
            self.wandb.finish(metrics, diverged_runs)
