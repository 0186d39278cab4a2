"""The epochs-of-minibatches engine both halves train with: ``num_epochs`` passes over a batch
in shuffled minibatches, one optimizer step each, with an optional early stop on approximate
KL and an optional divergence guard.

Env PPO (``ppojax.ppo.update``) and RLHF (``ppojax.rlhf``) give it their loss as a function
of (params, minibatch) and their own shuffle where the batch is not a pytree of [N, ...]
leaves (recurrent env sequences).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.flatten_util
import jax.numpy as jnp
import optax

from ppojax.runtime import kernels

LossFn = Callable[[Any, Any], tuple[jax.Array, dict[str, jax.Array]]]
ShuffleFn = Callable[[jax.Array, Any, int], Any]


class OptimizerCarry(NamedTuple):
    params: Any
    opt_state: Any


def flat(tree: Any) -> jax.Array:
    """The leaves of ``tree`` as one vector, in the flat optimizer's order: its norm is the
    one that the optimizer's clipping computes, and XLA computes it once for both."""
    return jax.flatten_util.ravel_pytree(tree)[0]


def flat_norm(tree: Any) -> jax.Array:
    """The global norm of ``tree`` over its leaves as one vector (``flat``), as a flat
    optimizer's clipping computes it (env PPO's)."""
    return optax.tree.norm(flat(tree))


def leaf_norm(tree: Any) -> jax.Array:
    """The global norm of ``tree`` from each leaf's own sum of squares, as a per-leaf
    optimizer's clipping computes it. Over a mesh each device reduces its shards and only
    scalars cross devices, where ``flat_norm``'s concatenation gathered every leaf whole."""
    return optax.tree.norm(tree)


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
    norm: Callable[[Any], jax.Array] = flat_norm,
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
    taken is applied as computed. ``norm``: the global norm of the gradients and updates.
    """
    old = carry.optimizer
    with jax.named_scope("loss_and_grad"):
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(old.params, minibatch)
    with jax.named_scope("optimizer"):
        updates, opt_state = optimizer.update(grads, old.opt_state, old.params)
        grad_norm = norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    take, stopped = jnp.bool_(True), carry.stopped
    if guard:
        finite = finite & jnp.isfinite(norm(updates))
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
    stop_kl: float | jax.Array | None,
    divergence_guard: bool,
    shuffle: ShuffleFn = shuffle_into_minibatches,
    norm: Callable[[Any], jax.Array] = flat_norm,
) -> tuple[OptimizerCarry, dict[str, jax.Array]]:
    """``num_epochs`` passes over ``batch`` (a pytree of [N, ...] leaves, or what ``shuffle``
    splits into minibatches) in freshly shuffled minibatches, one gradient step each, all skipped
    from the first minibatch whose approx_kl exceeds ``stop_kl``, and, with
    ``divergence_guard``, any whose result is not finite (``gradient_step``). Metrics are means
    over the steps taken (NaN when none was); ``gradient_steps`` counts them,
    ``nonfinite_steps`` the steps whose loss or gradients were not finite (skipped by the
    guard, applied without it). ``norm``: ``gradient_step``'s (``leaf_norm`` for sharded
    params).

    The metrics are summed in the loop's carry rather than stacked per step and reduced
    after: a few scalar adds per step instead of one stacking kernel per metric.
    """
    step = functools.partial(
        gradient_step, loss_fn, optimizer, stop_kl, divergence_guard, norm=norm
    )

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

    def shuffle_epoch(epoch_key: jax.Array) -> Any:
        with jax.named_scope("shuffle"):
            return shuffle(epoch_key, batch, num_minibatches)

    start = EpochCarry(carry, jnp.bool_(False))
    zeros = zero_metrics(step, start, jax.eval_shape(shuffle_epoch, key))
    keys = jax.random.split(key, num_epochs)
    end, totals = kernels.scan_epochs(epoch, (start, zeros), keys, shuffle_epoch)
    count = totals.pop("gradient_steps")
    skipped = totals.pop("nonfinite_steps")
    means = jax.tree.map(
        lambda total: jnp.where(count > 0, total / jnp.maximum(count, 1.0), jnp.nan), totals
    )
    return end.optimizer, {**means, "gradient_steps": count, "nonfinite_steps": skipped}
