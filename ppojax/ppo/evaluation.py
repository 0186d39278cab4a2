"""Evaluation episodes: a policy played for whole episodes on fresh environments.

One function, ``run_episodes``, serves both the evaluation inside the compiled training loop
(``PPOConfig.eval_every``, see ``ppojax.ppo.train.train_step``) and ``ppojax eval``
(``ppojax.runs.policy.evaluate``): given the same policy and key they play the same episodes.

Keys: the evaluation after an update uses ``eval_key(state.key)`` of the state after that
update, ``fold_in(state.key, EVAL_KEY_FOLD)``. Training splits its own keys from
``state.key`` as it does without evaluation, so turning evaluation on leaves every training
key unchanged, and the evaluation episodes never reuse a key of the rollouts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ppojax.envs import PPOEnv
from ppojax.envs.env import StepResult
from ppojax.networks import reset_hidden

# Any fixed number gives a key stream apart from training's splits; this one spells "eval".
EVAL_KEY_FOLD = 0x6576616C

EVAL_METRIC_NAMES: tuple[str, ...] = (
    "eval_return",  # mean return of eval_episodes fresh episodes; NaN on updates without one
    "eval_length",  # mean length of those episodes; NaN on updates without an evaluation
)

# act(obs [N, ...], hidden, key, deterministic=..., action_mask=...) -> (action, hidden), the
# signature of ``ppojax.ppo.rollout.act``; hidden is None for a feed-forward policy.
Act = Callable[..., tuple[jax.Array, jax.Array | None]]


class EpisodeStats(NamedTuple):
    """The first episode of every evaluation env: its return and length, both [N]."""

    returns: jax.Array
    lengths: jax.Array


class EvalCarry(NamedTuple):
    obs: jax.Array  # [N, obs_dim], raw
    env_state: Any  # EpisodeState [N]
    key: jax.Array
    finished: jax.Array  # [N] bool: whether the env's first episode has ended
    returns: jax.Array  # [N] return of that episode once it ended (0 before)
    lengths: jax.Array  # [N]
    step: jax.Array  # steps taken so far
    hidden: jax.Array | None = None  # [N, S] a recurrent policy's state; None if feed-forward


def eval_key(state_key: jax.Array) -> jax.Array:
    """The key of the evaluation after an update, from that update's resulting ``state.key``."""
    return jax.random.fold_in(state_key, EVAL_KEY_FOLD)


def max_episode_steps(env: PPOEnv) -> int:
    """The env's time limit: an adapter's ``time_limit(params)``, else gymnax's
    ``max_steps_in_episode`` (every gymnax env truncates its episodes), else 1000."""
    if callable(getattr(env.env, "time_limit", None)):
        return int(env.env.time_limit(env.env_params))
    return int(getattr(env.env_params, "max_steps_in_episode", 1000))


def eval_start(
    env: PPOEnv, key: jax.Array, episodes: int, hidden: jax.Array | None = None
) -> EvalCarry:
    """``episodes`` freshly reset envs, none finished; ``hidden`` [episodes, S] is a recurrent
    policy's initial state (None for a feed-forward one)."""
    reset_key, key = jax.random.split(key)
    obs, env_state = jax.vmap(env.reset)(jax.random.split(reset_key, episodes))
    return EvalCarry(
        obs=obs,
        env_state=env_state,
        key=key,
        finished=jnp.zeros((episodes,), jnp.bool_),
        returns=jnp.zeros((episodes,), jnp.float32),
        lengths=jnp.zeros((episodes,), jnp.int32),
        step=jnp.int32(0),
        hidden=hidden,
    )


def eval_step(
    env: PPOEnv, act: Act, deterministic: bool, carry: EvalCarry
) -> tuple[EvalCarry, StepResult]:
    """One action and env step for every env; an env whose first episode ends here keeps that
    episode's return and length. ``act`` is an ``Act``; the hidden state (None for a
    feed-forward policy) resets where an episode ended, and ``act`` also gets
    ``action_mask=`` [N, A] for an env with action masks."""
    key, act_key, step_key = jax.random.split(carry.key, 3)
    episodes = carry.finished.shape[0]
    # Envs with action masks (Jumanji) pass them on: a masked action is never taken.
    options = {"deterministic": deterministic}
    mask = env.action_masks(carry.env_state)
    if mask is not None:
        options["action_mask"] = mask
    action, hidden = act(carry.obs, carry.hidden, act_key, **options)
    result, env_state = jax.vmap(env.step)(
        jax.random.split(step_key, episodes), carry.env_state, action
    )
    ended = result.terminated | result.truncated
    ends_now = ended & ~carry.finished
    new_carry = EvalCarry(
        obs=result.obs,
        env_state=env_state,
        key=key,
        finished=carry.finished | ends_now,
        returns=jnp.where(ends_now, result.episode_return, carry.returns),
        lengths=jnp.where(ends_now, result.episode_length, carry.lengths),
        step=carry.step + 1,
        hidden=reset_hidden(hidden, ended),
    )
    return new_carry, result


def run_episodes(
    env: PPOEnv,
    act: Act,
    key: jax.Array,
    episodes: int,
    deterministic: bool,
    hidden: jax.Array | None = None,
) -> EpisodeStats:
    """Return and length [episodes] of one whole episode per env, ``episodes`` envs stepped in
    parallel until every first episode ended (at most the env's time limit, so the loop is
    bounded; under vmap it runs until the last env of the batch is done)."""
    limit = max_episode_steps(env)

    def running(carry: EvalCarry) -> jax.Array:
        return (carry.step < limit) & ~carry.finished.all()

    def step(carry: EvalCarry) -> EvalCarry:
        return eval_step(env, act, deterministic, carry)[0]

    carry = jax.lax.while_loop(running, step, eval_start(env, key, episodes, hidden))
    return EpisodeStats(carry.returns, carry.lengths)


def eval_metrics(stats: EpisodeStats) -> dict[str, jax.Array]:
    """``eval_return`` and ``eval_length``: the means over the episodes (float32 scalars)."""
    return {
        "eval_return": stats.returns.mean(),
        "eval_length": stats.lengths.astype(jnp.float32).mean(),
    }


def skipped_metrics() -> dict[str, jax.Array]:
    """The evaluation metrics of an update without an evaluation: NaN."""
    return {name: jnp.float32(jnp.nan) for name in EVAL_METRIC_NAMES}
