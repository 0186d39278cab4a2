"""The PPO update: shuffled minibatches, one optax step each, several epochs (``lax.scan``).

A feed-forward policy's minibatches are shuffled steps; a recurrent policy's are whole env
sequences (envs shuffled, each sequence kept in order), replayed from the hidden state the
rollout started from, with the same resets at episode ends as in the rollout.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.flatten_util
import jax.numpy as jnp
import optax

from ppojax.networks import flatten_observation, reset_hidden
from ppojax.networks.distributions import policy_distribution
from ppojax.networks.fused import actor_critic_layers
from ppojax.ppo import losses
from ppojax.ppo.config import PPOConfig
from ppojax.ppo.rollout import Agent
from ppojax.ppo.types import Batch, Params, SequenceBatch
from ppojax.runtime import kernels, pallas_ppo

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
    """Global-norm gradient clipping, then Adam (eps 1e-5) with the (annealed) learning rate,
    over all parameters as one flat vector: the same arithmetic as per leaf, in a few kernels
    per step instead of a few per leaf, which shrinks the compiled program by about a tenth
    (benchmarks/compare.py --program-size)."""
    return optax.flatten(
        optax.chain(
            optax.clip_by_global_norm(config.max_grad_norm),
            optax.adam(functools.partial(learning_rate_at, config), eps=1e-5),
        )
    )


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


def flat(tree: Any) -> jax.Array:
    """The leaves of ``tree`` as one vector, in the flat optimizer's order: its norm is the
    one that the optimizer's clipping computes, and XLA computes it once for both."""
    return jax.flatten_util.ravel_pytree(tree)[0]


class EpochCarry(NamedTuple):
    optimizer: OptimizerCarry
    stopped: jax.Array  # True once a minibatch's approx_kl passed stop_kl


def gradient_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    stop_kl: float | jax.Array | None,
    guard: bool,
    carry: EpochCarry,
    minibatch: Any,
) -> tuple[EpochCarry, dict[str, jax.Array]]:
    """One optimizer step on ``loss_fn(params, minibatch) -> (loss, metrics)``.

    With ``guard`` (the divergence guard), the step is skipped (parameters and optimizer state
    kept) when its loss, the global norm of its gradients or the global norm of its parameter
    update is not finite. Those three scalars cover every NaN or inf in the gradients, the new
    parameters (old ones are finite plus a finite update) and the new optimizer state (it
    only adds the finite gradients and their squares). Without it, such a step is applied as
    computed. Either way ``nonfinite_steps`` counts the steps whose loss or gradient norm was
    not finite. With ``stop_kl``, the step is also skipped when its approximate KL before the
    step exceeds ``stop_kl`` or an earlier step stopped. A skipped step applies a zero update
    and keeps the old optimizer state; the selects act on what the optimizer's kernels
    produce, so XLA fuses them there instead of adding a kernel per parameter. A step that is
    taken is applied as computed.
    """
    old = carry.optimizer
    with jax.named_scope("loss_and_grad"):
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(old.params, minibatch)
    with jax.named_scope("optimizer"):
        updates, opt_state = optimizer.update(grads, old.opt_state, old.params)
        grad_norm = optax.tree.norm(flat(grads))
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    take, stopped = jnp.bool_(True), carry.stopped
    if guard:
        finite = finite & jnp.isfinite(optax.tree.norm(flat(updates)))
        take = finite
    if stop_kl is not None:
        kl_stop = take & ~(metrics["approx_kl"] <= stop_kl)
        take = take & ~carry.stopped & ~kl_stop
        stopped = carry.stopped | kl_stop
    if guard or stop_kl is not None:
        updates = jax.tree.map(lambda update: jnp.where(take, update, 0.0), updates)
        opt_state = jax.tree.map(
            lambda new, kept: jnp.where(take, new, kept), opt_state, old.opt_state
        )
    new = OptimizerCarry(optax.apply_updates(old.params, updates), opt_state)
    counts = {
        "grad_norm": grad_norm,
        "gradient_steps": take.astype(jnp.float32),
        "nonfinite_steps": (~finite & ~carry.stopped).astype(jnp.float32),
    }
    return EpochCarry(new, stopped), {**metrics, **counts}


def shuffle_into_minibatches(key: jax.Array, batch: Any, num_minibatches: int) -> Any:
    """A random permutation of the N samples of every leaf of ``batch`` (same permutation for
    all), reshaped to [num_minibatches, N / num_minibatches, ...]."""
    size = jax.tree.leaves(batch)[0].shape[0]
    order = jax.random.permutation(key, size)
    return jax.tree.map(lambda x: x[order].reshape((num_minibatches, -1) + x.shape[1:]), batch)


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


def zero_metrics(step: Callable, start: EpochCarry, minibatches: Any) -> dict[str, jax.Array]:
    """Zeros shaped like the metrics of one ``step`` on one of ``minibatches`` (shapes)."""
    first = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), minibatches)
    shapes = jax.eval_shape(step, start, first)[1]
    return jax.tree.map(lambda shape: jnp.zeros(shape.shape, shape.dtype), shapes)


