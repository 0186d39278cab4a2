"""What the suite adapters share: a gymnax ``Environment`` around another suite's env.

``Adapter`` implements gymnax's ``reset_env`` / ``step_env`` once, and each suite's adapter
only translates its library: ``reset_suite`` gives the first observation, the suite's own
state and the action mask, ``step_suite`` a ``SuiteStep``. ``Adapter`` keeps the suite's state
in ``AdapterState`` together with the flags gymnax's API needs and other suites fold into one
``done``: whether the last step ended the episode by a time limit (``truncated``, read by
``is_truncated``) rather than by reaching a terminal state (``terminated``, returned by
``step_env``). Since adapters leave gymnax's ``step`` as it is, ``PPOEnv.step_from`` draws
their auto-resets in one batch per rollout, as for gymnax's own envs, and keeps the true
final observation of every episode.

This module imports gymnax, so it is imported only by the adapters, when a suite id is built.
"""

from __future__ import annotations

import difflib
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from gymnax.environments import environment, spaces

from ppojax.checks import ConfigError


@struct.dataclass
class AdapterState:
    inner: Any  # the suite's own state (and timestep, where the suite has one)
    action_mask: Any  # bool [n] of the actions allowed now, or None for suites without masks
    truncated: jax.Array  # the step that led here ended the episode by a time limit
    time: jax.Array  # steps since the reset


class SuiteStep(NamedTuple):
    """One step of a suite in gymnax's terms: ``terminated`` where the episode reached a
    terminal state, ``truncated`` where a time limit ended it."""

    obs: Any
    inner: Any  # the suite's new state
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    action_mask: Any = None


@struct.dataclass
class NoParams:
    """Env params of suites whose settings all go to the constructor (``env_kwargs``)."""


class Adapter(environment.Environment):
    """Base of the adapters: the suite's env ``env`` under the id ``<suite>/<env_name>``;
    ``is_truncated`` reads the flag ``step_env`` stored. Each adapter sets ``suite`` (its id
    prefix) and gives ``reset_suite`` (or ``observation_attribute``), ``step_suite`` and
    ``time_limit(params)``, the most steps of an episode (``ppojax eval`` runs episodes that
    long)."""

    suite: ClassVar[str]

    def __init__(self, env: Any, name: str) -> None:
        self.env = env
        self.env_name = name

    @property
    def name(self) -> str:
        return f"{self.suite}/{self.env_name}"

    def is_truncated(self, state: AdapterState, params: Any) -> jax.Array:
        return state.truncated

    def reset_env(self, key: jax.Array, params: Any) -> tuple[Any, AdapterState]:
        obs, inner, action_mask = self.reset_suite(key, params)
        return obs, AdapterState(inner, action_mask, jnp.bool_(False), jnp.int32(0))

    def step_env(
        self, key: jax.Array, state: AdapterState, action: jax.Array, params: Any
    ) -> tuple[Any, AdapterState, jax.Array, jax.Array, dict[str, Any]]:
        """gymnax's (obs, state, reward as float32, terminated, info) of the suite's step."""
        step = self.step_suite(key, state, action, params)
        truncated = jnp.asarray(step.truncated, jnp.bool_)
        next_state = AdapterState(step.inner, step.action_mask, truncated, state.time + 1)
        return step.obs, next_state, jnp.asarray(step.reward, jnp.float32), step.terminated, {}

    # For suites whose ``reset(key)`` returns one state that holds the observation (brax's
    # State, NAVIX's Timestep): the attribute it is in. None: the adapter gives reset_suite.
    observation_attribute: ClassVar[str | None] = None

    def reset_suite(self, key: jax.Array, params: Any) -> tuple[Any, Any, Any]:
        """The suite's reset: (first observation, its state, the action mask or None)."""
        if self.observation_attribute is None:
            raise NotImplementedError
        inner = self.env.reset(key)
        return getattr(inner, self.observation_attribute), inner, None

    def step_suite(
        self, key: jax.Array, state: AdapterState, action: jax.Array, params: Any
    ) -> SuiteStep:
        """The suite's step from ``state.inner`` (``state.time`` counts the steps so far)."""
        raise NotImplementedError


def box_like(leaf: Any) -> spaces.Box:
    """An unbounded Box of the shape and dtype of an array (or ``ShapeDtypeStruct``)."""
    return spaces.Box(-np.inf, np.inf, tuple(leaf.shape), leaf.dtype)


def observation_space_of(obs: Any) -> spaces.Box | spaces.Dict:
    """A Box for one array, a Dict of Boxes for a dict of arrays (shapes of ``obs``)."""
    if isinstance(obs, dict):
        return spaces.Dict({name: box_like(leaf) for name, leaf in obs.items()})
    return box_like(obs)


def unknown_name(suite: str, name: str, known: list[str] | tuple[str, ...]) -> ConfigError:
    """The ``ConfigError`` for ``suite/name`` when the suite has no env ``name``."""
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.5)
    hint = f" Close matches: {', '.join(f'{suite}/{c}' for c in close)}." if close else ""
    return ConfigError(
        "env_id",
        f"PPOConfig.env_id {suite}/{name!r}: {suite} has no env {name!r}.{hint} "
        f"Its ids: {', '.join(sorted(known))}.",
    )
