"""PPO's update: ``update_epochs`` epochs of ``num_minibatches`` shuffled minibatches, one
optax step each, through the shared engine (``ppojax.engine.epochs``) on env PPO's loss
(``ppojax.ppo.loss``).

A feed-forward policy's minibatches are shuffled steps; a recurrent policy's are whole env
sequences (envs shuffled, each sequence kept in order).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.flatten_util
import jax.numpy as jnp
import optax

from ppojax.engine.epochs import LossFn, OptimizerCarry, run_epochs, shuffle_into_minibatches
from ppojax.engine.optim import clipped_adam
from ppojax.ppo.config import PPOConfig
from ppojax.ppo.kernels import loss_or_kernel
from ppojax.ppo.loss import ppo_loss
from ppojax.ppo.types import Agent, Batch, SequenceBatch
from ppojax.runtime import kernels


def learning_rate_at(config: PPOConfig, gradient_step: jax.Array) -> jax.Array:
    """lr * (1 - step / num_gradient_steps) when anneal_lr, else lr."""
    if not config.anneal_lr:
        return jnp.asarray(config.learning_rate, jnp.float32)
    fraction = 1.0 - gradient_step / config.num_gradient_steps
    return config.learning_rate * jnp.clip(fraction, 0.0, 1.0)


def make_optimizer(config: PPOConfig) -> optax.GradientTransformation:
    """Global-norm gradient clipping, then Adam (eps 1e-5) with the (annealed) learning rate,
    over all parameters as one flat vector (``clipped_adam``)."""
    schedule = functools.partial(learning_rate_at, config)
    return clipped_adam(schedule, config.max_grad_norm, eps=1e-5, flat=True)


MIN_KL_COEF = 1e-8


def adaptive_kl_update(
    kl_coef: jax.Array | float, kl: jax.Array | float, target: jax.Array | float
) -> jax.Array:
    """PPO-Penalty's rule: beta * 2 if KL > 1.5 target; beta / 2 if KL < target / 1.5.

    A halved beta never drops below MIN_KL_COEF: in float32 it would otherwise reach 0 after
    ~150 quiet updates and could never grow back.
    """
    kl_coef = jnp.asarray(kl_coef, jnp.float32)
    doubled = jnp.where(kl > 1.5 * target, kl_coef * 2.0, kl_coef)
    halved = jnp.maximum(kl_coef / 2.0, jnp.minimum(kl_coef, MIN_KL_COEF))
    return jnp.where(kl < target / 1.5, halved, doubled)


def shuffle_sequences(key: jax.Array, batch: SequenceBatch, num_minibatches: int) -> SequenceBatch:
    """The env sequences of ``batch`` in a random order (the same for every leaf), split into
    [num_minibatches] minibatches of B / num_minibatches whole sequences each: data and starts
    [M, T, B / M, ...], hidden [M, B / M, S]."""
    size = batch.hidden.shape[0]
    order = jax.random.permutation(key, size)

    def split_envs(x: jax.Array) -> jax.Array:
        x = x[:, order].reshape((x.shape[0], num_minibatches, -1) + x.shape[2:])
        return jnp.swapaxes(x, 0, 1)

    data, starts = jax.tree.map(split_envs, (batch.data, batch.starts))
    hidden = batch.hidden[order].reshape((num_minibatches, -1) + batch.hidden.shape[1:])
    return SequenceBatch(data, starts, hidden)


def shuffle_any(key: jax.Array, batch: Any, num_minibatches: int) -> Any:
    """``shuffle_sequences`` for a SequenceBatch, else ``shuffle_into_minibatches``."""
    if isinstance(batch, SequenceBatch):
        return shuffle_sequences(key, batch, num_minibatches)
    return shuffle_into_minibatches(key, batch, num_minibatches)


def ppo_loss_function(agent: Agent, config: PPOConfig, kl_coef: jax.Array) -> LossFn:
    """``ppo_loss`` of this agent and config as a function of (params, minibatch), or its
    Pallas kernel where that swaps in (``ppojax.ppo.kernels.loss_or_kernel``)."""
    return loss_or_kernel(agent, config, functools.partial(ppo_loss, agent, config, kl_coef))


def ppo_update(
    agent: Agent,
    config: PPOConfig,
    optimizer: optax.GradientTransformation,
    carry: OptimizerCarry,
    batch: Batch | SequenceBatch,
    kl_coef: jax.Array,
    key: jax.Array,
) -> tuple[OptimizerCarry, dict[str, jax.Array]]:
    """PPO's update: ``config.update_epochs`` epochs of ``config.num_minibatches`` steps.

    In programs lowered for CUDA (the kernels candidate "flat_params", a CUDA default) the
    epochs carry the parameters as the one vector the flat optimizer (``make_optimizer``)
    steps, and the loss reads its leaves from it: the step adds its update to one vector
    instead of to every leaf, one kernel instead of one per leaf. The same values, the same
    optimizer state."""
    loss_fn = ppo_loss_function(agent, config, kl_coef)
    epochs = functools.partial(
        run_epochs,
        num_epochs=config.update_epochs,
        num_minibatches=config.num_minibatches,
        stop_kl=config.target_kl,
        divergence_guard=config.divergence_guard,
        shuffle=shuffle_any,
    )

    def by_leaf(carry: OptimizerCarry, batch: Any, key: jax.Array):
        return epochs(loss_fn, optimizer, carry, batch, key)

    def flat(carry: OptimizerCarry, batch: Any, key: jax.Array):
        return flat_epochs(epochs, loss_fn, optimizer, carry, batch, key)

    return kernels.by_platform("flat_params", by_leaf, flat)(carry, batch, key)


def flat_epochs(
    epochs: Any,
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    carry: OptimizerCarry,
    batch: Any,
    key: jax.Array,
) -> tuple[OptimizerCarry, dict[str, jax.Array]]:
    """``epochs(loss_fn, optimizer, carry, batch, key)`` with the parameters raveled into one
    vector for the epochs and unraveled after. ``optimizer`` is the flat one (``optax.flatten``
    of a vector is that vector): its state is the same either way."""
    params, unravel = jax.flatten_util.ravel_pytree(carry.params)

    def flat_loss(params: jax.Array, minibatch: Any):
        return loss_fn(unravel(params), minibatch)

    end, metrics = epochs(flat_loss, optimizer, OptimizerCarry(params, carry.opt_state), batch, key)
    return OptimizerCarry(unravel(end.params), end.opt_state), metrics
