"""NAVIX (``navix/<id>``, ``pip install "ppojax[navix]"``) behind gymnax's API.

NAVIX's ``step(timestep, action)`` resets an episode one call after it ends (the call after a
done returns the reset timestep instead of a transition); the adapter steps with the
transition alone (``Environment._step``, what ``step`` runs when it does not reset), so an
episode's end is the step that reached it and the resets are drawn the batched way the
gymnax path draws them. A timestep's ``step_type`` is 2 where the episode reached a terminal
state (the goal, lava) and 1 at the time limit (``max_steps``): ``terminated`` and
``truncated``. Observations keep NAVIX's shape (the default symbolic grid [H, W, 3], or
the image of a ``-rgb`` observation function); actions are Discrete over the env's action set.

``env_kwargs`` go to ``navix.make(id, **env_kwargs)`` (``max_steps``, ``observation_fn``, ...).
"""

from __future__ import annotations

from typing import Any

import jax
import navix
from gymnax.environments import spaces

from ppojax.envs.suites.adapter import (
    Adapter,
    AdapterState,
    NoParams,
    SuiteStep,
    box_like,
    unknown_name,
)

TERMINATION = 2
TRUNCATION = 1


class Navix(Adapter):
    """A NAVIX env, stepped without its own reset."""

    suite = "navix"
    observation_attribute = "observation"  # reset(key) gives a Timestep

    def step_suite(
        self, key: jax.Array, state: AdapterState, action: jax.Array, params: NoParams
    ) -> SuiteStep:
        timestep = self.env._step(state.inner, action)  # the transition, without the reset
        terminated = timestep.step_type == TERMINATION
        truncated = timestep.step_type == TRUNCATION
        obs, reward = timestep.observation, timestep.reward
        return SuiteStep(obs, timestep, reward, terminated, truncated)

    def time_limit(self, params: NoParams) -> int:
        return int(self.env.max_steps)

    def action_space(self, params: Any) -> spaces.Discrete:
        return spaces.Discrete(len(self.env.action_set))

    def observation_space(self, params: Any) -> spaces.Box:
        shape = jax.eval_shape(self.env.reset, jax.random.key(0))
        return box_like(shape.observation)


def make(name: str, **kwargs: Any) -> tuple[Navix, NoParams]:
    """``(env, NoParams())`` of NAVIX's ``name`` (``navix.make(name, **kwargs)``)."""
    known = sorted(navix.registry())
    if name not in known:
        raise unknown_name(Navix.suite, name, known)
    return Navix(navix.make(name, **kwargs), name), NoParams()
