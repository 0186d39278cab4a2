"""Environments: gymnax ids, registered ids and suite ids behind one wrapper with episode
statistics."""

from ppojax.envs.env import (
    EnvSpec,
    EpisodeState,
    MultiDiscrete,
    PPOEnv,
    StepResult,
    list_envs,
    make_env,
)
from ppojax.envs.registry import SUITES, register_env, registered_envs

__all__ = [
    "SUITES",
    "EnvSpec",
    "EpisodeState",
    "MultiDiscrete",
    "PPOEnv",
    "StepResult",
    "list_envs",
    "make_env",
    "register_env",
    "registered_envs",
]