def run_epochs(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    carry: OptimizerCarry,
    batch: Any,
    key: jax.Array,
    *,
    num_epochs: int,
    num_minibatches: int,
    stop_kl: float | jax.Array | None = None,
    divergence_guard: bool = True,
) -> tuple[OptimizerCarry, dict[str, jax.Array]]:
    """``num_epochs`` passes over ``batch`` (a pytree of [N, ...] leaves, or a SequenceBatch
    of env sequences) in freshly shuffled minibatches, one gradient step each, all skipped
    from the first minibatch whose approx_kl exceeds ``stop_kl``, and, with
    ``divergence_guard``, any whose result is not finite (``gradient_step``). Metrics are means
    over the steps taken (NaN when none was); ``gradient_steps`` counts them,
    ``nonfinite_steps`` the steps whose loss or gradients were not finite (skipped by the
    guard, applied without it).

    The metrics are summed in the loop's carry rather than stacked per step and reduced
    after: a few scalar adds per step instead of one stacking kernel per metric.
    """
    step = functools.partial(gradient_step, loss_fn, optimizer, stop_kl, divergence_guard)

    def summed_step(carry: tuple[EpochCarry, dict[str, jax.Array]], minibatch: Any):
        state, totals = carry
        state, metrics = step(state, minibatch)
        taken = metrics["gradient_steps"] > 0
        # where, not a product with ``taken``: a skipped step's NaN times 0 is still NaN.
        added = {
            name: value
            if name in ("gradient_steps", "nonfinite_steps")
            else jnp.where(taken, value, 0.0)
            for name, value in metrics.items()
        }
        return (state, jax.tree.map(jnp.add, totals, added)), None

    def epoch(carry: tuple[EpochCarry, dict[str, jax.Array]], minibatches: Any):
        return jax.lax.scan(summed_step, carry, minibatches)[0]

    def shuffle(epoch_key: jax.Array) -> Any:
        with jax.named_scope("shuffle"):
            return shuffle_any(epoch_key, batch, num_minibatches)

    start = EpochCarry(carry, jnp.bool_(False))
    zeros = zero_metrics(step, start, jax.eval_shape(shuffle, key))
    keys = jax.random.split(key, num_epochs)
    end, totals = kernels.scan_epochs(epoch, (start, zeros), keys, shuffle)
    count = totals.pop("gradient_steps")
    skipped = totals.pop("nonfinite_steps")
    means = jax.tree.map(
        lambda total: jnp.where(count > 0, total / jnp.maximum(count, 1.0), jnp.nan), totals
    )
    return end.optimizer, {**means, "gradient_steps": count, "nonfinite_steps": skipped}


def pallas_loss_applies(agent: Agent, config: PPOConfig) -> bool:
    """Whether the kernels candidate "pallas_ppo_loss" is chosen and computes this config's
    loss: PPO-Clip, one Categorical without a mask or a Gaussian with a log-std parameter,
    two float32 MLP torsos of tanh or relu."""
    spec = agent.env.spec
    return (
        kernels.stand_in("pallas_ppo_loss")
        and config.policy_objective == "clip"
        and spec.action_nvec is None
        and not spec.masked
        and not (config.state_dependent_std and not spec.discrete)
        and config.encoder == "mlp"
        and config.recurrent is None
        and not config.shared_torso
        and config.compute_dtype == "float32"
        and config.activation in pallas_ppo.ACTIVATIONS
    )


def pallas_ppo_loss(
    agent: Agent, config: PPOConfig, params: Params, batch: Batch
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """``ppo_loss`` where ``pallas_loss_applies``, its value and gradient from the kernel."""
    spec = agent.env.spec
    settings = pallas_ppo.LossSettings(
        config.activation, spec.action_dim, config.vf_clip_eps is not None, not spec.discrete
    )
    coefficients = pallas_ppo.Coefficients(
        *(
            jnp.asarray(0.0 if value is None else value, jnp.float32)
            for value in (config.clip_eps, config.vf_clip_eps, config.vf_coef, config.ent_coef)
        )
    )
    advantage = batch.advantage
    if config.normalize_advantages:
        advantage = losses.normalize(advantage)
    obs = flatten_observation(batch.obs)
    rows = (obs, batch.action, batch.log_prob, advantage, batch.value, batch.target)
    actor, critic = actor_critic_layers(params["params"], len(config.hidden_sizes))
    log_std = None if spec.discrete else params["params"]["log_std"]
    network = pallas_ppo.Network(actor, critic, log_std)
    loss, metrics = pallas_ppo.ppo_loss(settings, coefficients, network, rows)
    return loss, {**metrics, "penalty_kl": jnp.float32(jnp.nan)}


def ppo_loss_function(agent: Agent, config: PPOConfig, kl_coef: jax.Array) -> LossFn:
    """``ppo_loss`` of this agent and config as a function of (params, minibatch); with the
    kernels candidate "pallas_ppo_loss" where it applies, the same loss and gradient from one
    Pallas kernel (``ppojax.runtime.pallas_ppo``)."""
    if not pallas_loss_applies(agent, config):
        return functools.partial(ppo_loss, agent, config, kl_coef)
    return functools.partial(pallas_ppo_loss, agent, config)


def ppo_update(
    agent: Agent,
    config: PPOConfig,
    optimizer: optax.GradientTransformation,
    carry: OptimizerCarry,
    batch: Batch | SequenceBatch,
    kl_coef: jax.Array,
    key: jax.Array,
) -> tuple[OptimizerCarry, dict[str, jax.Array]]:
    """PPO's update: ``config.update_epochs`` epochs of ``config.num_minibatches`` steps."""
    return run_epochs(
        ppo_loss_function(agent, config, kl_coef),
        optimizer,
        carry,
        batch,
        key,
        num_epochs=config.update_epochs,
        num_minibatches=config.num_minibatches,
        stop_kl=config.target_kl,
        divergence_guard=config.divergence_guard,
    )
