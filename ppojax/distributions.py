"""Policy distributions (distrax) built from the actor's output.

Discrete actions: a Categorical over the logits, masked where the env gives an action mask.
MultiDiscrete actions (``spec.action_nvec`` = [n_1, ..., n_k]): a product of k Categoricals,
the logits [sum n_i] split in order; log-probabilities, entropies and KLs add up over the k
choices. Continuous actions: a diagonal Gaussian with a state-independent log_std.

A masked action's logit is replaced by the lowest float32: its probability, ``exp`` of that
minus the log-normalizer, is exactly 0, so it is never sampled and adds exactly 0 to the
entropy and the KL, while the logits stay finite, which keeps gradients free of NaN (a logit
of -inf gives 0 * inf in the entropy's gradient). The mask must allow at least one action.
"""

from __future__ import annotations

import distrax
import jax
import jax.numpy as jnp
import numpy as np

from ppojax.envs import EnvSpec

MASKED_LOGIT = float(np.finfo(np.float32).min)


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
) -> distrax.Distribution:
    """Categorical(logits=head) for discrete actions, with masked actions at probability 0
    (``action_mask`` bool [..., action_dim]); for MultiDiscrete actions the product of
    Categoricals over ``choice_logits``; for continuous actions a diagonal Gaussian
    N(head, exp(log_std)^2)."""
    if spec.action_nvec is not None:
        logits = choice_logits(spec, masked_logits(head, action_mask))
        return distrax.Independent(distrax.Categorical(logits=logits), 1)
    if spec.discrete:
        return distrax.Categorical(logits=masked_logits(head, action_mask))
    scale = jnp.broadcast_to(jnp.exp(log_std), head.shape)
    return distrax.MultivariateNormalDiag(loc=head, scale_diag=scale)


def deterministic_action(
    spec: EnvSpec, head: jax.Array, action_mask: jax.Array | None = None
) -> jax.Array:
    """The mode of the policy: argmax of the (masked) logits, per choice for MultiDiscrete
    ([..., k]), or the Gaussian mean."""
    if spec.action_nvec is not None:
        return jnp.argmax(choice_logits(spec, masked_logits(head, action_mask)), axis=-1)
    if spec.discrete:
        return jnp.argmax(masked_logits(head, action_mask), axis=-1)
    return head


def draw_action_noise(spec: EnvSpec, key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Noise for ``shape`` actions at once: standard Gumbel, one per logit (discrete and
    MultiDiscrete), or standard normal, [*shape, action_dim]."""
    draw = jax.random.gumbel if spec.discrete else jax.random.normal
    return draw(key, shape + (spec.action_dim,))


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
