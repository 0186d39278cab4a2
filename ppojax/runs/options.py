"""``RunOptions``: what a user chooses to show and keep of a run, the one options type of every
run folder's driver (``ppojax.runs.experiment`` for PPO runs and sweeps, and
``ppojax.runs.loop.train_loop`` for the language-model commands). How a driver loops (its
steps, a resume, the step's hooks) is its own arguments, not an option of the user's."""

from __future__ import annotations

import dataclasses

from ppojax.checks import check_bool, check_positive_int, show
from ppojax.runs.loggers import WandbOptions


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How to run: progress bar (about ``progress_reports`` updates of it over an env run),
    checkpoints every N updates or steps (None: at the end only; the final state is always
    saved when there is a run folder), how many to keep (None: all), TensorBoard, Weights &
    Biases (``wandb``: where to log, None: not at all; see ``ppojax.runs.loggers``), and the
    modules that register the env (``--env-module``; recorded in run.json, imported again by
    ``--resume`` and ``load``). TensorBoard and ``wandb`` are the env runs' loggers: the
    language-model commands log to W&B through a hook of ``train_loop``."""

    progress: bool = True
    checkpoint_every: int | None = None
    keep_checkpoints: int | None = 3
    tensorboard: bool = False
    progress_reports: int = 50
    wandb: WandbOptions | None = None
    env_modules: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("progress", "tensorboard"):
            check_bool("RunOptions", name, getattr(self, name))
        for name in ("checkpoint_every", "keep_checkpoints"):
            if getattr(self, name) is not None:
                check_positive_int("RunOptions", name, getattr(self, name))
        check_positive_int("RunOptions", "progress_reports", self.progress_reports)
        if self.wandb is not None and not isinstance(self.wandb, WandbOptions):
            raise TypeError(
                f"RunOptions.wandb must be WandbOptions or None, got {show(self.wandb)}"
            )
