"""The LM trainer: GRPO, RLOO and PPO on episodes of a text environment, as pure init and
step, and on one-turn episodes of the prompts each step is given (``make_trainer``):

    trainer = make_episode_trainer(config, policy_apply, env, num_episodes, max_turns)
    state = trainer.init(policy_params, key)  # PPO: init(policy_params, key, critic_params)
    state, metrics = trainer.step(state, key)

    trainer = make_trainer(config, policy_apply, reward_fns, critic_apply=None)
    state, metrics = trainer.step(state, prompts, prompt_mask, key)

One step plays ``num_episodes`` episodes (groups of ``config.group_size`` from the same reset,
``rollout_episodes``), scores each by the sum of its rewards, then ``learn``s from them, the
one learn step of both: it recomputes the log-probs of the model's tokens under the policy and
the frozen reference in one forward pass each, gives every model token of an episode that
episode's group advantage (GRPO: normalized within its group, RLOO: leave-one-out) of score -
beta * sum_t KL_t (the score alone with kl_in="loss"), or with ``turn_weight`` a mix of it and
a turn-level advantage (``credit``, MT-GRPO style); PPO instead reads the critic's values
before the model's tokens and runs token-level GAE over each episode's model tokens in order,
the env's tokens skipped (``credit.slot_gae``), and adds the clipped value loss on the model's
tokens. It then runs ``update_epochs`` x ``num_minibatches`` clipped updates through the
shared engine (``core.trainer.run_update``), and the KL controller of ``core.kl``. The env's
tokens are context only: they are off ``model_mask``, so no loss term, KL, entropy or value
target reads them. ``config.response_len`` is the per-turn token limit.
The metrics ``env/bad_*`` say where the env's output first went wrong (an id outside the
vocabulary, a reward not finite; ``episodes.env_faults``), -1 where it did not: a JAX env
runs inside the program, where nothing can raise; ``episodes.check_env_faults`` raises for
them after it.
With a Python env (``envs.host``) the step plays on the host, a compiled call per turn, then runs
the compiled update: it is not jittable as a whole.

The update's batch, advantages and loss are in ``update`` (each episode's model tokens in
slots, [N, M]); one-turn episodes read their slots as a slice of the response columns.

Not yet: PPO with ``turn_weight`` (refused). With an env, ``missing_eos_penalty`` is not read
(the env's rewards are the score; ``make_trainer`` subtracts it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import optax

from ppojax.checks import ConfigError
from ppojax.engine.optim import clipped_adam
from ppojax.rlhf.core import sharding
from ppojax.rlhf.core.config import RLHFConfig
from ppojax.rlhf.core.episodes import (
    EpisodeLayout,
    Episodes,
    EpisodeSettings,
    env_faults,
    rollout_episodes,
)
from ppojax.rlhf.core.host_rollout import HostRollout
from ppojax.rlhf.core.objective import LossParts
from ppojax.rlhf.core.prompts import ScoredEpisodes, play_prompts
from ppojax.rlhf.core.sampling import KVCacheHook, PolicyApply
from ppojax.rlhf.core.trainer import (
    CriticApply,
    RLHFState,
    Trainer,
    check_critic,
    check_inputs,
    compute_params,
    initial_policy,
    initial_state,
    policy_params_fn,
    policy_weight,
    reward_names,
    run_update,
)
from ppojax.rlhf.core.turns import check_context, check_end_of_turn
from ppojax.rlhf.core.update import collect_episodes, episode_loss
from ppojax.rlhf.envs.env import TextEnv
from ppojax.rlhf.envs.host import runs_on_host
from ppojax.rlhf.envs.one_turn import RewardFn


class EpisodeTrainer(NamedTuple):
    """Pure ``init(policy_params, key, critic_params=None) -> RLHFState`` and
    ``step(state, key) -> (state, metrics)``."""

    init: Callable[..., RLHFState]
    step: Callable[..., tuple[RLHFState, dict[str, jax.Array]]]
    config: RLHFConfig
    settings: EpisodeSettings


def check_config(
    config: RLHFConfig,
    num_episodes: int,
    critic_apply: CriticApply | None = None,
    turn_weight: Any = None,
) -> None:
    """ConfigError for what episodes cannot train yet, or a batch that does not split."""
    check_critic(config, critic_apply)
    if config.needs_critic and turn_weight is not None:
        raise ConfigError(
            "algorithm",
            f"turn_weight mixes critic-free group advantages; with algorithm="
            f"{config.algorithm!r} the critic's GAE assigns credit per token: leave "
            "turn_weight None.",
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


def check_turn_weight(turn_weight: Any) -> None:
    """A ``ValueError`` for a concrete ``turn_weight`` outside [0, 1] (traced ones pass)."""
    if turn_weight is None or isinstance(turn_weight, jax.core.Tracer):
        return
    value = float(turn_weight)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"make_episode_trainer: turn_weight must be in [0, 1], got {value}")


class Roles(NamedTuple):
    """The models the update runs, by role: the policy ``(params, tokens, mask) -> logits
    [B, L, V]`` and the critic ``(params, tokens, mask) -> values [B, L]`` (None without one);
    their params live in the state."""

    policy: PolicyApply
    critic: CriticApply | None


class EpisodeShape(NamedTuple):
    """Where the update finds an episode's model tokens: the layout, ``num_slots`` slots a
    row and the turn-level credit's weight (None: episode-level only)."""

    layout: EpisodeLayout
    num_slots: int
    turn_weight: Any = None

    @property
    def start(self) -> int | None:
        """The first response column of one-turn episodes, None for several turns
        (``update.slot_outputs``)."""
        return self.layout.prompt_len if self.layout.max_turns == 1 else None


