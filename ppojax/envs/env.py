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
import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ppojax.envs.registry import build_env, gymnax_envs, registered_envs


class StepAPIWarning(UserWarning):
    """An env's ``step`` returns gymnax's older five values, which ``PPOEnv`` adapts."""


STEP_VALUES = "(obs, state, reward, terminated, truncated, info)"
OLD_STEP_VALUES = "(obs, state, reward, done, info)"


class EnvSpec(NamedTuple):
    """Static description of an environment's observation and action spaces.

    ``action_nvec`` is set for MultiDiscrete actions: the sizes [k] of the k Categoricals
    whose product is the policy (``action_dim`` = their sum, the number of logits, and an
    action is an int vector [k]). ``masked``: the env gives an action mask (bool
    [action_dim], True = allowed) for every state, through ``action_mask(state, params)``.
    """

    obs_dim: int
    discrete: bool
    action_dim: int  # number of actions (logits) when discrete, action vector size when not
    action_low: tuple[float, ...] | None
    action_high: tuple[float, ...] | None
    action_nvec: tuple[int, ...] | None = None
    masked: bool = False


class MultiDiscrete:
    """An action space of k independent choices, the i-th among ``nvec[i]`` values: actions
    are int32 vectors [k] (gymnax has no such space; adapters and user envs may return it)."""

    def __init__(self, nvec: Any) -> None:
        self.nvec = tuple(int(n) for n in np.asarray(nvec).reshape(-1))
        self.shape = (len(self.nvec),)
        self.dtype = jnp.int32

    def sample(self, key: jax.Array) -> jax.Array:
        return jax.random.randint(key, self.shape, 0, jnp.asarray(self.nvec))

    def contains(self, x: jax.Array) -> jax.Array:
        return jnp.all((x >= 0) & (x < jnp.asarray(self.nvec)))

    def __repr__(self) -> str:
        return f"MultiDiscrete({list(self.nvec)})"


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
    """Every environment id ppojax can train on without a suite: gymnax's registry, then the
    ids registered with ``ppojax.register_env`` (suite ids: ``ppojax.envs.registry.SUITES``)."""
    return gymnax_envs() + [env_id for env_id in registered_envs() if env_id not in gymnax_envs()]


def _obs_dim(name: str, obs_space: Any) -> int:
    """Elements in one observation; a Dict space's observations are dicts of arrays (a
    pytree), whose leaves all count."""
    from gymnax.environments import spaces

    if isinstance(obs_space, spaces.Dict):
        return sum(_obs_dim(name, space) for space in obs_space.spaces.values())
    if not isinstance(obs_space, (spaces.Box, spaces.Discrete)):
        raise ValueError(
            f"{name}: observation space {obs_space!r} is not supported; ppojax takes Box and "
            "Discrete observations and Dicts of them. Wrap the env so that it returns those."
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
    if isinstance(action_space, MultiDiscrete):
        if not action_space.nvec or min(action_space.nvec) < 1:
            raise ValueError(f"{name}: action space {action_space!r} has an empty choice.")
        nvec = action_space.nvec
        return EnvSpec(obs_dim, True, sum(nvec), None, None, action_nvec=nvec)
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
        "actions (Categorical policy), ppojax.envs.MultiDiscrete (a product of Categoricals) "
        "and Box actions (Gaussian policy). Wrap the env so that it takes one of those (for "
        "example one Box for a Tuple of Boxes)."
    )


