"""PPO-Clip's loss and its gradient on one block of rows, in jax.numpy: what each program of
the Pallas kernel in ``ppojax.ppo.kernels.pallas_loss`` computes (that module pads the inputs,
calls the kernel over blocks and sums what the blocks give).

A block goes forward through the actor's and the critic's MLP torsos and heads, takes the
loss's terms per row (the clipped objective, the value loss with its optional clip, the
entropy) and their derivatives as jax.numpy differentiates them (half each way on a tie of a
max or a min), and back through both networks by hand: the (kernel, bias) gradients of every
layer, weighted per row (1 / rows, 0 for padding), and the weighted sums of the METRICS.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

LOWEST = float(np.finfo(np.float32).min)
HALF_LOG_TWO_PI = 0.5 * math.log(2.0 * math.pi)
METRICS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")
ACTIVATIONS = ("tanh", "relu")


class LossSettings(NamedTuple):
    """What shapes the kernel's program (static): the network and which loss terms."""

    activation: str
    action_dim: int
    value_clipped: bool  # vf_clip_eps is set
    continuous: bool = False  # a diagonal Gaussian with a log-std parameter, not a Categorical


class Coefficients(NamedTuple):
    """The loss's numbers, arrays (traced, and batched in a sweep over them)."""

    clip_eps: jax.Array
    vf_clip_eps: jax.Array  # unused unless LossSettings.value_clipped
    vf_coef: jax.Array
    ent_coef: jax.Array


def _activate(name: str, pre: jax.Array) -> jax.Array:
    return jnp.tanh(pre) if name == "tanh" else jnp.maximum(pre, 0.0)


def _activation_grad(name: str, pre: jax.Array, out: jax.Array, grad: jax.Array) -> jax.Array:
    if name == "tanh":
        return grad * (1.0 - out * out)
    return jnp.where(pre > 0.0, grad, 0.0)


def _mlp_forward(name: str, x: jax.Array, layers: list) -> tuple[jax.Array, list]:
    """The torso's output and each layer's (input, pre-activation, output) for the backward."""
    saved = []
    for kernel, bias in layers:
        pre = jnp.dot(x, kernel, preferred_element_type=jnp.float32) + bias
        out = _activate(name, pre)
        saved.append((x, pre, out))
        x = out
    return x, saved


def _mlp_backward(name: str, grad: jax.Array, layers: list, saved: list) -> list:
    """The (kernel, bias) gradients of the torso's layers from the gradient at its output."""
    grads = []
    for index in reversed(range(len(layers))):
        x, pre, out = saved[index]
        grad_pre = _activation_grad(name, pre, out, grad)
        grads.append(
            (
                jnp.dot(x.T, grad_pre, preferred_element_type=jnp.float32),
                jnp.sum(grad_pre, axis=0, keepdims=True),
            )
        )
        if index > 0:  # the observations need no gradient
            grad = jnp.dot(grad_pre, layers[index][0].T, preferred_element_type=jnp.float32)
    return grads[::-1]


def _pick_grad(a_wins: jax.Array, b_wins: jax.Array, grad_a: jax.Array, grad_b: jax.Array):
    """The gradient of max(a, b) or min(a, b) as jax.numpy gives it, from which operand wins:
    half each on a tie."""
    return jnp.where(a_wins, grad_a, jnp.where(b_wins, grad_b, 0.5 * (grad_a + grad_b)))


def _categorical(s: LossSettings, head: jax.Array, action: jax.Array):
    """log pi(action), the entropy, and their gradients in the head (logits) as functions of
    the gradients in them: (log_prob, entropy, head_grad(log_prob_grad, entropy_grad))."""
    column = jax.lax.broadcasted_iota(jnp.int32, head.shape, 1)
    logits = jnp.where(column < s.action_dim, head, LOWEST)
    shifted = logits - jnp.max(logits, axis=1, keepdims=True)
    log_probs = shifted - jnp.log(jnp.sum(jnp.exp(shifted), axis=1, keepdims=True))
    probs = jnp.exp(log_probs)
    chosen = (column == action[:, None]).astype(jnp.float32)
    log_prob = jnp.sum(chosen * log_probs, axis=1)
    entropy = -jnp.sum(probs * log_probs, axis=1)

    def head_grad(log_prob_grad: jax.Array, entropy_grad: jax.Array) -> jax.Array:
        # d log p_a / d logits = onehot(a) - p; d H / d logits = -p (log p + H)
        return log_prob_grad[:, None] * (chosen - probs) - entropy_grad[:, None] * probs * (
            log_probs + entropy[:, None]
        )

    return log_prob, entropy, head_grad


