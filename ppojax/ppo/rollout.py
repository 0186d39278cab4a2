"""Collecting experience: one env step for all envs, and a rollout as ``lax.scan``.

A recurrent policy's hidden state travels in the carry: each step reads it, and where the
step ended an episode (terminated or truncated) the next step starts from the initial state.
So does a Gaussian policy's standard normal noise when ``config.action_noise_correlation``
rho > 0: z_t = rho z_{t-1} + sqrt(1 - rho^2) eps_t, an AR(1) (discretised Ornstein-Uhlenbeck)
process that starts each rollout from a fresh N(0, 1) draw, so every step's noise is still
N(0, 1) and the action's log-probability is the policy's own, while consecutive actions push
the same way for about 1 / (1 - rho) steps (white noise's pushes average out).
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ppojax.checks import ConfigError
from ppojax.envs.env import EpisodeState
from ppojax.envs.normalize import (
    RewardNormalizer,
    normalize_observation,
    normalize_reward,
    update_observation_stats,
)
from ppojax.networks import reset_hidden
from ppojax.networks.distributions import (
    deterministic_action,
    draw_action_noise,
    policy_distribution,
    sample_from_noise,
)
from ppojax.ppo.config import PPOConfig
from ppojax.ppo.types import Agent, Params, TrainState, Transition
from ppojax.runtime import kernels


class RolloutCarry(NamedTuple):
    env_state: Any  # EpisodeState batched over envs
    obs: jax.Array  # [B, ...], raw
    key: jax.Array
    obs_stats: Any  # a RunningStats per observation leaf
    reward_normalizer: RewardNormalizer
    hidden: jax.Array | None = None  # [B, S], the recurrent state for this step's obs
    # episodes of this rollout that started from a start used before (``config.reset_pool``)
    repeated_starts: jax.Array | None = None
    # [B, A]: the last step's standard normal action noise (action_noise_correlation > 0)
    action_noise: jax.Array | None = None


def rollout_start(state: TrainState, key: jax.Array | None = None) -> RolloutCarry:
    """A rollout's starting carry from ``state``: its envs, observations, normalizers and
    hidden state, and ``key`` (``state.key`` when None). Its structure is that of the carry
    ``collect_rollout`` returns, so rollouts can be chained in a ``lax.scan``."""
    key = state.key if key is None else key
    return RolloutCarry(
        state.env_state,
        state.obs,
        key,
        state.obs_stats,
        state.reward_normalizer,
        state.hidden,
        repeated_starts=jnp.int32(0),
    )


def reset_envs(agent: Agent, key: jax.Array, num_envs: int) -> tuple[jax.Array, Any]:
    """First observations [B, ...] and env states of ``num_envs`` environments."""
    return jax.vmap(agent.env.reset)(jax.random.split(key, num_envs))


def network_input(config: PPOConfig, obs_stats: Any, obs: Any) -> Any:
    """What the networks see: ``obs``, normalized when ``config.normalize_observations``
    (``obs_stats``: a RunningStats per observation leaf, see ``observation_stats``)."""
    if not config.normalize_observations:
        return obs
    return normalize_observation(obs_stats, obs, config.obs_clip)


def shape_reward(
    config: PPOConfig, normalizer: RewardNormalizer, reward: jax.Array, done: jax.Array
) -> tuple[jax.Array, RewardNormalizer]:
    """The reward the loss sees [B]: scaled by the return's running std and clipped, as set."""
    if config.normalize_rewards:
        reward, normalizer = normalize_reward(normalizer, reward, done, config.gamma)
    if config.reward_clip is not None:
        reward = jnp.clip(reward, -config.reward_clip, config.reward_clip)
    return reward, normalizer


class StepNoise(NamedTuple):
    """The randomness of one env step for every env (``draw_noise`` draws it for n steps)."""

    env_key: jax.Array  # [B] keys for the envs' own randomness in ``step``
    # [B, ...]: where an env restarts if its episode ends here (None with config.reset_pool,
    # whose starts are drawn per block instead, see draw_starts)
    reset_obs: Any
    reset_state: EpisodeState | None  # [B]
    action: jax.Array  # [B, ...]: the policy's sampling noise (see draw_action_noise)


# Largest block of pre-drawn randomness (resets included) one rollout holds at a time.
NOISE_BLOCK_BYTES = 64 * 2**20


def draw_noise(
    agent: Agent, key: jax.Array, steps: int, num_envs: int, resets: bool = True
) -> StepNoise:
    """The randomness of ``steps`` steps of ``num_envs`` envs ([steps, B, ...] leaves): env
    keys, fresh resets (unless ``resets`` is False) and action noise, each in one batched PRNG
    call. gymnax's ``step`` would draw a reset (and split keys) inside every step instead, a
    handful of small PRNG kernels per step that cost more than the env dynamics on CPU."""
    env_key, reset_key, action_key = jax.random.split(key, 3)
    reset_obs, reset_state = (
        draw_starts(agent, reset_key, steps, num_envs) if resets else (None, None)
    )
    return StepNoise(
        env_key=jax.random.split(env_key, (steps, num_envs)),
        reset_obs=reset_obs,
        reset_state=reset_state,
        action=draw_action_noise(agent.env.spec, action_key, (steps, num_envs)),
    )


