"""Policy distributions built from the actor's output.

Discrete actions: a Categorical over the logits, masked where the env gives an action mask.
MultiDiscrete actions (``spec.action_nvec`` = [n_1, ..., n_k]): a product of k Categoricals,
the logits [sum n_i] split in order; log-probabilities, entropies and KLs add up over the k
choices. Continuous actions: a diagonal Gaussian with a state-independent log_std.

A masked action's logit is replaced by the lowest float32: its probability, ``exp`` of that
minus the log-normalizer, is exactly 0, so it is never sampled and adds exactly 0 to the
entropy and the KL, while the logits stay finite, which keeps gradients free of NaN (a logit
of -inf gives 0 * inf in the entropy's gradient). The mask must allow at least one action.

The distributions are a few lines of ``jax.numpy`` each rather than distrax's: the formulas are
exact and tested against NumPy, and importing distrax (with TensorFlow Probability's JAX
substrate) took 1.7 s of ``import ppojax``'s 4.5 s on a 2-core CPU.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from ppojax.envs import EnvSpec
from ppojax.runtime import kernels

MASKED_LOGIT = float(np.finfo(np.float32).min)
HALF_LOG_TWO_PI = 0.5 * math.log(2.0 * math.pi)


class Categorical:
    """A Categorical over ``logits`` [..., n]; with ``choices`` the product of independent
    Categoricals over the second-to-last axis (logits [..., k, n], actions [..., k]), whose
    log-probabilities, entropies and KLs are sums over the k choices."""

    def __init__(self, logits: jax.Array, choices: bool = False):
        self.logits = logits
        self.log_probs = jax.nn.log_softmax(logits, axis=-1)
        self.choices = choices

    def _reduce(self, values: jax.Array) -> jax.Array:
        return values.sum(axis=-1) if self.choices else values

    def log_prob(self, action: jax.Array) -> jax.Array:
        action = jnp.asarray(action, jnp.int32)
        shape = jnp.broadcast_shapes(action.shape, self.log_probs.shape[:-1])
        log_probs = jnp.broadcast_to(self.log_probs, shape + self.log_probs.shape[-1:])
        index = jnp.broadcast_to(action, shape)[..., None]
        picked = jnp.take_along_axis(log_probs, index, axis=-1)[..., 0]
        return self._reduce(picked)

    def entropy(self) -> jax.Array:
        """-sum p log p; a masked action (p exactly 0, log p finite) adds exactly 0."""
        return self._reduce(-(jnp.exp(self.log_probs) * self.log_probs).sum(axis=-1))

    def kl_divergence(self, other: Categorical) -> jax.Array:
        """KL(self || other) = sum p (log p - log q)."""
        difference = self.log_probs - other.log_probs
        return self._reduce((jnp.exp(self.log_probs) * difference).sum(axis=-1))

    def sample(self, seed: jax.Array) -> jax.Array:
        return jax.random.categorical(seed, self.logits, axis=-1)


class DiagGaussian:
    """A Gaussian N(loc, diag(scale^2)) over the last axis of ``loc`` [..., d]."""

    def __init__(self, loc: jax.Array, scale: jax.Array):
        self.loc = loc
        self.scale = scale

    def log_prob(self, action: jax.Array) -> jax.Array:
        z = (action - self.loc) / self.scale
        return (-0.5 * jnp.square(z) - jnp.log(self.scale) - HALF_LOG_TWO_PI).sum(axis=-1)

    def entropy(self) -> jax.Array:
        return (0.5 + HALF_LOG_TWO_PI + jnp.log(self.scale)).sum(axis=-1)

    def kl_divergence(self, other: DiagGaussian) -> jax.Array:
        """KL(self || other) = sum log(s_q / s_p) + (s_p^2 + (m_p - m_q)^2) / (2 s_q^2) - 1/2."""
        variance_ratio = jnp.square(self.scale / other.scale)
        mean_term = jnp.square((self.loc - other.loc) / other.scale)
        return (0.5 * (variance_ratio + mean_term - 1.0 - jnp.log(variance_ratio))).sum(axis=-1)

    def sample(self, seed: jax.Array) -> jax.Array:
        return self.loc + self.scale * jax.random.normal(seed, self.loc.shape, self.loc.dtype)


Distribution = Categorical | DiagGaussian


def masked_logits(logits: jax.Array, action_mask: jax.Array | None) -> jax.Array:
    """``logits`` [..., n] with the entries where ``action_mask`` (bool [..., n]) is False set
    to MASKED_LOGIT; unchanged without a mask."""
    if action_mask is None:
        return logits
    return jnp.where(action_mask, logits, MASKED_LOGIT)


def choice_logits(spec: EnvSpec, logits: jax.Array) -> jax.Array:
    """MultiDiscrete logits [..., sum n_i] as [..., k, max n_i]: choice i's n_i logits, padded
    with MASKED_LOGIT (padding has probability 0, so each row is choice i's Categorical)."""
    widest = max(spec.action_nvec)
    starts = [sum(spec.action_nvec[:i]) for i in range(len(spec.action_nvec))]
    rows = [
        jnp.pad(
            logits[..., start : start + size],
            [(0, 0)] * (logits.ndim - 1) + [(0, widest - size)],
            constant_values=MASKED_LOGIT,
        )
        for start, size in zip(starts, spec.action_nvec, strict=True)
    ]
    return jnp.stack(rows, axis=-2)


def policy_distribution(
    spec: EnvSpec,
    head: jax.Array,
    log_std: jax.Array | None,
    action_mask: jax.Array | None = None,
) -> Distribution:
    """Categorical(logits=head) for discrete actions, with masked actions at probability 0
    (``action_mask`` bool [..., action_dim]); for MultiDiscrete actions the product of
    Categoricals over ``choice_logits``; for continuous actions a diagonal Gaussian
    N(head, exp(log_std)^2)."""
    if spec.action_nvec is not None:
        logits = choice_logits(spec, masked_logits(head, action_mask))
        return Categorical(logits, choices=True)
    if spec.discrete:
        return Categorical(masked_logits(head, action_mask))
    scale = jnp.broadcast_to(jnp.exp(log_std), head.shape)
    return DiagGaussian(head, scale)


def deterministic_action(
    spec: EnvSpec, head: jax.Array, action_mask: jax.Array | None = None
) -> jax.Array:
    """The mode of the policy: argmax of the (masked) logits, per choice for MultiDiscrete
    ([..., k]), or the Gaussian mean."""
    if spec.action_nvec is not None:
        return argmax_last(choice_logits(spec, masked_logits(head, action_mask)))
    if spec.discrete:
        return argmax_last(masked_logits(head, action_mask))
    return head


# Most choices an ``elementwise_argmax`` compares one by one.
ELEMENTWISE_ARGMAX_MAX = 8


def argmax_last(x: jax.Array) -> jax.Array:
    """``jnp.argmax(x, axis=-1)``; in programs lowered for CUDA (the kernels candidate
    "elementwise_argmax", a CUDA default) over at most ELEMENTWISE_ARGMAX_MAX choices
    ``elementwise_argmax``, the same index."""
    if x.shape[-1] > ELEMENTWISE_ARGMAX_MAX:
        return jnp.argmax(x, axis=-1)
    return kernels.by_platform("elementwise_argmax", reduced_argmax, elementwise_argmax)(x)


def reduced_argmax(x: jax.Array) -> jax.Array:
    return jnp.argmax(x, axis=-1)


def elementwise_argmax(x: jax.Array) -> jax.Array:
    """``jnp.argmax(x, axis=-1)`` as a chain of elementwise compares over the last axis: the
    first largest, or the first NaN, as argmax picks. A reduction is a kernel of its own on a
    GPU; compares fuse into the kernel that uses the index (a rollout's env step)."""
    best, index = x[..., 0], jnp.zeros(x.shape[:-1], jnp.int32)
    for choice in range(1, x.shape[-1]):
        value = x[..., choice]
        take = (value > best) | (jnp.isnan(value) & ~jnp.isnan(best))
        best = jnp.where(take, value, best)
        index = jnp.where(take, choice, index)
    return index


def draw_action_noise(spec: EnvSpec, key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Noise for ``shape`` actions at once: standard Gumbel, one per logit (discrete and
    MultiDiscrete), or standard normal, [*shape, action_dim]."""
    sampler = jax.random.gumbel if spec.discrete else jax.random.normal
    return sampler(key, shape + (spec.action_dim,))


def sample_from_noise(
    spec: EnvSpec,
    head: jax.Array,
    log_std: jax.Array | None,
    noise: jax.Array,
    action_mask: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """An action of ``policy_distribution(spec, head, log_std, action_mask)`` and its
    log-probability, from noise drawn beforehand by ``draw_action_noise``: argmax(logits +
    Gumbel) for Categorical (the Gumbel-max trick, as ``jax.random.categorical``; the mask
    applies after the noise is added, so a masked action never wins), per choice for
    MultiDiscrete,
    mean + std * N(0, 1) for the Gaussian. Drawing a rollout's noise in one batch replaces one
    PRNG call per step."""
    if spec.discrete:
        action = deterministic_action(spec, head + noise, action_mask)
    else:
        action = head + jnp.exp(log_std) * noise
    return action, policy_distribution(spec, head, log_std, action_mask).log_prob(action)