def _gaussian(s: LossSettings, mean: jax.Array, log_std: jax.Array, action: jax.Array):
    """``_categorical`` for N(mean, exp(log_std)^2) over the first action_dim columns; the
    head's gradient and the log-std's (a row [1, A], summed over the block's rows)."""
    real = jax.lax.broadcasted_iota(jnp.int32, mean.shape, 1) < s.action_dim
    inverse_std = jnp.exp(-log_std)
    z = jnp.where(real, (action - mean) * inverse_std, 0.0)
    terms = -0.5 * z * z - log_std - HALF_LOG_TWO_PI
    log_prob = jnp.sum(jnp.where(real, terms, 0.0), axis=1)
    row_entropy = jnp.where(real, 0.5 + HALF_LOG_TWO_PI + log_std, 0.0)
    entropy = jnp.sum(row_entropy, axis=1)

    def head_grad(log_prob_grad: jax.Array, entropy_grad: jax.Array) -> jax.Array:
        return log_prob_grad[:, None] * z * inverse_std  # d log p / d mean = z / std

    def log_std_grad(log_prob_grad: jax.Array, entropy_grad: jax.Array) -> jax.Array:
        # d log p / d log_std = z^2 - 1, d H / d log_std = 1, per real column
        per_row = log_prob_grad[:, None] * (z * z - 1.0) + entropy_grad[:, None]
        return jnp.sum(jnp.where(real, per_row, 0.0), axis=0, keepdims=True)

    return log_prob, entropy, head_grad, log_std_grad


def _clipped_objective(clip_eps: jax.Array, ratio: jax.Array, advantage: jax.Array):
    """min(r A, clip(r) A) per row and its derivative in log r, as jax.numpy differentiates
    it: r A through the unclipped term, through the clipped one only inside the range."""
    inside = (ratio > 1.0 - clip_eps) & (ratio < 1.0 + clip_eps)
    unclipped = ratio * advantage
    clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantage
    grad = _pick_grad(
        unclipped < clipped, unclipped > clipped, unclipped, jnp.where(inside, unclipped, 0.0)
    )
    return jnp.minimum(unclipped, clipped), grad


def _value_error(
    s: LossSettings, c: Coefficients, value: jax.Array, old_value: jax.Array, target: jax.Array
):
    """The value loss's squared error per row (the larger of the plain and the clipped one
    when ``value_clipped``) and its derivative in the value."""
    error = value - target
    squared, grad = error * error, 2.0 * error
    if not s.value_clipped:
        return squared, grad
    change = value - old_value
    clipped_error = old_value + jnp.clip(change, -c.vf_clip_eps, c.vf_clip_eps) - target
    clipped_squared = clipped_error * clipped_error
    within = (change > -c.vf_clip_eps) & (change < c.vf_clip_eps)
    clipped_grad = jnp.where(within, 2.0 * clipped_error, 0.0)
    grad = _pick_grad(squared > clipped_squared, squared < clipped_squared, grad, clipped_grad)
    return jnp.maximum(squared, clipped_squared), grad


def block(
    s: LossSettings,
    c: Coefficients,
    actor: list,
    critic: list,
    log_std: jax.Array | None,
    rows: tuple,
) -> tuple[list, list]:
    """One block of rows: the gradients of its weighted loss, (kernel, bias) per layer, actor
    then critic (then the log-std's for a Gaussian), and its weighted sums of the METRICS."""
    obs, action, old_log_prob, advantage, old_value, target, weight = rows

    # forward: the torsos, then the linear heads
    features, actor_saved = _mlp_forward(s.activation, obs, actor[:-1])
    head_kernel, head_bias = actor[-1]
    head = jnp.dot(features, head_kernel, preferred_element_type=jnp.float32) + head_bias
    if s.continuous:
        log_prob, entropy, head_grad_of, log_std_grad_of = _gaussian(s, head, log_std, action)
    else:
        log_prob, entropy, head_grad_of = _categorical(s, head, action)

    critic_features, critic_saved = _mlp_forward(s.activation, obs, critic[:-1])
    value_kernel, value_bias = critic[-1]
    value_out = jnp.dot(critic_features, value_kernel, preferred_element_type=jnp.float32)
    value_column = jax.lax.broadcasted_iota(jnp.int32, value_out.shape, 1)
    value = jnp.sum(jnp.where(value_column == 0, value_out + value_bias, 0.0), axis=1)

    log_ratio = log_prob - old_log_prob
    ratio = jnp.exp(log_ratio)
    objective, objective_grad = _clipped_objective(c.clip_eps, ratio, advantage)
    squared, squared_grad = _value_error(s, c, value, old_value, target)

    # d loss / d head and d loss / d value; a row weighs 1 / rows (0 for padding)
    log_prob_grad = -weight * objective_grad
    entropy_grad = -c.ent_coef * weight
    logits_grad = head_grad_of(log_prob_grad, entropy_grad)
    value_grad = (c.vf_coef * 0.5 * weight * squared_grad)[:, None]
    value_out_grad = jnp.where(value_column == 0, value_grad, 0.0)

    grads = []
    for layers, saved, top, head_grad, head_kernel_ in (
        (actor, actor_saved, features, logits_grad, head_kernel),
        (critic, critic_saved, critic_features, value_out_grad, value_kernel),
    ):
        below = jnp.dot(head_grad, head_kernel_.T, preferred_element_type=jnp.float32)
        grads += _mlp_backward(s.activation, below, layers[:-1], saved)
        grads.append(
            (
                jnp.dot(top.T, head_grad, preferred_element_type=jnp.float32),
                jnp.sum(head_grad, axis=0, keepdims=True),
            )
        )
    if s.continuous:
        grads.append((log_std_grad_of(log_prob_grad, entropy_grad),))
    outside = (jnp.abs(ratio - 1.0) > c.clip_eps).astype(jnp.float32)
    terms = (-objective, 0.5 * squared, entropy, (ratio - 1.0) - log_ratio, outside)
    return grads, [jnp.sum(weight * term) for term in terms]
