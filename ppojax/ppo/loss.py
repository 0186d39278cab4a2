"""Env PPO's loss on one minibatch: the policy term (PPO-Clip, PPO-Penalty or both), the
value loss and the entropy bonus, from the network's outputs on the minibatch's samples.

A feed-forward policy's minibatch is a set of steps; a recurrent policy's is whole env
sequences, replayed from the hidden state the rollout started from, with the same resets at
episode ends as in the rollout.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ppojax.engine import losses
from ppojax.networks import reset_hidden
from ppojax.networks.distributions import policy_distribution
from ppojax.ppo.config import PPOConfig
from ppojax.ppo.types import Agent, Batch, Params, SequenceBatch


def policy_objective_loss(
    config: PPOConfig,
    log_ratio: jax.Array,
    advantages: jax.Array,
    kl: jax.Array | None,
    kl_coef: jax.Array,
) -> jax.Array:
    """The policy term to minimize: -L_clip, -E[r A] + beta KL, or -L_clip + beta KL (``kl``
    per sample, None for -L_clip)."""
    if config.policy_objective == "penalty":
        surrogate = losses.unclipped_surrogate_loss(log_ratio, advantages)
    else:
        surrogate = losses.clipped_surrogate_loss(log_ratio, advantages, config.clip_eps)
    if config.policy_objective == "clip":
        return surrogate
    return surrogate + losses.kl_penalty(kl, kl_coef)


def replay_sequences(
    agent: Agent, params: Params, sequences: SequenceBatch
) -> tuple[jax.Array, jax.Array | None, jax.Array]:
    """The network over env sequences [T, B] from ``sequences.hidden`` [B, S], reset to the
    initial state where ``starts``: policy heads [T, B, A], log_std, values [T, B]."""

    def step(hidden: jax.Array, inputs: tuple[Any, jax.Array]):
        obs, start = inputs
        head, log_std, value, hidden = agent.network.apply(params, obs, reset_hidden(hidden, start))
        return hidden, (head, log_std, value)

    inputs = (sequences.data.obs, sequences.starts)
    _, (head, log_std, value) = jax.lax.scan(step, sequences.hidden, inputs)
    return head, None if log_std is None else log_std[0], value


def policy_outputs(
    agent: Agent, params: Params, batch: Batch | SequenceBatch
) -> tuple[Batch, jax.Array, jax.Array | None, jax.Array]:
    """The samples of ``batch`` flattened to [N], and the network's policy heads [N, A],
    log_std and values [N] on them (replayed in order for sequences)."""
    if isinstance(batch, SequenceBatch):
        head, log_std, values = replay_sequences(agent, params, batch)

        def merge(x: jax.Array) -> jax.Array:
            return x.reshape((-1,) + x.shape[2:])

        samples = jax.tree.map(merge, batch.data)
        return samples, merge(head), log_std, merge(values)
    head, log_std, values, _ = agent.network.apply(params, batch.obs, None)
    return batch, head, log_std, values


def ppo_loss(
    agent: Agent,
    config: PPOConfig,
    kl_coef: jax.Array,
    params: Params,
    batch: Batch | SequenceBatch,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Total PPO loss on one minibatch ([N] steps, or [T, B] sequences), with its parts."""
    batch, head, log_std, values = policy_outputs(agent, params, batch)
    spec, mask = agent.env.spec, batch.action_mask
    distribution = policy_distribution(spec, head, log_std, mask)
    # The analytic KL is PPO-Penalty's term; PPO-Clip needs neither it nor pi_old's
    # distribution (the ratio uses the stored log-probs), and approx_kl tracks its KL.
    kl = None
    if uses_analytic_kl(config):
        old = policy_distribution(spec, batch.policy_head, batch.policy_log_std, mask)
        kl = old.kl_divergence(distribution)
    log_ratio = distribution.log_prob(batch.action) - batch.log_prob
    advantages = batch.advantage
    if config.normalize_advantages:
        advantages = losses.normalize(advantages)
    policy_loss = policy_objective_loss(config, log_ratio, advantages, kl, kl_coef)
    value_loss = losses.value_loss(values, batch.value, batch.target, config.vf_clip_eps)
    entropy = losses.entropy_bonus(distribution.entropy())
    total = losses.total_loss(
        policy_loss, value_loss, entropy, vf_coef=config.vf_coef, ent_coef=config.ent_coef
    )
    parts = {
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": entropy,
        "approx_kl": jax.lax.stop_gradient(losses.approx_kl(log_ratio)),
        "penalty_kl": jnp.float32(jnp.nan) if kl is None else jax.lax.stop_gradient(kl.mean()),
        "clip_fraction": losses.clip_fraction(log_ratio, config.clip_eps),
    }
    return total, parts


def uses_analytic_kl(config: PPOConfig) -> bool:
    """Whether the objective has a KL penalty: only then is the analytic KL(pi_old || pi)
    computed, in the loss (``penalty_kl``) and after each update (``kl``, which adapts beta)."""
    return config.policy_objective != "clip"


def policy_kl(agent: Agent, params: Params, batch: Batch | SequenceBatch) -> jax.Array:
    """Mean analytic KL(pi_old || pi_params) over ``batch`` ([N], or sequences [T, B])."""
    batch, head, log_std, _ = policy_outputs(agent, params, batch)
    spec, mask = agent.env.spec, batch.action_mask
    old = policy_distribution(spec, batch.policy_head, batch.policy_log_std, mask)
    return old.kl_divergence(policy_distribution(spec, head, log_std, mask)).mean()
