"""GRPO, RLOO and PPO on multi-turn episodes of a text environment, as pure init and step:

    trainer = make_episode_trainer(config, policy_apply, env, num_episodes, max_turns)
    state = trainer.init(policy_params, key)  # PPO: init(policy_params, key, critic_params)
    state, metrics = trainer.step(state, key)

One step plays ``num_episodes`` episodes (groups of ``config.group_size`` from the same reset,
``rollout_episodes``), scores each by the sum of its rewards, recomputes the log-probs of the
model's tokens under the policy and the frozen reference in one forward pass each, gives every
model token of an episode that episode's group advantage (GRPO: normalized within its group,
RLOO: leave-one-out) of score - beta * sum_t KL_t (the score alone with kl_in="loss"), or
with ``turn_weight`` a mix of it and a turn-level advantage (``credit``, MT-GRPO style);
PPO instead reads the critic's values before the model's tokens and runs token-level GAE over
each episode's model tokens in order, the env's tokens skipped (``credit.episode_gae``), and
adds the clipped value loss on the model's tokens. It then runs ``update_epochs`` x
``num_minibatches`` clipped updates through the shared engine. The env's tokens are context
only: they are off ``model_mask``, so no loss term, KL, entropy or value target reads them.
``config.response_len`` is the per-turn token limit. With a Python env (``host``) the step
plays on the host, a compiled call per turn, then runs the compiled update: it is not
jittable as a whole.

Not yet: LoRA, the adaptive KL controller, PPO's critic warm-up and PPO with ``turn_weight``
(each refused). ``missing_eos_penalty`` is not read.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ppojax.checks import ConfigError
from ppojax.engine import losses
from ppojax.engine.epochs import OptimizerCarry, run_epochs
from ppojax.engine.optim import clipped_adam
from ppojax.rlhf.agents.credit import episode_gae, mixed_advantages, turn_advantages
from ppojax.rlhf.agents.env import TextEnv
from ppojax.rlhf.agents.episodes import (
    EpisodeLayout,
    Episodes,
    EpisodeSettings,
    episode_stats,
    episode_values,
    rollout_episodes,
)
from ppojax.rlhf.agents.host import HostRollout, runs_on_host
from ppojax.rlhf.core import advantages as adv
from ppojax.rlhf.core.config import RLHFConfig
from ppojax.rlhf.core.objective import clipped_policy_loss
from ppojax.rlhf.core.sampling import KVCacheHook, PolicyApply
from ppojax.rlhf.core.trainer import CriticApply, RLHFState, initial_state


class EpisodeBatch(NamedTuple):
    """The update's rows, all [N, L]: the episodes' tokens, real-token mask and model-token
    mask, the sampling policy's and the reference's log-probs, the advantages (0 off
    ``model_mask``); PPO's critic values at sampling time and GAE returns (zeros without a
    critic)."""

    tokens: jax.Array
    mask: jax.Array
    model_mask: jax.Array
    log_probs: jax.Array
    ref_log_probs: jax.Array
    advantages: jax.Array
    values: jax.Array
    returns: jax.Array


class EpisodeTrainer(NamedTuple):
    """Pure ``init(policy_params, key, critic_params=None) -> RLHFState`` and
    ``step(state, key) -> (state, metrics)``."""

    init: Callable[..., RLHFState]
    step: Callable[..., tuple[RLHFState, dict[str, jax.Array]]]
    config: RLHFConfig
    settings: EpisodeSettings


def episode_advantages(
    config: RLHFConfig,
    scores: jax.Array,
    penalty_kl: jax.Array,
    model_mask: jax.Array,
    kl_coef: jax.Array,
) -> jax.Array:
    """[N, L]: the group advantage [N] of score - beta * sum of the KL [N, L] over the model's
    tokens (beta = 0 with kl_in="loss"), on every model token, 0 elsewhere."""
    beta = kl_coef if config.kl_in == "reward" else 0.0
    rewards = scores - beta * jnp.where(model_mask, penalty_kl, 0.0).sum(axis=1)
    per_row = adv.sequence_advantages(
        config.algorithm, rewards, config.group_size, config.group_std
    )
    return jnp.where(model_mask, per_row[:, None], 0.0)


def episode_loss(
    config: RLHFConfig,
    policy_apply: PolicyApply,
    kl_coef: jax.Array,
    params: dict,
    batch: EpisodeBatch,
    *,
    critic_apply: CriticApply | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """-clipped surrogate (+ beta KL with kl_in="loss") - ent_coef H over the model's tokens
    of a minibatch, aggregated by ``config.loss_aggregation``, plus for PPO (``critic_apply``)
    vf_coef * the clipped value loss over the same tokens (the critic's own params, or the
    policy's when the critic is a value head on it); and its metrics."""
    mask = batch.model_mask
    stats = episode_stats(
        policy_apply, params["policy"], batch.tokens, batch.mask, config.temperature
    )
    total, metrics = clipped_policy_loss(
        config,
        kl_coef,
        stats.log_probs,
        stats.entropy,
        batch.log_probs,
        batch.ref_log_probs,
        batch.advantages,
        mask,
    )
    if critic_apply is None:
        return total, metrics
    critic_params = params.get("critic", params["policy"])
    values = episode_values(critic_apply, critic_params, batch.tokens, batch.mask)
    value_loss = losses.value_loss(values, batch.values, batch.returns, config.vf_clip_eps, mask)
    return total + config.vf_coef * value_loss, {**metrics, "loss/value_avg": value_loss}


def check_config(
    config: RLHFConfig,
    num_episodes: int,
    critic_apply: CriticApply | None = None,
    turn_weight: Any = None,
) -> None:
    """ConfigError for what episodes cannot train yet, or a batch that does not split."""
    if config.needs_critic and critic_apply is None:
        raise ConfigError(
            "critic_apply",
            "algorithm='ppo' needs critic_apply(params, tokens, mask) -> values [B, L]; pass "
            "one, or choose algorithm='grpo' or 'rloo', which need no critic.",
        )
    if config.needs_critic and config.critic_warmup_steps:
        raise ConfigError(
            "critic_warmup_steps", "episode training has no critic warm-up yet: set it to 0."
        )
    if config.needs_critic and turn_weight is not None:
        raise ConfigError(
            "algorithm",
            "turn_weight mixes critic-free group advantages; with algorithm='ppo' the critic's "
            "GAE assigns credit per token: leave turn_weight None.",
        )
    if config.lora_rank:
        raise ConfigError("lora_rank", "episode training does not take LoRA adapters yet.")
    if config.adaptive_kl:
        raise ConfigError("adaptive_kl", "episode training keeps beta at kl_coef so far.")
    if config.reward_weights is not None:
        raise ConfigError(
            "reward_weights", "episode rewards come from the env, with no reward functions."
        )
    if num_episodes % (config.group_size * config.num_minibatches):
        raise ConfigError(
            "num_minibatches",
            f"num_episodes {num_episodes} must be a multiple of group_size x num_minibatches "
            f"= {config.group_size} x {config.num_minibatches}.",
        )


def credit(
    config: RLHFConfig,
    episodes: Episodes,
    penalty_kl: jax.Array,
    kl_coef: jax.Array,
    turn_weight: Any,
    turn_index: Any,
) -> jax.Array:
    """[N, L]: each model token's advantage, (1 - w) * episode + w * turn-level
    (``credit``'s module), w = ``turn_weight``; the episode advantage alone when w is None."""
    scores = episodes.rewards.sum(axis=1)
    model_mask = episodes.model_mask
    episode = episode_advantages(config, scores, penalty_kl, model_mask, kl_coef)
    if turn_weight is None:
        return episode
    beta = kl_coef if config.kl_in == "reward" else 0.0
    turn = turn_advantages(
        config.algorithm,
        config.group_size,
        config.group_std,
        episodes.rewards,
        penalty_kl,
        beta,
        model_mask,
        turn_index,
    )
    return mixed_advantages(episode, turn, turn_weight)


def collect_episodes(
    config: RLHFConfig,
    policy_apply: PolicyApply,
    episodes: Episodes,
    state: RLHFState,
    turn_weight: Any = None,
    turn_index: Any = None,
    critic_apply: CriticApply | None = None,
) -> tuple[EpisodeBatch, dict[str, jax.Array]]:
    """The update's batch and the rollout's metrics for episodes the current policy played;
    with ``critic_apply`` (PPO) the advantages are ``episode_gae``'s (whitened over the
    model's tokens when ``config.whiten_advantages``)."""
    policy = state.params["policy"]
    tokens, mask, model_mask = episodes.tokens, episodes.mask, episodes.model_mask
    stats = episode_stats(policy_apply, policy, tokens, mask, config.temperature)
    reference = episode_stats(policy_apply, state.reference, tokens, mask, config.temperature)
    estimate = adv.kl_estimate(stats.log_probs, reference.log_probs, config.kl_estimator)
    penalty_kl = jnp.where(model_mask, estimate, 0.0)
    scores = episodes.rewards.sum(axis=1)
    if critic_apply is None:
        advantages = credit(config, episodes, penalty_kl, state.kl_coef, turn_weight, turn_index)
        values = returns = jnp.zeros(mask.shape, jnp.float32)
    else:
        critic = state.params.get("critic", policy)
        values = jnp.where(model_mask, episode_values(critic_apply, critic, tokens, mask), 0.0)
        beta = state.kl_coef if config.kl_in == "reward" else 0.0
        advantages, returns = episode_gae(
            episodes.rewards, penalty_kl, values, model_mask, turn_index, beta,
            config.gamma, config.gae_lambda,
        )  # fmt: skip
        if config.whiten_advantages:
            advantages = adv.whiten(advantages, model_mask)
    batch = EpisodeBatch(
        tokens, mask, model_mask, stats.log_probs, reference.log_probs, advantages, values,
        returns,
    )  # fmt: skip
    kl = jnp.where(model_mask, stats.log_probs - reference.log_probs, 0.0).sum(axis=1)
    metrics = {
        "episodes/return": scores.mean(),
        "episodes/turns": episodes.num_turns.mean(),
        "episodes/terminated": episodes.terminated.mean(),
        "episodes/model_tokens": model_mask.sum(axis=1).mean(),
        "objective/kl": kl.mean(),
        "objective/entropy": losses.masked_mean(stats.entropy, model_mask),
    }
    if critic_apply is not None:
        metrics["val/explained_variance"] = losses.explained_variance(values, returns, model_mask)
    return batch, metrics


def check_turn_weight(turn_weight: Any) -> None:
    """A ``ValueError`` for a concrete ``turn_weight`` outside [0, 1] (traced ones pass)."""
    if turn_weight is None or isinstance(turn_weight, jax.core.Tracer):
        return
    value = float(turn_weight)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"make_episode_trainer: turn_weight must be in [0, 1], got {value}")


