"""XLand-MiniGrid (``xminigrid/<id>``, ``pip install "ppojax[xminigrid]"``) behind gymnax's API.

xminigrid's ``step(params, timestep, action)`` returns a ``TimeStep`` whose ``step_type`` is
LAST at the end of an episode and whose ``discount`` is 0 only where the goal was reached: a
LAST step with discount 1 is the time limit (``params.max_steps``), so ``terminated`` is
``last & discount == 0`` and ``truncated`` is ``last & discount > 0``. Observations are the
agent's egocentric view [view_size, view_size, 2] (tile, colour); actions are Discrete(6).

``env_kwargs`` that name a field of xminigrid's ``EnvParams`` (``max_steps``, ``view_size``,
``height``, ``width``) override it; the rest go to ``xminigrid.make``. The XLand-MiniGrid-R*
meta-RL envs need a ruleset from a benchmark that xminigrid downloads, so only the MiniGrid-*
ids train as they are.
"""

from __future__ import annotations

from typing import Any

import jax
import xminigrid
from gymnax.environments import spaces

from ppojax.envs.suites.adapter import Adapter, AdapterState, SuiteStep, box_like, unknown_name


class XMiniGrid(Adapter):
    """An xminigrid env, its TimeStep's ``discount`` telling the two ends apart."""

    suite = "xminigrid"

    def reset_suite(self, key: jax.Array, params: Any) -> tuple[jax.Array, Any, None]:
        timestep = self.env.reset(params, key)
        return timestep.observation, timestep, None

    def step_suite(
        self, key: jax.Array, state: AdapterState, action: jax.Array, params: Any
    ) -> SuiteStep:
        timestep = self.env.step(params, state.inner, action)
        last = timestep.last()
        terminated = last & (timestep.discount == 0)
        truncated = last & (timestep.discount > 0)
        obs, reward = timestep.observation, timestep.reward
        return SuiteStep(obs, timestep, reward, terminated, truncated)

    def time_limit(self, params: Any) -> int:
        return int(params.max_steps)

    def action_space(self, params: Any) -> spaces.Discrete:
        return spaces.Discrete(int(self.env.num_actions(params)))

    def observation_space(self, params: Any) -> spaces.Box:
        shape = jax.eval_shape(lambda key: self.env.reset(params, key), jax.random.key(0))
        return box_like(shape.observation)


def make(name: str, **kwargs: Any) -> tuple[XMiniGrid, Any]:
    """``(env, env_params)`` of xminigrid's ``name`` (``xminigrid.make(name, **kwargs)``)."""
    known = xminigrid.registered_environments()
    if name not in known:
        raise unknown_name(XMiniGrid.suite, name, known)
    env, params = xminigrid.make(name, **kwargs)
    return XMiniGrid(env, name), params
