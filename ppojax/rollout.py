"""Collecting experience: one env step for all envs, and a rollout as ``lax.scan``."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ppojax.distributions import policy_distribution
from ppojax.envs import PPOEnv
from ppojax.networks import Actor, Critic
from ppojax.types import Params, Transition


class Agent(NamedTuple):
    """The static parts of a run, rebuilt from the config: env and network modules."""

    env: PPOEnv
    actor: Actor
    critic: Critic


class RolloutCarry(NamedTuple):
    env_state: Any  # EpisodeState batched over envs
    obs: jax.Array  # [B, obs_dim]
    key: jax.Array


def reset_envs(agent: Agent, key: jax.Array, num_envs: int) -> tuple[jax.Array, Any]:
    """First observations [B, obs_dim] and env states of ``num_envs`` environments."""
    return jax.vmap(agent.env.reset)(jax.random.split(key, num_envs))


def env_step(
    agent: Agent, params: Params, carry: RolloutCarry, _: Any = None
) -> tuple[RolloutCarry, Transition]:
    """Sample a ~ pi(.|obs) for every env, step the envs, record the transition."""
    key, action_key, step_key = jax.random.split(carry.key, 3)
    head, log_std = agent.actor.apply(params["actor"], carry.obs)
    value = agent.critic.apply(params["critic"], carry.obs)
    action, log_prob = policy_distribution(agent.env.spec, head, log_std).sample_and_log_prob(
        seed=action_key
    )
    step_keys = jax.random.split(step_key, carry.obs.shape[0])
    result, env_state = jax.vmap(agent.env.step)(step_keys, carry.env_state, action)
    transition = Transition(
        obs=carry.obs,
        action=action,
        log_prob=log_prob,
        value=value,
        reward=result.reward,
        terminated=result.terminated,
        truncated=result.truncated,
        next_obs=result.next_obs,
        episode_return=result.episode_return,
        episode_length=result.episode_length,
    )
    return RolloutCarry(env_state, result.obs, key), transition


def collect_rollout(
    agent: Agent, params: Params, carry: RolloutCarry, num_steps: int
) -> tuple[RolloutCarry, Transition]:
    """``num_steps`` env steps with the current policy; transitions are time-major [T, B]."""
    return jax.lax.scan(functools.partial(env_step, agent, params), carry, None, num_steps)


def episode_metrics(transitions: Transition) -> dict[str, jax.Array]:
    """Mean return and length of the episodes that ended in the rollout (NaN if none)."""
    finished = jnp.logical_or(transitions.terminated, transitions.truncated)
    count = finished.sum()
    denominator = jnp.where(count > 0, count, 1).astype(jnp.float32)

    def mean_over_finished(values: jax.Array) -> jax.Array:
        total = jnp.where(finished, values, 0).sum().astype(jnp.float32)
        return jnp.where(count > 0, total / denominator, jnp.nan)

    return {
        "episode_return": mean_over_finished(transitions.episode_return),
        "episode_length": mean_over_finished(transitions.episode_length),
        "episodes_finished": count,
    }
