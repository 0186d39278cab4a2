"""State and data types shared by the training loop."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
from flax import struct

from ppojax.envs.normalize import RewardNormalizer, RunningStats

Params = Any
Metrics = dict[str, jax.Array]

METRIC_NAMES: tuple[str, ...] = (
    "episode_return",  # mean return of the episodes that ended in the rollout; NaN if none did
    "episode_length",  # mean length of those episodes; NaN if none ended
    "episodes_finished",  # how many episodes ended in the rollout
    "policy_loss",  # clipped surrogate as a quantity to minimize, mean over minibatches
    "value_loss",  # 0.5 * squared error (clipped when vf_clip_eps is set)
    "entropy",  # mean policy entropy over the minibatches
    "approx_kl",  # mean of (r - 1) - log r, an unbiased estimate of KL(pi_old || pi)
    "penalty_kl",  # analytic KL(pi_old || pi) in the loss, mean over the minibatch steps
    "clip_fraction",  # fraction of samples with |r - 1| > clip_eps
    "explained_variance",  # 1 - Var(returns - values) / Var(returns) of the rollout
    "learning_rate",  # learning rate at the update's first gradient step
    "grad_norm",  # global gradient norm before clipping, mean over minibatches
    "env_steps",  # environment steps taken so far, over all envs
    "gradient_steps",  # minibatch steps taken in this update (fewer after a target_kl stop)
    "kl",  # analytic KL(pi_old || pi_new) after the update, mean over the rollout
    "kl_coef",  # the penalty coefficient beta used in this update
)


class Transition(NamedTuple):
    """One env step for every env; time-major [T, B, ...] after the rollout scan.

    ``obs`` and ``next_obs`` are what the networks see (normalized when observation
    normalization is on); ``next_obs`` is the true next observation, i.e. the final observation
    of an episode that ended at this step. ``action`` is what the policy sampled (unclipped);
    ``reward`` is what the loss sees (scaled/clipped when those options are on), while the
    episode statistics count the env's own rewards. ``policy_head``/``policy_log_std`` are the
    actor's outputs, from which pi_old is rebuilt for the analytic KL.
    """

    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    policy_head: jax.Array
    policy_log_std: jax.Array | None
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    next_obs: jax.Array
    episode_return: jax.Array  # return of the episode that ended here (0 where none did)
    episode_length: jax.Array


class Batch(NamedTuple):
    """Flattened training data for the update: every field is [N, ...]."""

    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    policy_head: jax.Array
    policy_log_std: jax.Array | None
    advantage: jax.Array
    target: jax.Array


@struct.dataclass
class TrainState:
    """Everything that changes during training; arrays only.

    ``obs`` is the env's raw last observation; ``obs_stats`` normalizes observations for the
    networks (identically at evaluation time) when the config turns that on.
    """

    params: Params
    opt_state: Any
    env_state: Any
    obs: jax.Array
    obs_stats: RunningStats
    reward_normalizer: RewardNormalizer
    kl_coef: jax.Array
    key: jax.Array
    update_step: jax.Array
    env_steps: jax.Array
    gradient_steps: jax.Array


class TrainOutput(NamedTuple):
    """What ``train`` returns: the final state and per-update metrics [num_updates]."""

    state: TrainState
    metrics: Metrics
