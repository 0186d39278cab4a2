"""Sizing a language-model post-training step on accelerators before renting them
(``ppojax plan``): the step a command trains, built from a config.json's shapes alone,
compiled for 1-N H100s, H200s or TPU chips on a CPU, its bytes per device, launches, a step
time estimate against published figures, and the verdict. It sits above the LM library
(``ppojax.rlhf``), which never imports it."""

from ppojax.plan.planner import PlanError, StepShape
from ppojax.plan.sizing import Plan, plan

__all__ = ["Plan", "PlanError", "StepShape", "plan"]