class PPOEnv:
    """A single gymnax env with PPO's bookkeeping; vmap its methods over environments."""

    def __init__(self, env: Any, env_params: Any, name: str | None = None):
        self.env = env
        self.env_params = env_params
        name = name or type(env).__name__
        spec = _space_spec(name, env.observation_space(env_params), env.action_space(env_params))
        self.spec = spec._replace(masked=callable(getattr(env, "action_mask", None)))
        self._action_shape = tuple(env.action_space(env_params).shape)
        self.old_step_api = _old_step_api(name, self)
        if self.spec.masked:
            _check_mask_shape(name, self)

    def action_mask(self, state: EpisodeState) -> jax.Array | None:
        """The allowed actions in ``state`` (bool [action_dim]; for MultiDiscrete each
        choice's values side by side), None when the env has no mask."""
        if not self.spec.masked:
            return None
        mask = self.env.action_mask(state.env_state, self.env_params)
        return jnp.asarray(mask, jnp.bool_).reshape(-1)

    def action_masks(self, states: EpisodeState) -> jax.Array | None:
        """``action_mask`` of a batch of states [B]: [B, action_dim], or None."""
        return jax.vmap(self.action_mask)(states) if self.spec.masked else None

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
        """One step with gymnax's auto-reset: a fresh reset is drawn from ``key``. An env of
        gymnax's older API (``old_step_api``) has its one ``done`` taken as terminated; its
        observation after a done is the next episode's, which no value is bootstrapped from."""
        stepped = self.env.step(key, state.env_state, self._env_action(action), self.env_params)
        if self.old_step_api:
            obs, env_state, reward, done, _ = stepped
            truncated = jnp.zeros_like(done, jnp.bool_)
            stepped = (obs, env_state, reward, done, truncated, {"final_observation": obs})
        obs, env_state, reward, terminated, truncated, info = stepped
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


def _old_step_api(name: str, env: PPOEnv) -> bool:
    """Whether ``env.env.step`` returns gymnax's older five values (one ``done``), with a
    ``StepAPIWarning`` saying how they are adapted; False for gymnax 1.0's six; a
    ``ValueError`` naming the env for anything else. Found by tracing one step (no
    computation), so that a wrong step fails where the env is built."""
    from gymnax.environments.environment import Environment

    if getattr(type(env.env), "step", None) is Environment.step:
        return False  # gymnax's own step, around the env's step_env
    if not (callable(getattr(env.env, "reset", None)) and callable(getattr(env.env, "step", None))):
        return False  # an env taken for its spaces alone (register_env requires both)
    dtype = jnp.int32 if env.spec.discrete else jnp.float32

    def one_step(key: jax.Array) -> Any:
        _, state = env.env.reset(key, env.env_params)
        action = jnp.zeros(env._action_shape, dtype)
        return env.env.step(key, state, action, env.env_params)

    stepped = jax.eval_shape(one_step, jax.random.key(0))
    count = len(stepped) if isinstance(stepped, tuple) else None
    if count == 6:
        return False
    if count == 5:
        warnings.warn(
            f"{name}: step(key, state, action, params) returns gymnax's older five values "
            f"{OLD_STEP_VALUES}; ppojax adapts them to gymnax >= 1.0's six {STEP_VALUES}, "
            "taking every done as terminated, so an episode cut off by a time limit is not "
            "bootstrapped. Return the six, the last observation of an episode in "
            "info['final_observation'], to have it bootstrapped.",
            StepAPIWarning,
            stacklevel=3,
        )
        return True
    got = f"{count} values" if count is not None else f"a {type(stepped).__name__}"
    raise ValueError(
        f"{name}: step(key, state, action, params) returned {got}; ppojax needs gymnax >= "
        f"1.0's six {STEP_VALUES}, the last observation of an episode in "
        f"info['final_observation'] (or gymnax's older five {OLD_STEP_VALUES}). Wrap the "
        "env so that its step returns them."
    )


def _check_mask_shape(name: str, env: PPOEnv) -> None:
    """A ``ValueError`` naming the env unless its mask has one entry per logit."""
    shape = jax.eval_shape(lambda key: env.action_mask(env.reset(key)[1]), jax.random.key(0))
    if shape.shape != (env.spec.action_dim,):
        raise ValueError(
            f"{name}: action_mask(state, params) gives shape {shape.shape}; it must be "
            f"({env.spec.action_dim},), one entry per action (per value of each choice)."
        )


def make_env(env_id: str, **env_kwargs: Any) -> PPOEnv:
    """The environment ``env_id`` (a gymnax id, an id registered with ``ppojax.register_env``
    or ``suite/name``) built with ``env_kwargs`` (``PPOConfig.env_kwargs``), wrapped for PPO."""
    env, env_params = build_env(env_id, env_kwargs)
    return PPOEnv(env, env_params, env_id)
