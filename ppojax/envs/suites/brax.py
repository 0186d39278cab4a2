"""Brax (``brax/<name>``, ``pip install "ppojax[brax]"``) behind gymnax's API.

Brax's ``step(state, action) -> state`` sets ``state.done`` 1 where the episode reached a
terminal state (a fallen pendulum, a hopper on its back) and has no time limit of its own: the
adapter ends an episode after ``max_steps_in_episode`` steps (1000, brax's training default)
as a truncation, so GAE bootstraps it, and keeps the true final observation. Brax resets to a
random state drawn from the reset key, one per episode, drawn in one batch per rollout as for
gymnax's envs (brax's own ``AutoResetWrapper`` would restart every episode from one state).

Observations are brax's vector ``state.obs`` [observation_size]; actions a Box [-1, 1]^d.
``env_kwargs``: ``max_steps_in_episode`` overrides the env params; ``backend`` (brax's
``generalized``, ``positional``, ``spring`` or ``mjx``) and the rest go to
``brax.envs.get_environment(name, **env_kwargs)``.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from brax import envs
from flax import struct
from gymnax.environments import spaces

from ppojax.envs.suites.adapter import (
    Adapter,
    AdapterState,
    SuiteStep,
    observation_space_of,
    unknown_name,
)


@struct.dataclass
class BraxParams:
    max_steps_in_episode: int = 1000


class Brax(Adapter):
    """A brax env with a time limit."""

    suite = "brax"  # the ids' prefix; suites with brax's interface (Playground) subclass this
    observation_attribute = "obs"  # reset(key) gives a brax State

    def step_suite(
        self, key: jax.Array, state: AdapterState, action: jax.Array, params: BraxParams
    ) -> SuiteStep:
        inner = self.env.step(state.inner, action)
        terminated = inner.done > 0.5
        truncated = ~terminated & (state.time + 1 >= params.max_steps_in_episode)
        return SuiteStep(inner.obs, inner, inner.reward, terminated, truncated)

    def time_limit(self, params: BraxParams) -> int:
        return int(params.max_steps_in_episode)

    def action_space(self, params: Any) -> spaces.Box:
        size = self.env.action_size
        return spaces.Box(-np.ones(size, np.float32), np.ones(size, np.float32), (size,))

    def observation_space(self, params: Any) -> spaces.Box | spaces.Dict:
        return observation_space_of(jax.eval_shape(self.env.reset, jax.random.key(0)).obs)


def make(name: str, **kwargs: Any) -> tuple[Brax, BraxParams]:
    """``(env, params)`` of brax's ``name`` (``brax.envs.get_environment(name, **kwargs)``)."""
    known = sorted(envs._envs)  # brax keeps its registry in this dict; get_environment reads it
    if name not in known:
        raise unknown_name(Brax.suite, name, known)
    return Brax(envs.get_environment(name, **kwargs), name), BraxParams()