def make_episode_trainer(
    config: RLHFConfig,
    policy_apply: PolicyApply,
    env: TextEnv,
    num_episodes: int,
    max_turns: int,
    token_budget: int | None = None,
    kv_cache: KVCacheHook | None = None,
    turn_weight: Any = None,
    critic_apply: CriticApply | None = None,
) -> EpisodeTrainer:
    """The trainer of ``config.algorithm`` ("grpo", "rloo" or "ppo") on ``num_episodes`` episodes of
    ``env`` per step, each at most ``max_turns`` turns of ``config.response_len`` tokens
    (``token_budget`` model tokens in all). ``kv_cache``: the model's hook with ``extend``;
    without one the rollout recomputes the whole context for every token. ``turn_weight``
    w in [0, 1] (may be traced): each model token of turn k gets (1 - w) * the episode
    advantage + w * turn k's (MT-GRPO style, ``agents.credit``); None: episode-level only.
    ``critic_apply`` (PPO, as ``make_trainer``'s): ``(params, tokens, mask) -> values [B,
    L]``; without critic params at init it reads the policy's (a value head)."""
    check_config(config, num_episodes, critic_apply, turn_weight)
    critic_apply = critic_apply if config.needs_critic else None
    check_turn_weight(turn_weight)
    turn_index = EpisodeLayout(
        env.prompt_len, config.response_len, env.reply_len, max_turns
    ).turn_index
    settings = EpisodeSettings(
        max_turns,
        config.response_len,
        config.temperature,
        config.pad_id,
        config.eos_id,
        token_budget,
    )
    optimizer = clipped_adam(config.learning_rate, config.max_grad_norm)
    model = policy_apply if kv_cache is None else kv_cache

    if runs_on_host(env):
        rollout = HostRollout(model, env, num_episodes, settings, config.group_size)
    else:
        rollout = functools.partial(
            rollout_episodes, model, env=env, batch_size=num_episodes, settings=settings,
            group_size=config.group_size,
        )  # fmt: skip

    def init(policy_params: Any, key: jax.Array, critic_params: Any = None) -> RLHFState:
        """The state at step 0, with the critic's own params when given; ``key`` is unused
        (no adapters to draw), kept for the trainer's signature."""
        del key
        return initial_state(config, optimizer, policy_params, policy_params, critic_params)

    def learn(
        state: RLHFState, episodes: Episodes, key: jax.Array
    ) -> tuple[RLHFState, dict[str, jax.Array]]:
        """Score the episodes and update the policy on them (see the module)."""
        batch, metrics = collect_episodes(
            config, policy_apply, episodes, state, turn_weight, turn_index, critic_apply
        )
        loss = functools.partial(
            episode_loss, config, policy_apply, state.kl_coef, critic_apply=critic_apply
        )
        carry, update_metrics = run_epochs(
            loss,
            optimizer,
            OptimizerCarry(state.params, state.opt_state),
            batch,
            key,
            num_epochs=config.update_epochs,
            num_minibatches=config.num_minibatches,
            stop_kl=None,
            divergence_guard=config.divergence_guard,
        )
        state = state.replace(params=carry.params, opt_state=carry.opt_state, step=state.step + 1)
        return state, {**metrics, **update_metrics}

    compiled_learn = jax.jit(learn)

    def step(state: RLHFState, key: jax.Array) -> tuple[RLHFState, dict[str, jax.Array]]:
        """One iteration: play, score, update (see the module). With a Python env the
        rollout runs on the host and the update is compiled apart: call it without jit."""
        sample_key, update_key = jax.random.split(key)
        episodes = rollout(state.params["policy"], key=sample_key)
        if runs_on_host(env):
            return compiled_learn(state, episodes, update_key)
        return learn(state, episodes, update_key)

    return EpisodeTrainer(init, step, config, settings)