def draw_starts(agent: Agent, key: jax.Array, count: int, num_envs: int) -> tuple[Any, Any]:
    """``count`` fresh starts ``(obs, state)`` per env, [count, B, ...] leaves."""
    # one vmap over all count * envs compiles faster than two nested ones; same values
    starts = jax.vmap(agent.env.reset)(jax.random.split(key, count * num_envs))
    return jax.tree.map(lambda x: x.reshape((count, num_envs) + x.shape[1:]), starts)


def pooled_steps(
    step: Any, starts: tuple[Any, Any], carry: RolloutCarry, key: jax.Array, draw: Any, steps: int
) -> tuple[RolloutCarry, Transition]:
    """The steps of one block where each env's episodes that end take the env's ``starts``
    ([K, B, ...], ``config.reset_pool``) in order; past its K-th end in the block an env
    restarts from its K-th start again, counted in ``carry.repeated_starts``."""
    pool, num_envs = jax.tree.leaves(starts)[0].shape[:2]
    envs = jnp.arange(num_envs)

    def pooled(state, noise):
        carry, used = state  # used: [B] starts taken so far in this block
        take = jnp.minimum(used, pool - 1)
        reset_obs, reset_state = jax.tree.map(lambda x: x[take, envs], starts)
        carry, transition = step(
            carry, noise._replace(reset_obs=reset_obs, reset_state=reset_state)
        )
        done = jnp.logical_or(transition.terminated, transition.truncated)
        repeated = jnp.sum(done & (used >= pool), dtype=jnp.int32)
        carry = carry._replace(repeated_starts=carry.repeated_starts + repeated)
        return (carry, used + done), transition

    start = (carry, jnp.zeros(num_envs, jnp.int32))
    (carry, _), transitions = kernels.scan_drawing(pooled, start, key, draw, steps)
    return carry, transitions


def noise_block(agent: Agent, config: PPOConfig) -> int:
    """Steps of randomness drawn at once: the whole rollout unless that exceeds
    NOISE_BLOCK_BYTES, else the largest divisor of num_steps that fits."""
    resets = config.reset_pool is None
    shapes = jax.eval_shape(
        lambda key: draw_noise(agent, key, 1, config.num_envs, resets), jax.random.key(0)
    )
    per_step = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(shapes))
    fitting = [
        block
        for block in range(1, config.num_steps + 1)
        if config.num_steps % block == 0 and block * per_step <= NOISE_BLOCK_BYTES
    ]
    return max(fitting, default=1)


def env_step(
    agent: Agent, config: PPOConfig, params: Params, carry: RolloutCarry, noise: StepNoise
) -> tuple[RolloutCarry, Transition]:
    """Sample a ~ pi(.|obs, hidden) for every env, step the envs, record the transition;
    the next step's hidden state is the initial one where this step ended an episode."""
    obs_stats = carry.obs_stats
    if config.normalize_observations:
        obs_stats = update_observation_stats(obs_stats, carry.obs)
    obs = network_input(config, obs_stats, carry.obs)
    head, log_std, value, hidden = agent.network.apply(params, obs, carry.hidden)
    action_mask = agent.env.action_masks(carry.env_state)
    action_noise = correlated_noise(config, carry.action_noise, noise.action)
    action, log_prob = sample_from_noise(agent.env.spec, head, log_std, action_noise, action_mask)
    if values_after_scan(config):
        # Filled in after the scan (``batched_values_and_log_probs``); unused here, the
        # critic's forward pass leaves the step.
        value, log_prob = None, None
    result, env_state = jax.vmap(agent.env.step_from)(
        noise.env_key, carry.env_state, action, (noise.reset_obs, noise.reset_state)
    )
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
        action_mask=action_mask,
        next_hidden=hidden,
    )
    new_carry = RolloutCarry(
        env_state,
        result.obs,
        carry.key,
        obs_stats,
        reward_normalizer,
        reset_hidden(hidden, done),
        carry.repeated_starts,
        None if carry.action_noise is None else action_noise,
    )
    return new_carry, transition


def correlated_noise(config: PPOConfig, previous: jax.Array | None, fresh: jax.Array) -> jax.Array:
    """This step's action noise [B, A]: ``fresh`` (white) without a correlation, else
    rho * previous + sqrt(1 - rho^2) * fresh, which keeps N(0, 1) from N(0, 1)."""
    if previous is None:
        return fresh
    rho = config.action_noise_correlation
    return rho * previous + math.sqrt(1.0 - rho * rho) * fresh


