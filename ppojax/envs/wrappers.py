"""One wrapper around a gymnax environment for PPO.

It casts observations to float32 arrays of the env's own shape ([H, W, C] images stay images;
the networks flatten what they need), clips continuous actions to the action-space
bounds (the policy's unclipped action is what the loss sees), keeps ``terminated`` apart
from ``truncated``, exposes the true final observation of an episode that ended, and records
the return and length of each finished episode.

gymnax is imported inside the functions that need it: importing gymnax creates arrays, which
starts JAX's backend, and importing ppojax must not, so that ``jax.distributed.initialize``
can still run after ``import ppojax``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ppojax.config import check_env_id


class EnvSpec(NamedTuple):
    """Static description of an environment's observation and action spaces."""

    obs_dim: int
    discrete: bool
    action_dim: int  # number of actions when discrete, action vector size when continuous
    action_low: tuple[float, ...] | None
    action_high: tuple[float, ...] | None


@struct.dataclass
class EpisodeState:
    env_state: Any
    episode_return: jax.Array  # running return of the current episode
    episode_length: jax.Array


class StepResult(NamedTuple):
    """What one step of one env gives back (batch dims added by vmap)."""

    obs: jax.Array  # first observation of the next episode where the episode ended
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    next_obs: jax.Array  # true next observation: the final one where the episode ended
    episode_return: jax.Array  # return of the episode that ended at this step, else 0
    episode_length: jax.Array


def list_envs() -> list[str]:
    """Every environment id ppojax can train on (gymnax's registry)."""
    import gymnax

    return list(gymnax.registered_envs)


def _obs_dim(name: str, obs_space: Any) -> int:
    from gymnax.environments import spaces

    if not isinstance(obs_space, (spaces.Box, spaces.Discrete)):
        raise ValueError(
            f"{name}: observation space {obs_space!r} is not supported; ppojax takes Box and "
            "Discrete observations. Wrap the env so that it returns one Box."
        )
    return int(math.prod(obs_space.shape))


