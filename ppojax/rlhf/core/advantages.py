"""Rewards and advantages of PPO (token-level GAE), GRPO and RLOO, and ``ESTIMATORS``: each
algorithm's advantage by name, which ``RLHFConfig.algorithm`` names.

Responses are rows [N, R] with a mask of real tokens; for GRPO and RLOO the N rows are
``N / G`` prompts times ``G = group_size`` samples, the samples of one prompt adjacent.
An algorithm is one ``Estimator`` in ``ESTIMATORS``: whether it learns a critic (PPO's GAE on
its values), or the group baselines of a critic-free one, over a response's score and over
the turns of the episodes that reached them (``masked``, for the episode trainer's
turn-level credit).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from ppojax.engine import losses
from ppojax.engine.gae import compute_gae


def last_token(mask: jax.Array) -> jax.Array:
    """[N, R] float: 1 at the last real token of each response."""
    following = jnp.concatenate([mask[:, 1:], jnp.zeros_like(mask[:, :1])], axis=1)
    return (mask & ~following).astype(jnp.float32)


def token_rewards(
    scores: jax.Array, kl: jax.Array, mask: jax.Array, kl_coef: jax.Array | float
) -> jax.Array:
    """r_t = -beta * KL_t on real tokens plus the score [N] at the last real token; [N, R].
    With the KL in the loss, pass beta = 0."""
    return jnp.where(mask, -kl_coef * kl, 0.0) + scores[:, None] * last_token(mask)


def token_advantages(
    rewards: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    gamma: jax.Array | float,
    gae_lambda: jax.Array | float,
) -> tuple[jax.Array, jax.Array]:
    """Token-level GAE with ``compute_gae`` (time = response position), all [N, R]: every
    position at or after the last real token is terminal, so no value leaks past the end."""
    terminated = ~mask | last_token(mask).astype(bool)
    next_values = jnp.concatenate([values[:, 1:], jnp.zeros_like(values[:, :1])], axis=1)
    advantages, returns = compute_gae(
        rewards.T,
        values.T,
        next_values.T,
        terminated.T,
        jnp.zeros_like(terminated.T),
        gamma=gamma,
        gae_lambda=gae_lambda,
    )
    return advantages.T, returns.T


def group_advantages(
    rewards: jax.Array, group_size: int, divide_by_std: bool, eps: float = 1e-6
) -> jax.Array:
    """GRPO: (r_i - mean of its group) / (std of its group + eps) for rewards [N]; [N].
    The std is the population std (ddof 0); without ``divide_by_std`` (Dr. GRPO) only the
    mean is removed."""
    groups = rewards.reshape(-1, group_size)
    centered = groups - groups.mean(axis=1, keepdims=True)
    if divide_by_std:
        centered = centered / (groups.std(axis=1, keepdims=True) + eps)
    return centered.reshape(-1)


def leave_one_out_advantages(rewards: jax.Array, group_size: int) -> jax.Array:
    """RLOO: r_i - mean_{j != i} r_j over the other samples of the same prompt; [N]."""
    groups = rewards.reshape(-1, group_size)
    others = (groups.sum(axis=1, keepdims=True) - groups) / (group_size - 1)
    return (groups - others).reshape(-1)


def sequence_rewards(
    scores: jax.Array, kl: jax.Array, mask: jax.Array, kl_coef: jax.Array | float
) -> jax.Array:
    """score - beta * the sum of the KL [N, R] over the real tokens; [N]. The product is
    rounded to float32 before the subtraction in every program, so two programs of one step
    (a one-turn env's drawn prompts, ``make_trainer``'s given ones) give the same bits (see
    ``rounded``)."""
    return scores - rounded(kl_coef * jnp.where(mask, kl, 0.0).sum(axis=1))


def rounded(x: jax.Array) -> jax.Array:
    """``x`` itself, kept a rounded value: XLA's CPU backend contracts a product and the sum
    that reads it into one fused multiply-add (one rounding, not two) when both land in one
    fused loop, which differs between programs; an optimization barrier does not stop it, a
    select on the value does (NaN stays NaN)."""
    return jnp.where(jnp.isnan(x), jnp.nan, x)


def sequence_advantages(
    algorithm: str, rewards: jax.Array, group_size: int, divide_by_std: bool
) -> jax.Array:
    """The critic-free advantage [N] of each response: ``algorithm``'s group baseline
    (``ESTIMATORS``)."""
    return critic_free(algorithm).sequence(rewards, group_size, divide_by_std)


def whiten(advantages: jax.Array, mask: jax.Array) -> jax.Array:
    """Advantages normalized over the real tokens (``engine.losses.normalize``), 0 elsewhere."""
    return jnp.where(mask, losses.normalize(advantages, mask), 0.0)


def masked_group_mean(
    values: jax.Array, members: jax.Array, group_size: int, divide_by_std: bool, eps: float = 1e-6
) -> jax.Array:
    """GRPO over ``values`` [N, T] per column, each group of ``group_size`` adjacent rows
    restricted to its ``members`` [N, T]: (v - mean) / (std + eps) (ddof 0, no division
    without ``divide_by_std``); 0 off ``members``."""
    shape = (-1, group_size, values.shape[1])
    v, m = values.reshape(shape), members.reshape(shape)
    count = m.sum(axis=1, keepdims=True)
    total = jnp.where(m, v, 0.0).sum(axis=1, keepdims=True)
    centered = v - total / jnp.maximum(count, 1)
    if divide_by_std:
        var = jnp.where(m, centered**2, 0.0).sum(axis=1, keepdims=True) / jnp.maximum(count, 1)
        centered = centered / (jnp.sqrt(var) + eps)
    return jnp.where(m, centered, 0.0).reshape(values.shape)


def masked_leave_one_out(
    values: jax.Array, members: jax.Array, group_size: int, divide_by_std: bool, eps: float = 1e-6
) -> jax.Array:
    """RLOO over ``values`` [N, T] per column, as ``masked_group_mean``: v - the mean of the
    other members of its group (0 with no other member); 0 off ``members``.
    ``divide_by_std`` and ``eps`` are GRPO's and unused."""
    del divide_by_std, eps
    shape = (-1, group_size, values.shape[1])
    v, m = values.reshape(shape), members.reshape(shape)
    count = m.sum(axis=1, keepdims=True)
    total = jnp.where(m, v, 0.0).sum(axis=1, keepdims=True)
    others = (total - v) / jnp.maximum(count - 1, 1)
    result = jnp.where(count > 1, v - others, 0.0)
    return jnp.where(m, result, 0.0).reshape(values.shape)


