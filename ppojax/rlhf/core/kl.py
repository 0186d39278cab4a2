"""The KL penalty of both LM trainers, in one place: the estimators of KL(pi || pi_ref) from
samples of pi (``KL_ESTIMATORS``, by name), where beta weighs it (``kl_in``: in the reward,
``reward_coef``, or in the loss, ``loss_penalty``) and the adaptive controller of beta
(``next_kl_coef``).

Below ``RLHFConfig``, which validates its names against these: the functions that read the
settings take any object with the fields of ``KLSettings`` (an ``RLHFConfig``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp


def k1(log_rho: jax.Array) -> jax.Array:
    """-log rho, the log-ratio itself: unbiased, negative on some tokens."""
    return -log_rho


def k2(log_rho: jax.Array) -> jax.Array:
    """0.5 log^2 rho: never negative, biased."""
    return 0.5 * jnp.square(log_rho)


def k3(log_rho: jax.Array) -> jax.Array:
    """(rho - 1) - log rho: unbiased and never negative."""
    return jnp.expm1(log_rho) - log_rho


# name -> the per-token estimate of log_rho = log pi_ref - log pi
KL_ESTIMATORS: dict[str, Callable[[jax.Array], jax.Array]] = {"k1": k1, "k2": k2, "k3": k3}
# "reward": -beta KL_t is part of each token's reward; "loss": + beta KL_t is a loss term
KL_PLACES = ("reward", "loss")


def kl_estimator(name: str) -> Callable[[jax.Array], jax.Array]:
    """The estimator registered as ``name``; a ``ValueError`` naming the known ones."""
    if name not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {name!r}; known: {', '.join(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[name]


def kl_estimate(log_probs: jax.Array, ref_log_probs: jax.Array, estimator: str) -> jax.Array:
    """Per-token KL(pi || pi_ref) estimate from samples of pi, any shape; log_rho = ref - pi:
    k1 = -log_rho;  k2 = 0.5 log_rho^2;  k3 = (rho - 1) - log_rho."""
    return kl_estimator(estimator)(ref_log_probs - log_probs)


class KLSettings(Protocol):
    """The fields of ``RLHFConfig`` that the penalty reads."""

    kl_in: str
    kl_estimator: str
    adaptive_kl: bool
    kl_target: Any
    kl_horizon: Any


def reward_coef(config: KLSettings, kl_coef: Any) -> Any:
    """The beta that weighs the KL in the rewards: ``kl_coef`` with kl_in="reward", 0 with
    the KL in the loss."""
    return kl_coef if config.kl_in == "reward" else 0.0


def loss_penalty(
    config: KLSettings, kl_coef: Any, log_probs: jax.Array, ref_log_probs: jax.Array
) -> jax.Array | None:
    """The loss's per-token KL term: beta * the estimate under the new log-probs with
    kl_in="loss"; None with the KL in the rewards (no term: the loss's program is the same
    as without a penalty)."""
    if config.kl_in != "loss":
        return None
    return kl_coef * kl_estimate(log_probs, ref_log_probs, config.kl_estimator)


def update_kl_coef(
    kl_coef: jax.Array,
    kl: jax.Array,
    kl_target: jax.Array | float,
    horizon: jax.Array | float,
    batch_size: int,
) -> jax.Array:
    """Adaptive KL controller: e = clip(KL / target - 1, -0.2, 0.2); beta *= 1 + e * n / horizon."""
    error = jnp.clip(kl / kl_target - 1.0, -0.2, 0.2)
    return kl_coef * (1.0 + error * batch_size / horizon)


def update_kl(config: KLSettings, kl_coef: jax.Array, kl: jax.Array, batch: Any) -> jax.Array:
    """The adaptive controller on this step's sequence KL, n = the rows of the batch (any
    pytree of [n, ...] leaves: the trainer's ``EpisodeBatch``)."""
    rows = jax.tree.leaves(batch)[0].shape[0]
    return update_kl_coef(kl_coef, kl, config.kl_target, config.kl_horizon, rows)


def next_kl_coef(config: KLSettings, kl_coef: jax.Array, kl: jax.Array, batch: Any) -> jax.Array:
    """beta for the next step: ``update_kl`` under ``adaptive_kl``, else beta unchanged."""
    return update_kl(config, kl_coef, kl, batch) if config.adaptive_kl else kl_coef