def _box_bounds(name: str, action_space: Any, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The bounds of a Box action space as float32 vectors [size], checked: the Gaussian
    policy samples floats, which the env then gets clipped to [low, high]."""
    if size == 0 or not np.issubdtype(np.dtype(action_space.dtype), np.floating):
        raise ValueError(
            f"{name}: action space {action_space!r} is not supported; the Gaussian policy "
            "needs a Box of float actions with at least one dimension."
        )
    low = np.broadcast_to(np.asarray(action_space.low, np.float32), (size,))
    high = np.broadcast_to(np.asarray(action_space.high, np.float32), (size,))
    if np.isnan(low).any() or np.isnan(high).any() or (low > high).any():
        raise ValueError(
            f"{name}: action space {action_space!r} has NaN bounds or low > high "
            f"(low {low.tolist()}, high {high.tolist()}); fix the env's action_space."
        )
    return low, high


def _space_spec(name: str, obs_space: Any, action_space: Any) -> EnvSpec:
    """The EnvSpec of an env's spaces; a ``ValueError`` naming the env and the space for
    spaces the actor cannot produce actions for (ppojax's policies are a Categorical for
    Discrete and a diagonal Gaussian, clipped to the bounds, for Box; unbounded Box
    dimensions are left unclipped)."""
    from gymnax.environments import spaces

    obs_dim = _obs_dim(name, obs_space)
    if isinstance(action_space, spaces.Discrete):
        if int(action_space.n) < 1:
            raise ValueError(f"{name}: action space {action_space!r} has no actions.")
        return EnvSpec(obs_dim, True, int(action_space.n), None, None)
    if isinstance(action_space, spaces.Box):
        shape = tuple(action_space.shape) or (1,)
        size = int(math.prod(shape))
        low, high = _box_bounds(name, action_space, size)
        return EnvSpec(obs_dim, False, size, tuple(map(float, low)), tuple(map(float, high)))
    raise ValueError(
        f"{name}: action space {action_space!r} is not supported; ppojax trains on Discrete "
        "actions (Categorical policy) and Box actions (Gaussian policy). Wrap the env so that "
        "it takes one of those (for example one Box for a Tuple of Boxes)."
    )


class PPOEnv:
    """A single gymnax env with PPO's bookkeeping; vmap its methods over environments."""

    def __init__(self, env: Any, env_params: Any, name: str | None = None):
        self.env = env
        self.env_params = env_params
        name = name or type(env).__name__
        self.spec = _space_spec(
            name, env.observation_space(env_params), env.action_space(env_params)
        )
        self._action_shape = tuple(env.action_space(env_params).shape)

    def reset(self, key: jax.Array) -> tuple[jax.Array, EpisodeState]:
        obs, env_state = self.env.reset(key, self.env_params)
        state = EpisodeState(env_state, jnp.float32(0.0), jnp.int32(0))
        return self._as_float(obs), state

    @property
    def resets_outside_step(self) -> bool:
        """Whether ``step_from`` can take its reset from outside: true for every env that
        uses gymnax's own auto-resetting ``step`` (all but those that override it)."""
        from gymnax.environments.environment import Environment

        return type(self.env).step is Environment.step

    def step(
        self, key: jax.Array, state: EpisodeState, action: jax.Array
    ) -> tuple[StepResult, EpisodeState]:
        """One step with gymnax's auto-reset: a fresh reset is drawn from ``key``."""
        obs, env_state, reward, terminated, truncated, info = self.env.step(
            key, state.env_state, self._env_action(action), self.env_params
        )
        return self._result(state, obs, env_state, reward, terminated, truncated, info)

    def step_from(
        self,
        key: jax.Array,
        state: EpisodeState,
        action: jax.Array,
        reset: tuple[jax.Array, EpisodeState],
    ) -> tuple[StepResult, EpisodeState]:
        """``step`` with the auto-reset taken from ``reset`` (an ``(obs, state)`` of
        ``self.reset``) instead of drawn inside: the same transition as gymnax's ``step``, so a
        rollout can draw all its resets in one batch instead of one per step. Envs that
        override gymnax's ``step`` fall back to it (``key`` then draws their reset)."""
        if not self.resets_outside_step:
            return self.step(key, state, action)
        params = self.env_params
        obs_step, env_state_step, reward, terminated, info = self.env.step_env(
            key, state.env_state, self._env_action(action), params
        )
        truncated = self.env.is_truncated(env_state_step, params)
        done = jnp.logical_or(terminated, truncated)
        reset_obs, reset_state = reset
        env_state = jax.tree.map(
            lambda fresh, stepped: jax.lax.select(done, fresh, stepped),
            reset_state.env_state,
            env_state_step,
        )
        obs = jax.tree.map(
            lambda fresh, stepped: jax.lax.select(done, fresh, stepped),
            reset_obs,
            self._as_float(obs_step),
        )
        info = {**info, "final_observation": obs_step}
        return self._result(state, obs, env_state, reward, terminated, truncated, info)

    def _result(
        self,
        state: EpisodeState,
        obs: jax.Array,
        env_state: Any,
        reward: jax.Array,
        terminated: jax.Array,
        truncated: jax.Array,
        info: dict[str, Any],
    ) -> tuple[StepResult, EpisodeState]:
        reward = jnp.asarray(reward, jnp.float32)
        done = jnp.logical_or(terminated, truncated)
        episode_return = state.episode_return + reward
        episode_length = state.episode_length + 1
        result = StepResult(
            obs=self._as_float(obs),
            reward=reward,
            terminated=jnp.asarray(terminated, jnp.bool_),
            truncated=jnp.asarray(truncated, jnp.bool_),
            next_obs=self._as_float(info["final_observation"]),
            episode_return=jnp.where(done, episode_return, 0.0),
            episode_length=jnp.where(done, episode_length, 0),
        )
        new_state = EpisodeState(
            env_state,
            jnp.where(done, 0.0, episode_return),
            jnp.where(done, 0, episode_length),
        )
        return result, new_state

    def _env_action(self, action: jax.Array) -> jax.Array:
        if self.spec.discrete:
            return action
        low = jnp.asarray(self.spec.action_low, jnp.float32)
        high = jnp.asarray(self.spec.action_high, jnp.float32)
        return jnp.clip(action, low, high).reshape(self._action_shape)

    @staticmethod
    def _as_float(obs: Any) -> Any:
        """The observation (any pytree of arrays) as float32, shapes kept; a scalar becomes
        [1], so that every observation leaf has at least one axis."""
        return jax.tree.map(lambda leaf: jnp.atleast_1d(jnp.asarray(leaf, jnp.float32)), obs)


def make_env(env_id: str, **env_kwargs: Any) -> PPOEnv:
    """The gymnax environment ``env_id`` with default parameters, wrapped for PPO."""
    check_env_id(env_id)
    import gymnax

    try:
        env, env_params = gymnax.make(env_id, **env_kwargs)
    except OSError as error:  # the few envs that download their data (MNISTBandit-bsuite)
        raise ValueError(f"gymnax could not build {env_id!r}: {error}") from None
    return PPOEnv(env, env_params, env_id)
