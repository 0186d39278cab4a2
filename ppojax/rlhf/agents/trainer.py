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
each episode's model tokens in order, the env's tokens skipped (``credit.slot_gae``), and
adds the clipped value loss on the model's tokens. It then runs ``update_epochs`` x
``num_minibatches`` clipped updates through the shared engine, and the adaptive KL
controller. The env's tokens are context only: they are off ``model_mask``, so no loss term,
KL, entropy or value target reads them. ``config.response_len`` is the per-turn token limit.
With a Python env (``host``) the step plays on the host, a compiled call per turn, then runs
the compiled update: it is not jittable as a whole.

The update reads each episode's model tokens in ``credit.Slots`` (moved to the front, in
order), so every per-token array is [N, M] with M = max_turns * response_len: for a one-turn
episode these are ``make_trainer``'s [N, R] response arrays, and with LoRA, the KL controller
and the critic's warm-up taken from the one-turn trainer (``core.trainer``) the step of a
one-turn env (``one_turn.OneTurnEnv``) is ``make_trainer``'s, bit for bit.

Not yet: PPO with ``turn_weight`` (refused). ``missing_eos_penalty`` is not read.
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
from ppojax.rlhf.agents.credit import (
    Slots,
    episode_token_rewards,
    mixed_advantages,
    model_slots,
    slot_gae,
    turn_advantages,
)
from ppojax.rlhf.agents.env import TextEnv
from ppojax.rlhf.agents.episodes import (
    EpisodeLayout,
    Episodes,
    EpisodeSettings,
    previous_real,
    rollout_episodes,
)
from ppojax.rlhf.agents.host import HostRollout, runs_on_host
from ppojax.rlhf.core import advantages as adv
from ppojax.rlhf.core.config import RLHFConfig
from ppojax.rlhf.core.objective import LossParts, clipped_policy_loss
from ppojax.rlhf.core.sampling import KVCacheHook, PolicyApply, TokenStats
from ppojax.rlhf.core.trainer import (
    CriticApply,
    RLHFState,
    initial_policy,
    initial_state,
    policy_params_fn,
    policy_weight,
    update_kl,
)


class EpisodeBatch(NamedTuple):
    """The update's rows: the episodes' tokens and real-token mask [N, L] (the models'
    input), and per slot [N, M] (``credit.Slots``: the model's tokens in order) the column
    whose outputs predict its token (the previous real column), the token, whether the slot
    is filled, the sampling policy's and the reference's log-probs, the advantage, PPO's
    critic value at sampling time and GAE return (zeros without a critic)."""

    tokens: jax.Array
    mask: jax.Array
    positions: jax.Array
    targets: jax.Array
    slot_mask: jax.Array
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


def at_positions(outputs: jax.Array, positions: jax.Array) -> jax.Array:
    """``outputs`` [N, L, ...] at ``positions`` [N, M]: [N, M, ...]."""
    index = positions.reshape(positions.shape + (1,) * (outputs.ndim - 2))
    return jnp.take_along_axis(outputs, index, axis=1)


def slot_outputs(outputs: jax.Array, batch: EpisodeBatch, start: int | None) -> jax.Array:
    """A model's outputs [N, L, ...] at the slots' positions: [N, M, ...]. ``start``: None,
    or for one-turn episodes the response's first column, whose M = R model tokens are the
    columns start + [0, R) (the prompt left-padded): there the positions are the slice
    start - 1 + [0, R), read as ``make_trainer`` reads a response, a slice (a gather's
    gradient would sum the rows in another order)."""
    if start is None:
        return at_positions(outputs, batch.positions)
    return outputs[:, start - 1 : start - 1 + batch.positions.shape[1]]


def slot_stats(
    policy_apply: PolicyApply,
    params: Any,
    batch: EpisodeBatch,
    temperature: Any,
    start: int | None = None,
) -> TokenStats:
    """One forward pass over the episodes [N, L]: log softmax(logits / temperature) of each
    slot's token under the logits of its position (``slot_outputs``), and that softmax's
    entropy, both [N, M]; the arithmetic of the one-turn trainer's ``response_stats``."""
    outputs = policy_apply(params, batch.tokens, batch.mask)
    logits = slot_outputs(outputs, batch, start)
    log_softmax = jax.nn.log_softmax(logits / temperature, axis=-1)
    log_probs = jnp.take_along_axis(log_softmax, batch.targets[..., None], axis=-1)[..., 0]
    entropy = -(jnp.exp(log_softmax) * log_softmax).sum(axis=-1)
    return TokenStats(log_probs, entropy)