def initializer(
    config: RLHFConfig, optimizer: optax.GradientTransformation
) -> Callable[..., RLHFState]:
    """A trainer's ``init(policy_params, key, critic_params=None)``: the policy (or
    zero-effect adapters drawn with ``key``), the critic's own params when given, the frozen
    reference and beta = config.kl_coef."""

    def init(policy_params: Any, key: jax.Array, critic_params: Any = None) -> RLHFState:
        policy = initial_policy(config, policy_params, key)
        return initial_state(config, optimizer, policy, policy_params, critic_params)

    return init


def learn(
    config: RLHFConfig,
    optimizer: optax.GradientTransformation,
    roles: Roles,
    shape: EpisodeShape,
    state: RLHFState,
    episodes: Episodes,
    key: jax.Array,
) -> tuple[RLHFState, dict[str, jax.Array]]:
    """The one learn step of every LM trainer: the episodes the current policy played (their
    ``rewards`` the scores) become the update's batch (advantages, log-probs under the
    policy and the reference, values), then ``core.trainer.run_update``: the epochs of
    minibatches and beta."""
    full_policy = policy_params_fn(config, state.reference)
    parts = LossParts(
        roles.policy, roles.critic, full_policy, state.kl_coef, policy_weight(config, state.step)
    )
    computing = state.replace(params=compute_params(state))
    batch, metrics = collect_episodes(
        config, parts, episodes, computing, shape.num_slots, shape.turn_weight,
        shape.layout.turn_index, shape.start,
    )  # fmt: skip
    loss = functools.partial(episode_loss, config, parts, start=shape.start)
    return run_update(config, optimizer, state, loss, batch, key, metrics)


def logits_width(
    config: RLHFConfig, policy_apply: PolicyApply, state: RLHFState, episodes: Episodes
) -> int:
    """The model's vocabulary, from its logits' shape: nothing runs."""
    full_policy = policy_params_fn(config, state.reference)
    logits = jax.eval_shape(policy_apply, full_policy(state.params), episodes.tokens, episodes.mask)
    return logits.shape[-1]


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
    context_len: int | None = None,
) -> EpisodeTrainer:
    """The trainer of ``config.algorithm`` ("grpo", "rloo" or "ppo") on ``num_episodes`` episodes of
    ``env`` per step, each at most ``max_turns`` turns of ``config.response_len`` tokens
    (``token_budget`` model tokens in all). ``kv_cache``: the model's hook with ``extend``;
    without one the rollout recomputes the whole context for every token. ``turn_weight``
    w in [0, 1] (may be traced): each model token of turn k gets (1 - w) * the episode
    advantage + w * turn k's (MT-GRPO style, ``core.credit``); None: episode-level only.
    ``critic_apply`` (PPO, as ``make_trainer``'s): ``(params, tokens, mask) -> values [B,
    L]``; without critic params at init it reads the policy's (a value head). LoRA
    (``lora_rank``), the adaptive KL controller and ``critic_warmup_steps`` work as in
    ``make_trainer``. ``context_len``: the positions the model reads (``turns.model_context``
    of it: the built-in transformer's ``max_len``, a pretrained model's
    ``config.max_positions``); given, an episode layout longer than it is a ``ValueError``
    naming both lengths (the model would clip the positions and run on). An env that says its
    ``eos_id`` must say ``config.eos_id``."""
    check_config(config, num_episodes, critic_apply, turn_weight)
    critic_apply = critic_apply if config.needs_critic else None
    check_turn_weight(turn_weight)
    layout = EpisodeLayout(env.prompt_len, config.response_len, env.reply_len, max_turns)
    check_context("make_episode_trainer", layout, context_len)
    env_name = getattr(env, "env_name", None) or type(env).__name__
    check_end_of_turn(env, env_name, config.eos_id)
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
    shape = EpisodeShape(layout, num_slots, turn_weight)
    roles = Roles(policy_apply, critic_apply)

    if runs_on_host(env):
        rollout = HostRollout(model, env, num_episodes, settings, config.group_size)
    else:
        rollout = functools.partial(
            rollout_episodes, model, env=env, batch_size=num_episodes, settings=settings,
            group_size=config.group_size,
        )  # fmt: skip

    def learn_played(state: RLHFState, episodes: Episodes, key: jax.Array):
        state, metrics = learn(config, optimizer, roles, shape, state, episodes, key)
        faults = env_faults(episodes, layout, logits_width(config, policy_apply, state, episodes))
        return state, {**metrics, **faults}

    compiled_learn = jax.jit(learn_played)

    def step(state: RLHFState, key: jax.Array) -> tuple[RLHFState, dict[str, jax.Array]]:
        """One iteration: play, score, update (see the module). With a Python env the
        rollout runs on the host and the update is compiled apart: call it without jit."""
        sample_key, update_key = jax.random.split(key)
        policy = policy_params_fn(config, state.reference)(compute_params(state))
        if runs_on_host(env):
            return compiled_learn(state, rollout(policy, key=sample_key), update_key)
        # decoded in the sampling layout, learned from on the training rows
        episodes = sharding.sample_with(policy, (), lambda p, _: rollout(p, key=sample_key))
        return learn_played(state, sharding.rows_split(episodes), update_key)

    return EpisodeTrainer(initializer(config, optimizer), step, config, settings)