def leave_one_out(rewards: jax.Array, group_size: int, divide_by_std: bool) -> jax.Array:
    """``leave_one_out_advantages`` with the group baselines' signature (``divide_by_std``
    is GRPO's and unused)."""
    del divide_by_std
    return leave_one_out_advantages(rewards, group_size)


SequenceBaseline = Callable[[jax.Array, int, bool], jax.Array]
MaskedBaseline = Callable[..., jax.Array]


class Estimator(NamedTuple):
    """One algorithm's advantage. ``needs_critic``: token GAE on a learned value (the trainers
    then take a ``critic_apply`` and add the value loss). Otherwise the group baselines over
    ``group_size`` samples of a prompt: ``sequence(rewards [N], group_size, divide_by_std)
    -> [N]`` and ``masked(values [N, T], members [N, T], group_size, divide_by_std) ->
    [N, T]``."""

    needs_critic: bool
    sequence: SequenceBaseline | None = None
    masked: MaskedBaseline | None = None

    @property
    def min_group_size(self) -> int:
        """A critic-free baseline compares a sample with the others of its prompt."""
        return 1 if self.needs_critic else 2


# name -> the algorithm's advantage; RLHFConfig.algorithm is one of these names
ESTIMATORS: dict[str, Estimator] = {
    "ppo": Estimator(needs_critic=True),
    "grpo": Estimator(False, group_advantages, masked_group_mean),
    "rloo": Estimator(False, leave_one_out, masked_leave_one_out),
}


def estimator(name: str) -> Estimator:
    """The algorithm registered as ``name``; a ``ValueError`` naming the known ones."""
    if name not in ESTIMATORS:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(ESTIMATORS)}")
    return ESTIMATORS[name]


def critic_free(name: str) -> Estimator:
    """``estimator(name)``, which must have group baselines (not learn a critic)."""
    entry = estimator(name)
    if entry.needs_critic:
        raise ValueError(
            f"algorithm {name!r} learns a critic: its advantages are token GAE, with no group "
            f"baseline; critic-free: {', '.join(critic_free_names())}"
        )
    return entry


def critic_free_names() -> tuple[str, ...]:
    """The registered algorithms that need no critic."""
    return tuple(name for name, entry in ESTIMATORS.items() if not entry.needs_critic)