def episode_advantages(
    config: RLHFConfig,
    scores: jax.Array,
    penalty_kl: jax.Array,
    model_mask: jax.Array,
    kl_coef: jax.Array,
) -> jax.Array:
    """[N, X]: the group advantage [N] of score - beta * sum of the KL [N, X] over the model's
    tokens (beta = 0 with kl_in="loss"), on every model token, 0 elsewhere; X is the columns
    or the slots."""
    beta = kl_coef if config.kl_in == "reward" else 0.0
    rewards = scores - beta * jnp.where(model_mask, penalty_kl, 0.0).sum(axis=1)
    per_row = adv.sequence_advantages(
        config.algorithm, rewards, config.group_size, config.group_std
    )
    return jnp.where(model_mask, per_row[:, None], 0.0)


def episode_loss(
    config: RLHFConfig,
    parts: LossParts,
    params: dict,
    batch: EpisodeBatch,
    start: int | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The one-turn trainer's ``rlhf_loss`` over a minibatch's slots: policy_on * (-clipped
    surrogate (+ beta KL with kl_in="loss") - ent_coef H), aggregated by
    ``config.loss_aggregation``, plus for PPO (``parts.critic_apply``) vf_coef * the clipped
    value loss (the critic's own params, or the policy's when the critic is a value head on
    it); and its metrics. ``start``: see ``slot_outputs``."""
    policy = parts.policy_params(params)
    stats = slot_stats(parts.policy_apply, policy, batch, config.temperature, start)
    loss, metrics = clipped_policy_loss(
        config,
        parts.kl_coef,
        stats.log_probs,
        stats.entropy,
        batch.log_probs,
        batch.ref_log_probs,
        batch.advantages,
        batch.slot_mask,
    )
    total = parts.policy_on * loss
    if parts.critic_apply is None:
        return total, metrics
    critic_params = params["critic"] if "critic" in params else policy
    values = slot_outputs(parts.critic_apply(critic_params, batch.tokens, batch.mask), batch, start)
    value_loss = losses.value_loss(
        values, batch.values, batch.returns, config.vf_clip_eps, batch.slot_mask
    )
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
    if config.needs_critic and turn_weight is not None:
        raise ConfigError(
            "algorithm",
            "turn_weight mixes critic-free group advantages; with algorithm='ppo' the critic's "
            "GAE assigns credit per token: leave turn_weight None.",
        )
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
    slots: Slots,
    kl_coef: jax.Array,
    turn_weight: Any,
    turn_index: Any,
) -> jax.Array:
    """[N, M] in slots: each model token's advantage, (1 - w) * episode + w * turn-level
    (``credit``'s module), w = ``turn_weight``; the episode advantage alone when w is None.
    ``penalty_kl`` [N, M] in slots."""
    scores = episodes.rewards.sum(axis=1)
    episode = episode_advantages(config, scores, penalty_kl, slots.mask, kl_coef)
    if turn_weight is None:
        return episode
    beta = kl_coef if config.kl_in == "reward" else 0.0
    model_mask = episodes.model_mask
    turn = turn_advantages(
        config.algorithm,
        config.group_size,
        config.group_std,
        episodes.rewards,
        slots.scatter(penalty_kl, model_mask.shape[1]),
        beta,
        model_mask,
        turn_index,
    )
    return mixed_advantages(episode, slots.gather(turn), turn_weight)


def ppo_advantages(
    config: RLHFConfig,
    episodes: Episodes,
    penalty_kl: jax.Array,
    values: jax.Array,
    slots: Slots,
    kl_coef: jax.Array,
    turn_index: Any,
) -> tuple[jax.Array, jax.Array]:
    """PPO's advantages and returns [N, M] in slots (``credit.slot_gae``), whitened over the
    filled slots when ``config.whiten_advantages``: the one-turn trainer's steps after its
    token rewards, whose score at the end becomes each turn's reward at the turn's end."""
    beta = kl_coef if config.kl_in == "reward" else 0.0
    model_mask = episodes.model_mask
    full_kl = slots.scatter(penalty_kl, model_mask.shape[1])
    rewards = episode_token_rewards(episodes.rewards, full_kl, model_mask, turn_index, beta)
    advantages, returns = slot_gae(
        slots.gather(rewards), values, slots, config.gamma, config.gae_lambda
    )
    if config.whiten_advantages:
        advantages = adv.whiten(advantages, slots.mask)
    return jnp.where(slots.mask, advantages, 0.0), returns


def collect_episodes(
    config: RLHFConfig,
    parts: LossParts,
    episodes: Episodes,
    state: RLHFState,
    num_slots: int,
    turn_weight: Any = None,
    turn_index: Any = None,
    start: int | None = None,
) -> tuple[EpisodeBatch, dict[str, jax.Array]]:
    """The update's batch and the rollout's metrics for episodes the current policy played
    (``parts``: the models and this step's coefficients, as the loss gets them; ``start``:
    see ``slot_outputs``)."""
    policy = parts.policy_params(state.params)
    tokens, mask = episodes.tokens, episodes.mask
    slots = model_slots(episodes.model_mask, num_slots)
    positions = jnp.take_along_axis(previous_real(mask), slots.columns, axis=1)
    zeros = jnp.zeros(slots.mask.shape, jnp.float32)
    batch = EpisodeBatch(
        tokens, mask, positions, slots.gather(tokens), slots.mask, zeros, zeros, zeros, zeros,
        zeros,
    )  # fmt: skip
    temperature = config.temperature
    stats = slot_stats(parts.policy_apply, policy, batch, temperature, start)
    reference = slot_stats(parts.policy_apply, state.reference, batch, temperature, start)
    estimate = adv.kl_estimate(stats.log_probs, reference.log_probs, config.kl_estimator)
    penalty_kl = jnp.where(slots.mask, estimate, 0.0)
    scores = episodes.rewards.sum(axis=1)
    if parts.critic_apply is None:
        advantages = credit(
            config, episodes, penalty_kl, slots, state.kl_coef, turn_weight, turn_index
        )
        values = returns = zeros
    else:
        critic = state.params.get("critic", policy)
        values = slot_outputs(parts.critic_apply(critic, tokens, mask), batch, start)
        advantages, returns = ppo_advantages(
            config, episodes, penalty_kl, values, slots, state.kl_coef, turn_index
        )
    batch = batch._replace(
        log_probs=stats.log_probs,
        ref_log_probs=reference.log_probs,
        advantages=advantages,
        values=values,
        returns=returns,
    )
    kl = jnp.where(slots.mask, stats.log_probs - reference.log_probs, 0.0).sum(axis=1)
    non_score = -state.kl_coef * penalty_kl.sum(axis=1)
    metrics = {
        "objective/non_score_reward": non_score.mean(),
        "objective/rlhf_reward": (scores + non_score).mean(),
        "episodes/return": scores.mean(),
        "episodes/turns": episodes.num_turns.mean(),
        "episodes/terminated": episodes.terminated.mean(),
        "episodes/model_tokens": episodes.model_mask.sum(axis=1).mean(),
        "objective/kl": kl.mean(),
        "objective/entropy": losses.masked_mean(stats.entropy, slots.mask),
        "objective/kl_coef": state.kl_coef,
    }
    if parts.critic_apply is not None:
        metrics["val/explained_variance"] = losses.explained_variance(values, returns, slots.mask)
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
    L]``; without critic params at init it reads the policy's (a value head). LoRA
    (``lora_rank``), the adaptive KL controller and ``critic_warmup_steps`` work as in
    ``make_trainer``."""
    check_config(config, num_episodes, critic_apply, turn_weight)
    critic_apply = critic_apply if config.needs_critic else None
    check_turn_weight(turn_weight)
    layout = EpisodeLayout(env.prompt_len, config.response_len, env.reply_len, max_turns)
    turn_index = layout.turn_index
    start = layout.prompt_len if max_turns == 1 else None
    num_slots = min(
        max_turns * config.response_len, token_budget or max_turns * config.response_len
    )
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
        """The state at step 0 (``make_trainer``'s): the policy (or zero-effect adapters drawn
        with ``key``), the critic's own params when given, the frozen reference, beta."""
        policy = initial_policy(config, policy_params, key)
        return initial_state(config, optimizer, policy, policy_params, critic_params)

    def learn(
        state: RLHFState, episodes: Episodes, key: jax.Array
    ) -> tuple[RLHFState, dict[str, jax.Array]]:
        """Score the episodes, update the policy on them, then beta (see the module)."""
        full_policy = policy_params_fn(config, state.reference)
        parts = LossParts(
            policy_apply,
            critic_apply,
            full_policy,
            state.kl_coef,
            policy_weight(config, state.step),
        )
        batch, metrics = collect_episodes(
            config, parts, episodes, state, num_slots, turn_weight, turn_index, start
        )
        carry, update_metrics = run_epochs(
            functools.partial(episode_loss, config, parts, start=start),
            optimizer,
            OptimizerCarry(state.params, state.opt_state),
            batch,
            key,
            num_epochs=config.update_epochs,
            num_minibatches=config.num_minibatches,
            stop_kl=None,
            divergence_guard=config.divergence_guard,
        )
        metrics = {**metrics, **update_metrics}
        kl_coef = state.kl_coef
        if config.adaptive_kl:
            kl_coef = update_kl(config, kl_coef, metrics["objective/kl"], batch)
        state = state.replace(
            params=carry.params, opt_state=carry.opt_state, kl_coef=kl_coef, step=state.step + 1
        )
        return state, metrics

    compiled_learn = jax.jit(learn)

    def step(state: RLHFState, key: jax.Array) -> tuple[RLHFState, dict[str, jax.Array]]:
        """One iteration: play, score, update (see the module). With a Python env the
        rollout runs on the host and the update is compiled apart: call it without jit."""
        sample_key, update_key = jax.random.split(key)
        policy = policy_params_fn(config, state.reference)(state.params)
        episodes = rollout(policy, key=sample_key)
        if runs_on_host(env):
            return compiled_learn(state, episodes, update_key)
        return learn(state, episodes, update_key)

    return EpisodeTrainer(init, step, config, settings)