def make_trainer(
    config: RLHFConfig,
    policy_apply: PolicyApply,
    reward_fns: RewardFn | Sequence[RewardFn],
    critic_apply: CriticApply | None = None,
    kv_cache: KVCacheHook | None = None,
) -> Trainer:
    """The trainer of ``config.algorithm`` on the prompts each step is given: one-turn
    episodes of a ``OneTurnEnv`` over them (``step(state, prompts [B, P], prompt_mask [B, P],
    key)``), ``config.group_size`` responses a prompt, learned from by the one learn step of
    ``make_episode_trainer``. ``reward_fns``: one jittable ``reward_fn(prompts, prompt_mask,
    responses, response_mask) -> [B]`` or a list, summed with ``config.reward_weights``,
    minus ``config.missing_eos_penalty`` for a response without EOS. ``critic_apply``
    (PPO): ``(params, tokens, mask) -> values [B, L]``; without critic params at init it
    reads the policy's (a value head). ``kv_cache``: the model's fast sampler; without one
    every token recomputes the whole sequence."""
    fns = (reward_fns,) if callable(reward_fns) else tuple(reward_fns)
    check_inputs(config, fns, critic_apply)
    optimizer = clipped_adam(config.learning_rate, config.max_grad_norm)
    roles = Roles(policy_apply, critic_apply if config.needs_critic else None)
    model = policy_apply if kv_cache is None else kv_cache
    names = reward_names(fns)

    def step(
        state: RLHFState, prompts: jax.Array, prompt_mask: jax.Array, key: jax.Array
    ) -> tuple[RLHFState, dict[str, jax.Array]]:
        """One iteration on left-padded prompts [B, P] with mask [B, P]: answer, score,
        learn."""
        sample_key, update_key = jax.random.split(key)
        policy = policy_params_fn(config, state.reference)(compute_params(state))

        def play(policy: Any, rows: tuple[jax.Array, jax.Array]) -> ScoredEpisodes:
            return play_prompts(config, model, fns, policy, *rows, sample_key)

        # decoded in the sampling layout, learned from on the training rows (core.sharding)
        played = sharding.sample_with(policy, (prompts, prompt_mask), play)
        played = played._replace(episodes=sharding.rows_split(played.episodes))
        layout = EpisodeLayout(prompts.shape[1], config.response_len, 0, 1)
        shape = EpisodeShape(layout, config.response_len)
        state, metrics = learn(config, optimizer, roles, shape, state, played.episodes,
                               update_key)  # fmt: skip
        return state, one_turn_metrics(metrics, played, names)

    return Trainer(initializer(config, optimizer), step, names, config)


def one_turn_metrics(
    metrics: dict[str, jax.Array], played: ScoredEpisodes, names: tuple[str, ...]
) -> dict[str, jax.Array]:
    """The learn step's metrics under the names of a one-turn step (TRL's where they mean
    the same): the score for the return, the completions' length and EOS share, each reward
    function's mean; the episode counts that one turn makes trivial dropped."""
    kept = {name: value for name, value in metrics.items() if not name.startswith("episodes/")}
    episodes = played.episodes
    kept["objective/scores"] = episodes.rewards[:, 0].mean()
    kept["completions/mean_length"] = episodes.model_mask.sum(axis=1).mean()
    kept["completions/eos_fraction"] = played.emitted_eos.mean()
    for name, values in zip(names, played.rewards, strict=True):
        kept[f"rewards/{name}/mean"] = values.mean()
    return kept
