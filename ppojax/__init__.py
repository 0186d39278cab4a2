"""ppojax: Proximal Policy Optimization as one jitted, vmappable pure function."""

from ppojax import deprecation
from ppojax.engine.gae import compute_gae
from ppojax.envs import list_envs, make_env, register_env
from ppojax.ppo.config import PRESETS, ConfigError, PPOConfig
from ppojax.ppo.evaluation import EVAL_METRIC_NAMES
from ppojax.ppo.pbt import PBTOutput, pbt
from ppojax.ppo.sweeps import SweepOutput, best_point, sweep, sweep_table
from ppojax.ppo.train import init_state, run_updates, train
from ppojax.ppo.types import METRIC_NAMES, TrainOutput, TrainState, Transition
from ppojax.ppo.update import adaptive_kl_update
from ppojax.runs.policy import load
from ppojax.runtime.compiling import compiler_options, limit_cpu_threads, use_cpu_devices

__version__ = "0.1.0"

# the module paths and names of the previous layout import until ppojax.moved.REMOVED_IN
deprecation.install()

__all__ = [
    "EVAL_METRIC_NAMES",
    "METRIC_NAMES",
    "ConfigError",
    "PBTOutput",
    "PPOConfig",
    "PRESETS",
    "SweepOutput",
    "TrainOutput",
    "TrainState",
    "Transition",
    "adaptive_kl_update",
    "best_point",
    "compiler_options",
    "limit_cpu_threads",
    "compute_gae",
    "init_state",
    "list_envs",
    "load",
    "make_env",
    "pbt",
    "register_env",
    "run_updates",
    "sweep",
    "sweep_table",
    "train",
    "use_cpu_devices",
]
