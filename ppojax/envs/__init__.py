"""Environments: gymnax ids behind one wrapper with episode statistics."""

from ppojax.envs.wrappers import EnvSpec, EpisodeState, PPOEnv, StepResult, list_envs, make_env

__all__ = ["EnvSpec", "EpisodeState", "PPOEnv", "StepResult", "list_envs", "make_env"]
