"""The PPO update: shuffled minibatches, one optax step each, several epochs (``lax.scan``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from ppojax import losses
from ppojax.config import PPOConfig
from ppojax.distributions import policy_distribution
from ppojax.rollout import Agent
from ppojax.types import Batch, Params

LOSS_METRICS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")


LossFn = Callable[[Params, Any], tuple[jax.Array, dict[str, jax.Array]]]


class OptimizerCarry(NamedTuple):
    params: Params
    opt_state: Any


def learning_rate_at(config: PPOConfig, gradient_step: jax.Array) -> jax.Array:
    """lr * (1 - step / num_gradient_steps) when anneal_lr, else lr."""
    if not config.anneal_lr:
        return jnp.asarray(config.learning_rate, jnp.float32)
    fraction = 1.0 - gradient_step / config.num_gradient_steps
    return config.learning_rate * jnp.clip(fraction, 0.0, 1.0)


def make_optimizer(config: PPOConfig) -> optax.GradientTransformation:
    """Global-norm gradient clipping, then Adam (eps 1e-5) with the (annealed) learning rate."""
    return optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        optax.adam(functools.partial(learning_rate_at, config), eps=1e-5),
    )


def ppo_loss(
    agent: Agent, config: PPOConfig, params: Params, batch: Batch
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Total PPO-Clip loss on one minibatch [N], with its parts for logging."""
    head, log_std = agent.actor.apply(params["actor"], batch.obs)
    values = agent.critic.apply(params["critic"], batch.obs)
    distribution = policy_distribution(agent.env.spec, head, log_std)
    log_ratio = distribution.log_prob(batch.action) - batch.log_prob
    advantages = batch.advantage
    if config.normalize_advantages:
        advantages = losses.normalize(advantages)
    policy_loss = losses.clipped_surrogate_loss(log_ratio, advantages, config.clip_eps)
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
        "clip_fraction": losses.clip_fraction(log_ratio, config.clip_eps),
    }
    return total, parts


def gradient_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    carry: OptimizerCarry,
    minibatch: Any,
) -> tuple[OptimizerCarry, dict[str, jax.Array]]:
    """One optimizer step on ``loss_fn(params, minibatch) -> (loss, metrics)``."""
    grads, metrics = jax.grad(loss_fn, has_aux=True)(carry.params, minibatch)
    updates, opt_state = optimizer.update(grads, carry.opt_state, carry.params)
    params = optax.apply_updates(carry.params, updates)
    return OptimizerCarry(params, opt_state), {**metrics, "grad_norm": optax.tree.norm(grads)}


def shuffle_into_minibatches(key: jax.Array, batch: Any, num_minibatches: int) -> Any:
    """A random permutation of the N samples of every leaf of ``batch`` (same permutation for
    all), reshaped to [num_minibatches, N / num_minibatches, ...]."""
    size = jax.tree.leaves(batch)[0].shape[0]
    permutation = jax.random.permutation(key, size)
    return jax.tree.map(
        lambda x: x[permutation].reshape((num_minibatches, -1) + x.shape[1:]), batch
    )


def run_epochs(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    carry: OptimizerCarry,
    batch: Any,
    key: jax.Array,
    *,
    num_epochs: int,
    num_minibatches: int,
) -> tuple[OptimizerCarry, dict[str, jax.Array]]:
    """``num_epochs`` passes over ``batch`` (a pytree of [N, ...] leaves) in freshly shuffled
    minibatches, one gradient step each; metrics are means over all gradient steps."""
    step = functools.partial(gradient_step, loss_fn, optimizer)

    def epoch(carry: OptimizerCarry, epoch_key: jax.Array):
        minibatches = shuffle_into_minibatches(epoch_key, batch, num_minibatches)
        return jax.lax.scan(step, carry, minibatches)

    carry, metrics = jax.lax.scan(epoch, carry, jax.random.split(key, num_epochs))
    return carry, jax.tree.map(jnp.mean, metrics)


def update_epochs(
    agent: Agent,
    config: PPOConfig,
    optimizer: optax.GradientTransformation,
    carry: OptimizerCarry,
    batch: Batch,
    key: jax.Array,
) -> tuple[OptimizerCarry, dict[str, jax.Array]]:
    """PPO's update: ``config.update_epochs`` epochs of ``config.num_minibatches`` steps."""
    return run_epochs(
        functools.partial(ppo_loss, agent, config),
        optimizer,
        carry,
        batch,
        key,
        num_epochs=config.update_epochs,
        num_minibatches=config.num_minibatches,
    )
