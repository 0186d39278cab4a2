"""Collecting experience: one env step for all envs, and a rollout as ``lax.scan``."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ppojax.config import PPOConfig
from ppojax.distributions import deterministic_action, policy_distribution
from ppojax.envs import PPOEnv
from ppojax.envs.normalize import (
    RewardNormalizer,
    RunningStats,
    normalize_obs,
    normalize_reward,
    update_stats,
)
from ppojax.networks import Actor, Critic
from ppojax.types import Params, Transition


class Agent(NamedTuple):
    """The static parts of a run, rebuilt from the config: env and network modules."""

    env: PPOEnv
    actor: Actor
    critic: Critic


class RolloutCarry(NamedTuple):
    env_state: Any  # EpisodeState batched over envs
    obs: jax.Array  # [B, obs_dim], raw
    key: jax.Array
    obs_stats: RunningStats
    reward_normalizer: RewardNormalizer


def reset_envs(agent: Agent, key: jax.Array, num_envs: int) -> tuple[jax.Array, Any]:
    """First observations [B, obs_dim] and env states of ``num_envs`` environments."""
    return jax.vmap(agent.env.reset)(jax.random.split(key, num_envs))


def network_input(config: PPOConfig, obs_stats: RunningStats, obs: jax.Array) -> jax.Array:
    """What the networks see: ``obs``, normalized when ``config.normalize_observations``."""
    if not config.normalize_observations:
        return obs
    return normalize_obs(obs_stats, obs, config.obs_clip)


def shape_reward(
    config: PPOConfig, normalizer: RewardNormalizer, reward: jax.Array, done: jax.Array
) -> tuple[jax.Array, RewardNormalizer]:
    """The reward the loss sees [B]: scaled by the return's running std and clipped, as set."""
    if config.normalize_rewards:
        reward, normalizer = normalize_reward(normalizer, reward, done, config.gamma)
    if config.reward_clip is not None:
        reward = jnp.clip(reward, -config.reward_clip, config.reward_clip)
    return reward, normalizer


def env_step(
    agent: Agent, config: PPOConfig, params: Params, carry: RolloutCarry, _: Any = None
) -> tuple[RolloutCarry, Transition]:
    """Sample a ~ pi(.|obs) for every env, step the envs, record the transition."""
    key, action_key, step_key = jax.random.split(carry.key, 3)
    obs_stats = carry.obs_stats
    if config.normalize_observations:
        obs_stats = update_stats(obs_stats, carry.obs)
    obs = network_input(config, obs_stats, carry.obs)
    head, log_std = agent.actor.apply(params["actor"], obs)
    value = agent.critic.apply(params["critic"], obs)
    action, log_prob = policy_distribution(agent.env.spec, head, log_std).sample_and_log_prob(
        seed=action_key
    )
    step_keys = jax.random.split(step_key, carry.obs.shape[0])
    result, env_state = jax.vmap(agent.env.step)(step_keys, carry.env_state, action)
    done = jnp.logical_or(result.terminated, result.truncated)
    reward, reward_normalizer = shape_reward(config, carry.reward_normalizer, result.reward, done)
    transition = Transition(
        obs=obs,
        action=action,
        log_prob=log_prob,
        value=value,
        policy_head=head,
        policy_log_std=None if log_std is None else jnp.broadcast_to(log_std, head.shape),
        reward=reward,
        terminated=result.terminated,
        truncated=result.truncated,
        next_obs=network_input(config, obs_stats, result.next_obs),
        episode_return=result.episode_return,
        episode_length=result.episode_length,
    )
    new_carry = RolloutCarry(env_state, result.obs, key, obs_stats, reward_normalizer)
    return new_carry, transition


def collect_rollout(
    agent: Agent, config: PPOConfig, params: Params, carry: RolloutCarry
) -> tuple[RolloutCarry, Transition]:
    """``config.num_steps`` env steps with the current policy; transitions are [T, B]."""
    step = functools.partial(env_step, agent, config, params)
    return jax.lax.scan(step, carry, None, config.num_steps)


def policy_action(
    agent: Agent,
    config: PPOConfig,
    params: Params,
    obs_stats: RunningStats,
    obs: jax.Array,
    key: jax.Array,
    deterministic: bool = False,
) -> jax.Array:
    """The trained policy's action for raw observations [..., obs_dim] (as in training:
    normalized with the frozen ``obs_stats`` when normalization is on); the mode when
    ``deterministic``. Actions are unclipped, as the policy produced them."""
    head, log_std = agent.actor.apply(params["actor"], network_input(config, obs_stats, obs))
    if deterministic:
        return deterministic_action(agent.env.spec, head)
    return policy_distribution(agent.env.spec, head, log_std).sample(seed=key)


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
