"""The host side of one run and of many: an ``Experiment`` (seeds x a grid) trained in
compiled chunks into a run folder, with progress, checkpoints, resume and loggers."""

from ppojax.runs.experiment import RunResult, resume_experiment, run_experiment
from ppojax.runs.options import RunOptions
from ppojax.runs.settings import Experiment

__all__ = ["Experiment", "RunOptions", "RunResult", "resume_experiment", "run_experiment"]
