"""Craftax (``craftax/<id>``, ``pip install "ppojax[craftax]"``) behind gymnax's API.

Craftax follows gymnax's older API: its ``step_env`` returns one ``done`` that is true both
when the player dies (or walks into lava) and at the time limit ``params.max_timesteps``. The
adapter wraps craftax's envs without auto-reset and splits that ``done``: ``terminated`` is
craftax's own terminal test with the time limit lifted, ``truncated`` the rest (the time
limit), so GAE bootstraps episodes that ran out of time. Symbolic ids observe a flat vector
(Classic: [1345]), Pixels ids an image [H, W, 3].

``env_kwargs`` override fields of craftax's ``EnvParams`` (``max_timesteps``, ...).
"""

from __future__ import annotations

from typing import Any

import jax
from craftax.craftax_env import make_craftax_env_from_name
from gymnax.environments import spaces

from ppojax.envs.suites.adapter import Adapter, AdapterState, SuiteStep, unknown_name

NAMES = (
    "Craftax-Classic-Symbolic-v1",
    "Craftax-Classic-Pixels-v1",
    "Craftax-Symbolic-v1",
    "Craftax-Pixels-v1",
)
NO_TIME_LIMIT = 2**31 - 1


class Craftax(Adapter):
    """A craftax env (without auto-reset) with terminated and truncated apart."""

    suite = "craftax"

    def reset_suite(self, key: jax.Array, params: Any) -> tuple[jax.Array, Any, None]:
        obs, inner = self.env.reset_env(key, params)
        return obs, inner, None

    def step_suite(
        self, key: jax.Array, state: AdapterState, action: jax.Array, params: Any
    ) -> SuiteStep:
        obs, inner, reward, done, _ = self.env.step_env(key, state.inner, action, params)
        terminated = self.env.is_terminal(inner, params.replace(max_timesteps=NO_TIME_LIMIT))
        truncated = done & ~terminated
        return SuiteStep(obs, inner, reward, terminated, truncated)

    def time_limit(self, params: Any) -> int:
        return int(params.max_timesteps)

    def action_space(self, params: Any) -> spaces.Discrete:
        return spaces.Discrete(int(self.env.num_actions))

    def observation_space(self, params: Any) -> Any:
        space = self.env.observation_space(params)
        return spaces.Box(space.low, space.high, tuple(space.shape), space.dtype)


def make(name: str) -> tuple[Craftax, Any]:
    """``(env, env_params)`` of craftax's ``name``, without craftax's own auto-reset."""
    if name not in NAMES:
        raise unknown_name(Craftax.suite, name, NAMES)
    env = make_craftax_env_from_name(name, auto_reset=False)
    return Craftax(env, name), env.default_params
