"""State and data types shared by the training loop."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from ppojax.envs import PPOEnv
from ppojax.envs.normalize import RewardNormalizer, RunningStats
from ppojax.networks import ActorCritic

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
    # analytic KL(pi_old || pi) in the loss, mean over the minibatch steps (NaN under PPO-Clip,
    # whose loss has no KL term: approx_kl estimates the same KL)
    "penalty_kl",
    "clip_fraction",  # fraction of samples with |r - 1| > clip_eps
    "explained_variance",  # 1 - Var(returns - values) / Var(returns) of the rollout
    "learning_rate",  # learning rate at the update's first gradient step
    "grad_norm",  # global gradient norm before clipping, mean over minibatches
    "env_steps",  # environment steps taken so far, over all envs
    "gradient_steps",  # minibatch steps taken in this update (fewer after a target_kl stop)
    # minibatch steps whose loss or gradients held a NaN or inf (or, with divergence_guard,
    # their update): skipped by the guard, applied without it (0 in a healthy run)
    "nonfinite_steps",
    "kl",  # analytic KL(pi_old || pi_new) after the update, over the rollout (NaN under clip)
    "kl_coef",  # the penalty coefficient beta used in this update
    # episodes of the rollout that started from a start another had used (0 unless
    # config.reset_pool is set and an env ended more episodes in a rollout than it holds)
    "repeated_starts",
)


class Agent(NamedTuple):
    """The static parts of a run, rebuilt from the config: the env and the network module."""

    env: PPOEnv
    network: ActorCritic


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
    # the recurrent core's state [T, B, S] after reading ``obs``, before any reset at an
    # episode end: V(next_obs) is computed from it (None for a feed-forward policy)
    next_hidden: jax.Array | None = None
    action_mask: jax.Array | None = None  # allowed actions at obs, for envs that mask them


class Batch(NamedTuple):
    """Training data for the update: every field is [N, ...] (flattened steps), or [T, B, ...]
    inside a ``SequenceBatch``. The step taken, what GAE made of it, then what pi_old said at
    the step (its log-prob of the action, value and outputs: the rollout's fields)."""

    obs: jax.Array
    action: jax.Array
    advantage: jax.Array
    target: jax.Array
    log_prob: jax.Array
    value: jax.Array
    policy_head: jax.Array
    policy_log_std: jax.Array | None
    action_mask: jax.Array | None = None


class SequenceBatch(NamedTuple):
    """A recurrent policy's training data: whole env sequences, replayed from ``hidden``.

    ``data`` leaves are time-major [T, B, ...]; ``starts`` [T, B] marks the steps where the
    hidden state was reset before the step (an episode ended at the step before; False at
    t = 0, where ``hidden`` [B, S] is the state the rollout started from).
    """

    data: Batch
    starts: jax.Array
    hidden: jax.Array


@struct.dataclass
class TrainState:
    """Everything that changes during training; arrays only.

    ``obs`` is the env's raw last observation (a pytree of [B, ...] arrays, [B, H, W, C] for
    images); ``obs_stats`` normalizes observations for the networks (identically at
    evaluation time) when the config turns that on. ``hidden`` [B, S] is a recurrent
    policy's state for the next step (reset where an episode just ended); None without one.
    """

    params: Params
    opt_state: Any
    env_state: Any
    obs: jax.Array
    obs_stats: RunningStats | Any  # one RunningStats per observation leaf
    reward_normalizer: RewardNormalizer
    kl_coef: jax.Array
    key: jax.Array
    update_step: jax.Array
    env_steps: jax.Array
    gradient_steps: jax.Array
    hidden: jax.Array | None = None


class TrainOutput(NamedTuple):
    """What ``train`` returns: the final state and per-update metrics [num_updates]."""

    state: TrainState
    metrics: Metrics


def _raw_key_shape() -> tuple[int, ...]:
    """Shape of the raw uint32 data of one key of the default PRNG implementation ([2])."""
    return jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0))).shape


def _describe_key(key: Any) -> str:
    dtype, shape = getattr(key, "dtype", None), getattr(key, "shape", None)
    if isinstance(key, int) and not isinstance(key, bool):
        return f"the int {key} (a seed? pass jax.random.key({key}))"
    if dtype is None or shape is None:
        return f"{key!r} ({type(key).__name__})"
    is_int = jnp.issubdtype(dtype, jnp.integer)
    seed = " (a seed? pass jax.random.key(seed))" if shape == () and is_int else ""
    return f"an array of dtype {dtype} and shape {tuple(shape)}{seed}"


def as_key(key: Any, caller: str = "ppojax.train") -> jax.Array:
    """``key`` as one typed PRNG key: a ``jax.random.key(seed)`` as it is, or the raw uint32
    data of one (``jax.random.PRNGKey(seed)``, [2]) wrapped, which draws the same numbers.

    A batch of keys is a ``ValueError`` that points to ``jax.vmap``; anything else that is not
    a key (a seed, floats, the wrong shape) is a ``TypeError`` saying what was expected.
    """
    dtype, shape = getattr(key, "dtype", None), getattr(key, "shape", None)
    raw_shape = _raw_key_shape()
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        if shape == ():
            return key
        batch = shape
    elif dtype == jnp.uint32 and shape == raw_shape:
        return jax.random.wrap_key_data(key)
    elif dtype == jnp.uint32 and shape is not None and shape[-len(raw_shape) :] == raw_shape:
        batch = shape[: -len(raw_shape)]
    else:
        raise TypeError(
            f"{caller} needs one PRNG key: jax.random.key(seed), or the uint32{list(raw_shape)} "
            f"of jax.random.PRNGKey(seed); got {_describe_key(key)}."
        )
    raise ValueError(
        f"{caller} takes one PRNG key, got a batch of keys of shape {tuple(batch)}; train "
        f"several seeds with jax.vmap({caller}, in_axes=(None, 0))(config, keys) or "
        "ppojax.sweep(config, keys)."
    )


def check_key_batch(keys: Any, caller: str = "ppojax.sweep") -> None:
    """Raise unless ``keys`` is a batch [S] of PRNG keys (typed [S], or raw uint32 [S, 2])."""
    dtype, shape = getattr(keys, "dtype", None), getattr(keys, "shape", None)
    typed = dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)
    raw_shape = _raw_key_shape()
    if typed and len(shape) == 1:
        return
    if not typed and dtype == jnp.uint32 and shape is not None and shape[1:] == raw_shape:
        return
    raise TypeError(
        f"{caller} needs a batch of PRNG keys [num_seeds] such as "
        f"jax.random.split(jax.random.key(0), 4); got {_describe_key(keys)}."
    )
