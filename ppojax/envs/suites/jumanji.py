"""Jumanji (``jumanji/<id>``, ``pip install "ppojax[jumanji]"``) behind gymnax's API.

Jumanji's ``step(state, action) -> (state, timestep)`` marks an episode's end with
``timestep.last()``; ``discount`` 0 there is a terminal state, 1 a truncation. Several envs
(Snake among them) end at their ``time_limit`` with discount 0 as well; a step that reaches
``state.step_count >= env.time_limit`` is counted as truncated here, so GAE bootstraps it.

Observations: a jumanji observation (a NamedTuple) becomes a dict of its fields without
``action_mask`` (a pytree, e.g. Snake's ``{"grid": [12, 12, 5], "step_count": []}``); an array
observation stays an array. The ``action_mask`` goes to the policy instead: masked actions get
probability 0. Actions: ``DiscreteArray`` is Discrete; ``MultiDiscreteArray`` is ppojax's
MultiDiscrete, masked per choice when the mask has one entry per value of each choice; when
the mask is over all combinations ([n_1, ..., n_k], as in Minesweeper), the action is one
Discrete(n_1 * ... * n_k) index into them, which keeps the mask exact. Float
``BoundedArray`` actions are a Box.

``env_kwargs`` go to ``jumanji.make(id, **env_kwargs)`` (the env's constructor, e.g.
``time_limit``); jumanji envs have no params dataclass.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import jumanji
import numpy as np
from gymnax.environments import spaces
from jumanji import specs

from ppojax.envs.env import MultiDiscrete
from ppojax.envs.suites.adapter import (
    Adapter,
    AdapterState,
    NoParams,
    SuiteStep,
    observation_space_of,
    unknown_name,
)

MASK_FIELD = "action_mask"


def split_observation(observation: Any) -> tuple[Any, Any]:
    """A jumanji observation as (what the network sees, the action mask or None)."""
    if not hasattr(observation, "_asdict"):
        return observation, None
    fields = observation._asdict()
    mask = fields.pop(MASK_FIELD, None)
    return fields, mask


class Jumanji(Adapter):
    """A jumanji env, its observation split into what the network sees and the action mask."""

    suite = "jumanji"

    def __init__(self, env: Any, name: str) -> None:
        super().__init__(env, name)
        spec = env.action_spec() if callable(env.action_spec) else env.action_spec
        self.spec = spec
        state, timestep = jax.eval_shape(env.reset, jax.random.key(0))
        self.obs_shape, mask = split_observation(timestep.observation)
        self.mask_shape = None if mask is None else tuple(mask.shape)
        nvec = tuple(int(n) for n in np.asarray(getattr(spec, "num_values", 0)).reshape(-1))
        # One Discrete over all combinations where the mask is over all combinations.
        self.joint = isinstance(spec, specs.MultiDiscreteArray) and self.mask_shape == nvec
        self.nvec = nvec

    def reset_suite(self, key: jax.Array, params: Any) -> tuple[Any, Any, Any]:
        inner, timestep = self.env.reset(key)
        obs, mask = split_observation(timestep.observation)
        return obs, inner, mask

    def step_suite(
        self, key: jax.Array, state: AdapterState, action: jax.Array, params: Any
    ) -> SuiteStep:
        inner, timestep = self.env.step(state.inner, self.env_action(action))
        obs, mask = split_observation(timestep.observation)
        last = timestep.last()
        truncated = last & ((timestep.discount > 0) | self.timed_out(inner))
        terminated = last & ~truncated
        return SuiteStep(obs, inner, timestep.reward, terminated, truncated, mask)

    def timed_out(self, inner: Any) -> jax.Array:
        """Whether the env's own time limit ended the episode (False for envs without one)."""
        limit, count = getattr(self.env, "time_limit", None), getattr(inner, "step_count", None)
        if limit is None or count is None:
            return jnp.bool_(False)
        return count >= limit

    def time_limit(self, params: Any) -> int:
        """The env's ``time_limit``; 1000 steps for envs without one."""
        return int(getattr(self.env, "time_limit", 1000))

    def env_action(self, action: jax.Array) -> jax.Array:
        if self.joint:
            return jnp.stack(jnp.unravel_index(action, self.nvec)).astype(jnp.int32)
        return action

    def action_space(self, params: Any) -> Any:
        spec = self.spec
        if isinstance(spec, specs.MultiDiscreteArray):
            return spaces.Discrete(math.prod(self.nvec)) if self.joint else MultiDiscrete(self.nvec)
        if isinstance(spec, specs.DiscreteArray):
            return spaces.Discrete(int(spec.num_values))
        return spaces.Box(np.asarray(spec.minimum), np.asarray(spec.maximum), spec.shape)

    def observation_space(self, params: Any) -> Any:
        return observation_space_of(self.obs_shape)


class MaskedJumanji(Jumanji):
    """A jumanji env whose action mask fits its action space: the policy gets the mask."""

    def action_mask(self, state: AdapterState, params: Any) -> jax.Array:
        return state.action_mask.reshape(-1)


def _masked(env: Jumanji) -> bool:
    """Whether the env's mask fits its action space (see the module's docstring)."""
    if env.mask_shape is None:
        return False
    size = math.prod(env.mask_shape)
    if env.joint or isinstance(env.spec, specs.DiscreteArray):
        return True
    return isinstance(env.spec, specs.MultiDiscreteArray) and size == sum(env.nvec)


def make(name: str, **kwargs: Any) -> tuple[Jumanji, NoParams]:
    """``(env, params)`` of jumanji's ``name`` (``jumanji.make(name, **kwargs)``)."""
    known = sorted(jumanji.registered_environments())
    if name not in known:
        raise unknown_name(Jumanji.suite, name, known)
    env = Jumanji(jumanji.make(name, **kwargs), name)
    if _masked(env):
        env = MaskedJumanji(env.env, name)
    return env, NoParams()
