"""State and data types shared by the training loop."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
from flax import struct

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
    "clip_fraction",  # fraction of samples with |r - 1| > clip_eps
    "explained_variance",  # 1 - Var(returns - values) / Var(returns) of the rollout
    "learning_rate",  # learning rate at the update's first gradient step
    "grad_norm",  # global gradient norm before clipping, mean over minibatches
    "env_steps",  # environment steps taken so far, over all envs
)


class Transition(NamedTuple):
    """One env step for every env; time-major [T, B, ...] after the rollout scan.

    ``action`` is what the policy sampled (unclipped); ``next_obs`` is the true next
    observation, i.e. the final observation of an episode that ended at this step.
    """

    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
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
    advantage: jax.Array
    target: jax.Array


@struct.dataclass
class TrainState:
    """Everything that changes during training; arrays only."""

    params: Params
    opt_state: Any
    env_state: Any
    obs: jax.Array
    key: jax.Array
    update_step: jax.Array
    env_steps: jax.Array


class TrainOutput(NamedTuple):
    """What ``train`` returns: the final state and per-update metrics [num_updates]."""

    state: TrainState
    metrics: Metrics