def first_action_noise(agent: Agent, config: PPOConfig, key: jax.Array) -> jax.Array | None:
    """The AR(1) noise's state before a rollout's first step, N(0, 1) [B, A]; None (white
    noise) without a correlation. A ConfigError for discrete actions, whose noise is Gumbel."""
    if config.action_noise_correlation == 0.0:
        return None
    if agent.env.spec.discrete:
        raise ConfigError(
            "action_noise_correlation",
            f"PPOConfig.action_noise_correlation={config.action_noise_correlation} needs "
            f"continuous actions (a Gaussian policy); {config.env_id} has discrete ones. "
            "Use 0.0.",
        )
    return jax.random.normal(key, (config.num_envs, agent.env.spec.action_dim))


def collect_rollout(
    agent: Agent, config: PPOConfig, params: Params, carry: RolloutCarry
) -> tuple[RolloutCarry, Transition]:
    """``config.num_steps`` env steps with the current policy; transitions are [T, B].

    The steps' randomness comes from ``draw_noise`` through ``kernels.scan_drawing``: drawn
    ahead per block of steps (``noise_block``), or per step with the plain forms; ``carry.key``
    advances once per rollout. A feed-forward policy with its own critic torso
    gets its values and log-probs after the scan, in one batched call each
    (``values_after_scan``, ``batched_values_and_log_probs``).
    """
    step = functools.partial(env_step, agent, config, params)
    block = noise_block(agent, config)
    key, noise_key = jax.random.split(carry.key)

    def draw(key: jax.Array, steps: int) -> StepNoise:
        return draw_noise(agent, key, steps, config.num_envs, config.reset_pool is None)

    def run_block(carry: RolloutCarry, block_key: jax.Array):
        if config.reset_pool is None:
            return kernels.scan_drawing(step, carry, block_key, draw, block)
        block_key, starts_key = jax.random.split(block_key)
        starts = draw_starts(agent, starts_key, config.reset_pool, config.num_envs)
        return pooled_steps(step, starts, carry, block_key, draw, block)

    carry = carry._replace(key=key, repeated_starts=jnp.int32(0))
    if config.action_noise_correlation != 0.0:
        noise_key, first_key = jax.random.split(noise_key)
        carry = carry._replace(action_noise=first_action_noise(agent, config, first_key))
    if block == config.num_steps:
        carry, transitions = run_block(carry, noise_key)
    else:
        blocks = config.num_steps // block
        carry, transitions = jax.lax.scan(run_block, carry, jax.random.split(noise_key, blocks))
        transitions = jax.tree.map(
            lambda x: x.reshape((config.num_steps,) + x.shape[2:]), transitions
        )
    if values_after_scan(config):
        transitions = batched_values_and_log_probs(agent, params, transitions)
    # the next rollout draws its own first noise: the carry keeps rollout_start's structure
    return carry._replace(action_noise=None), transitions


def values_after_scan(config: PPOConfig) -> bool:
    """Whether the rollout computes values and log-probs after its scan: for a feed-forward
    policy with its own critic torso. A recurrent critic needs the step's hidden state, and a
    shared torso's value head is one small layer on features the step computes anyway."""
    return config.recurrent is None and not config.shared_torso


def batched_values_and_log_probs(
    agent: Agent, params: Params, transitions: Transition
) -> Transition:
    """``transitions`` [T, B] with V(obs) and log pi(action | obs) from one call each over
    all T * B samples, for a feed-forward policy.

    On CPU a small rollout is bound by kernel launches, not arithmetic: the critic's layers
    and the log-prob inside every step of the scan cost more than the same work done once
    over the whole rollout.
    """
    shape = transitions.reward.shape

    def merge(x: jax.Array) -> jax.Array:
        return x.reshape((-1,) + x.shape[2:])

    obs = jax.tree.map(merge, transitions.obs)
    values = agent.network.apply(params, obs, None, method="value").reshape(shape)
    log_std = transitions.policy_log_std
    distribution = policy_distribution(
        agent.env.spec,
        merge(transitions.policy_head),
        None if log_std is None else merge(log_std),
        None if transitions.action_mask is None else merge(transitions.action_mask),
    )
    log_prob = distribution.log_prob(merge(transitions.action)).reshape(shape)
    return transitions._replace(value=values, log_prob=log_prob)


def act(
    agent: Agent,
    config: PPOConfig,
    params: Params,
    obs_stats: Any,
    obs: Any,
    hidden: jax.Array | None,
    key: jax.Array,
    deterministic: bool = False,
    action_mask: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array | None]:
    """The trained policy's actions [N, ...] for a batch of raw observations [N, ...] (as in
    training: normalized with the frozen ``obs_stats`` when normalization is on) and its new
    hidden state [N, S]; ``hidden`` is None for a feed-forward policy, and stays None. The
    mode when ``deterministic``. Actions are unclipped, as the policy produced them. The
    caller resets ``hidden`` where an episode ended (``ppojax.networks.reset_hidden``).
    Masked actions (``action_mask`` bool [N, action_dim]) never come."""
    obs = network_input(config, obs_stats, obs)
    head, log_std, _, hidden = agent.network.apply(params, obs, hidden)
    spec = agent.env.spec
    if deterministic:
        return deterministic_action(spec, head, action_mask), hidden
    return policy_distribution(spec, head, log_std, action_mask).sample(seed=key), hidden


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
