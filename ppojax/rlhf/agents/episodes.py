"""Multi-turn episodes of a language model against a JAX text environment, one compiled
program: ``rollout_episodes(model, params, env, key, batch_size, settings) -> Episodes``.

Each turn the model samples up to ``turn_len`` tokens, ending at its first end-of-turn token
(``eos_id``); the env reads the turn and replies, and its reply joins the context. An episode
ends when the env says ``done``, after ``max_turns`` turns, or when the model has written
``token_budget`` tokens (a turn cut by the budget is not sent to the env: the episode ends
truncated, without that turn's reward).

Every row shares one fixed layout of L = P + max_turns * (R + O) columns: the env's prompt
[P], then per turn k the response slot [R] and the reply slot [O] (``EpisodeLayout``). Tokens
not written (after a turn's EOS, after the episode ended, a reply's padding) hold pad_id with
mask False: the models attend to real tokens only and count positions over them, so the gaps
change no logit (exact for models without sliding-window attention, whose windows would count
the gaps). ``model_mask`` marks the tokens the policy chose, a subset of ``mask``: the env's
tokens are context, never in the policy loss or the KL.

Two decodings, the same tokens for the same key (up to float32 rounding in the logits):

- through the KV cache (``model`` a ``KVCacheHook`` with ``extend``): one prefill of the
  prompt, one single-token ``extend`` per sampled position and one ``extend`` of O tokens per
  reply; the cache carries across turns, nothing is recomputed.
- full recomputation (``model`` a ``policy_apply``): one forward pass over all L columns per
  sampled position and per reply, max_turns * (R + 1) + 1 passes of [B, L].
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ppojax.rlhf.agents.context import Context, cached_context, recomputed_context
from ppojax.rlhf.agents.env import TextEnv, Tokens, check_observation, check_scalar
from ppojax.rlhf.core.sampling import (
    KVCacheHook,
    PolicyApply,
    SamplingSettings,
    TokenStats,
    choose,
)


@dataclasses.dataclass(frozen=True)
class EpisodeSettings:
    """What a rollout plays: at most ``max_turns`` turns of at most ``turn_len`` tokens each
    (``token_budget`` model tokens in all, None: no budget beyond those), sampled at
    ``temperature`` (may be traced); ``eos_id`` ends a turn, ``pad_id`` fills the gaps."""

    max_turns: int
    turn_len: int
    temperature: Any
    pad_id: int
    eos_id: int
    token_budget: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_turns", "turn_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"EpisodeSettings.{name} must be an int >= 1, got {value!r}")
        budget = self.token_budget
        if budget is not None and (not isinstance(budget, int) or budget < 1):
            raise ValueError(f"EpisodeSettings.token_budget must be None or >= 1, got {budget!r}")
        if self.pad_id == self.eos_id:
            raise ValueError("EpisodeSettings.eos_id must differ from pad_id")


@dataclasses.dataclass(frozen=True)
class EpisodeLayout:
    """Where everything sits in an episode's L columns: the prompt [0, P), then turn k's
    response at ``response_start(k)`` + [0, R) and its reply right after, [O] wide."""

    prompt_len: int
    turn_len: int
    reply_len: int
    max_turns: int

    @property
    def length(self) -> int:
        """L = P + max_turns * (R + O)."""
        return self.prompt_len + self.max_turns * (self.turn_len + self.reply_len)

    def response_start(self, turn: Any) -> Any:
        """The first column of turn ``turn``'s response."""
        return self.prompt_len + turn * (self.turn_len + self.reply_len)

    @property
    def turn_index(self) -> np.ndarray:
        """[L] int: the turn each column belongs to (its response or its reply), -1 on the
        prompt."""
        per_turn = np.repeat(np.arange(self.max_turns), self.turn_len + self.reply_len)
        return np.concatenate([np.full(self.prompt_len, -1), per_turn])

    @property
    def response_columns(self) -> np.ndarray:
        """[L] bool: True on the columns of response slots."""
        offset = (np.arange(self.length) - self.prompt_len) % (self.turn_len + self.reply_len)
        return (self.turn_index >= 0) & (offset < self.turn_len)


class Episodes(NamedTuple):
    """A batch of B episodes in the layout's L columns, and what happened in them."""

    tokens: jax.Array  # [B, L] int32, pad_id off the mask
    mask: jax.Array  # [B, L] bool: real tokens (prompt, model and env)
    model_mask: jax.Array  # [B, L] bool: the tokens the policy chose
    log_probs: jax.Array  # [B, L]: their sampling log-probs at the temperature, 0 elsewhere
    rewards: jax.Array  # [B, max_turns]: the env's reward per turn, 0 for turns not played
    num_turns: jax.Array  # [B] int: turns the env read
    terminated: jax.Array  # [B] bool: the env said done (else a budget ended the episode)


class TurnCarry(NamedTuple):
    """What passes from turn to turn, per row: the env's state, the model's state, the
    next-token logits [B, V], whether the episode is over [B] and the token budget left [B]."""

    env_state: Any
    model_state: Any
    logits: jax.Array
    over: jax.Array
    budget_left: jax.Array


class TurnTokens(NamedTuple):
    """One turn's sampled tokens, their log-probs and which are real, each [R, B]."""

    tokens: jax.Array
    log_probs: jax.Array
    real: jax.Array


def sample_turn(
    context: Context, carry: TurnCarry, key: jax.Array, column: Any, settings: EpisodeSettings
) -> tuple[TurnCarry, TurnTokens]:
    """Up to R tokens for each row whose episode goes on: each fed to the model as it is
    drawn, a row stopping at its EOS or when its budget is spent."""
    sampling = SamplingSettings(
        settings.turn_len, settings.temperature, settings.pad_id, settings.eos_id
    )

    def step(state, inputs):
        model_state, logits, ended, budget_left = state
        index, step_key = inputs
        token, log_prob, real = choose(logits, step_key, ended | (budget_left <= 0), sampling)
        model_state, new = context.feed(model_state, token[:, None], real[:, None], column + index)
        logits = jnp.where(real[:, None], new[:, 0], logits)
        ended = ended | (token == settings.eos_id)
        return (model_state, logits, ended, budget_left - real), (token, log_prob, real)

    start = (carry.model_state, carry.logits, carry.over, carry.budget_left)
    inputs = (jnp.arange(settings.turn_len), jax.random.split(key, settings.turn_len))
    (model_state, logits, _, budget_left), turn = jax.lax.scan(step, start, inputs)
    carry = carry._replace(model_state=model_state, logits=logits, budget_left=budget_left)
    return carry, TurnTokens(*turn)


def last_real_logits(logits: jax.Array, chunk_logits: jax.Array, mask: jax.Array) -> jax.Array:
    """The logits [B, V] after a chunk [B, S] (mask [B, S]): those at its last real token, or
    ``logits`` unchanged for a row without one."""
    width = mask.shape[1]
    last = width - 1 - jnp.argmax(mask[:, ::-1], axis=1)
    picked = jnp.take_along_axis(chunk_logits, last[:, None, None], axis=1)[:, 0]
    return jnp.where(mask.any(axis=1)[:, None], picked, logits)


def select_rows(chosen: jax.Array, new: Any, old: Any) -> Any:
    """Per row of every leaf: ``new`` where ``chosen`` [B], else ``old``."""

    def pick(a: jax.Array, b: jax.Array) -> jax.Array:
        return jnp.where(chosen.reshape(chosen.shape + (1,) * (a.ndim - 1)), a, b)

    return jax.tree.map(pick, new, old)


def checked_step(env: TextEnv, env_name: str) -> Callable[..., tuple]:
    """``env.step`` with its outputs checked at trace time (shapes, dtypes; see ``env``)."""

    def step(state: Any, response: Tokens) -> tuple:
        outputs = env.step(state, response)
        if not (isinstance(outputs, tuple) and len(outputs) == 4):
            raise ValueError(
                f"text env {env_name}: step() must return (state, reply, reward, done), got "
                f"{type(outputs).__name__}"
            )
        state, reply, reward, done = outputs
        reply = check_observation(env_name, "step", reply, env.reply_len)
        reward = check_scalar(env_name, "reward", reward, jnp.float32)
        return state, reply, reward, check_scalar(env_name, "done", done, bool)

    return step


def env_turn(
    env_step: Callable[..., tuple],
    context: Context,
    carry: TurnCarry,
    response: Tokens,
    stepped: jax.Array,
    column: Any,
    pad_id: int,
) -> tuple[TurnCarry, Tokens, jax.Array, jax.Array]:
    """The env's answer to the responses [B, R] of the rows in ``stepped`` [B], fed to the
    model at ``column``: the carry after it (env states of other rows kept), the replies
    [B, O] (masked out for other rows), the rewards [B] (0 for other rows) and whether the
    env said done [B]."""
    env_state, reply, reward, done = jax.vmap(env_step)(carry.env_state, response)
    reply_mask = reply.mask & stepped[:, None]
    reply = Tokens(jnp.where(reply_mask, reply.tokens, pad_id), reply_mask)
    model_state, chunk_logits = context.feed(carry.model_state, *reply, column)
    carry = carry._replace(
        env_state=select_rows(stepped, env_state, carry.env_state),
        model_state=model_state,
        logits=last_real_logits(carry.logits, chunk_logits, reply_mask),
    )
    return carry, reply, jnp.where(stepped, reward, 0.0), stepped & done


class TurnOutput(NamedTuple):
    """What one turn adds, per row: the response [B, R] and its log-probs and real tokens,
    the reply [B, O] and its mask, the reward [B], whether the env read the turn [B] and
    whether it said done [B]."""

    response: jax.Array
    log_probs: jax.Array
    response_mask: jax.Array
    reply: jax.Array
    reply_mask: jax.Array
    reward: jax.Array
    stepped: jax.Array
    terminated: jax.Array


def play_turn(
    env_step: Callable[..., tuple],
    context: Context,
    layout: EpisodeLayout,
    settings: EpisodeSettings,
    carry: TurnCarry,
    inputs: tuple[jax.Array, jax.Array],
) -> tuple[TurnCarry, TurnOutput]:
    """Turn ``inputs = (k, key)``: sample, let the env answer the turns that finished (EOS
    or all R tokens), end the episodes that are done, cut by the budget or out of turns."""
    turn, key = inputs
    column = layout.response_start(turn)
    active = ~carry.over
    carry, sampled = sample_turn(context, carry, key, column, settings)
    real = sampled.real.T
    emitted_eos = ((sampled.tokens.T == settings.eos_id) & real).any(axis=1)
    stepped = active & (emitted_eos | real.all(axis=1))
    response = Tokens(sampled.tokens.T, real)
    carry, reply, reward, terminated = env_turn(
        env_step, context, carry, response, stepped, column + layout.turn_len, settings.pad_id
    )
    # An active row that did not finish its turn ran out of budget: its episode ends.
    over = carry.over | terminated | (active & ~stepped) | (turn == layout.max_turns - 1)
    output = TurnOutput(
        response.tokens, sampled.log_probs.T, real, *reply, reward, stepped, terminated
    )
    return carry._replace(over=over), output


def rollout_episodes(
    model: KVCacheHook | PolicyApply,
    params: Any,
    env: TextEnv,
    key: jax.Array,
    batch_size: int,
    settings: EpisodeSettings,
    group_size: int = 1,
    env_name: str | None = None,
) -> Episodes:
    """``batch_size`` episodes of ``env`` played by the model (see the module): through its
    KV cache when ``model`` is a ``KVCacheHook``, else by recomputation with ``model`` as
    the ``policy_apply``. Each run of ``group_size`` adjacent rows starts from the same reset
    (the same secret, the same task), for GRPO's and RLOO's groups. ``env_name`` names the
    env in errors (default: its class)."""
    name = env_name or type(env).__name__
    if batch_size % group_size:
        raise ValueError(f"batch_size {batch_size} is not a multiple of group_size {group_size}")
    layout = EpisodeLayout(env.prompt_len, settings.turn_len, env.reply_len, settings.max_turns)
    reset_key, turns_key = jax.random.split(key)
    resets = jax.random.split(reset_key, batch_size // group_size)
    env_state, prompt = jax.vmap(env.reset)(resets)
    prompt = jax.vmap(lambda p: check_observation(name, "reset", p, env.prompt_len))(prompt)
    env_state, prompt = jax.tree.map(
        lambda leaf: jnp.repeat(leaf, group_size, axis=0), (env_state, prompt)
    )
    prompt = Tokens(jnp.where(prompt.mask, prompt.tokens, settings.pad_id), prompt.mask)
    if isinstance(model, KVCacheHook):
        context = cached_context(model, params, layout.length)
    else:
        context = recomputed_context(model, params, layout.length, settings.pad_id)
    model_state, logits = context.start(prompt)
    budget = settings.token_budget or layout.max_turns * layout.turn_len
    carry = TurnCarry(
        env_state,
        model_state,
        logits,
        jnp.zeros((batch_size,), bool),
        jnp.full((batch_size,), budget, jnp.int32),
    )
    turns = jnp.arange(layout.max_turns)
    keys = jax.random.split(turns_key, layout.max_turns)
    play = functools.partial(play_turn, checked_step(env, name), context, layout, settings)
    _, out = jax.lax.scan(play, carry, (turns, keys))
    return assemble(prompt, out)


def assemble(prompt: Tokens, out: TurnOutput) -> Episodes:
    """The episodes [B, L] from the prompt [B, P] and the turns' outputs [T, B, ...]."""

    def columns(response_part: jax.Array, reply_part: jax.Array, prompt_part: jax.Array):
        per_turn = jnp.concatenate([response_part, reply_part], axis=2)  # [T, B, R + O]
        batch_size = prompt_part.shape[0]
        rest = jnp.swapaxes(per_turn, 0, 1).reshape(batch_size, -1)
        return jnp.concatenate([prompt_part, rest.astype(prompt_part.dtype)], axis=1)

    no_reply = jnp.zeros_like(out.reply_mask)
    tokens = columns(out.response, out.reply, prompt.tokens)
    mask = columns(out.response_mask, out.reply_mask, prompt.mask)
    model_mask = columns(out.response_mask, no_reply, jnp.zeros_like(prompt.mask))
    zeros = jnp.zeros(prompt.mask.shape, out.log_probs.dtype)
    log_probs = columns(out.log_probs, no_reply.astype(out.log_probs.dtype), zeros)
    return Episodes(
        tokens,
        mask,
        model_mask,
        log_probs,
        out.reward.T,
        out.stepped.sum(axis=0),
        out.terminated.any(axis=0),
    )


def previous_real(mask: jax.Array) -> jax.Array:
    """[B, L] int: for each column, the last column before it holding a real token (0 where
    there is none): the position whose logits predict that column's token."""
    columns = jnp.arange(mask.shape[1])
    seen = jax.lax.cummax(jnp.where(mask, columns, -1), axis=1)
    return jnp.maximum(jnp.pad(seen[:, :-1], ((0, 0), (1, 0)), constant_values=-1), 0)


def episode_stats(
    policy_apply: PolicyApply, params: Any, tokens: jax.Array, mask: jax.Array, temperature: Any
) -> TokenStats:
    """One forward pass over the episodes [B, L]: log softmax(logits / temperature) of each
    column's token under the logits of the previous real column, and that distribution's
    entropy, both [B, L] (meaningful on ``model_mask``, where the loss reads them)."""
    logits = policy_apply(params, tokens, mask)
    log_softmax = jax.nn.log_softmax(logits / temperature, axis=-1)
    prev = previous_real(mask)
    predicting = jnp.take_along_axis(log_softmax, prev[:, :, None], axis=1)
    log_probs = jnp.take_along_axis(predicting, tokens[:, :, None], axis=2)[:, :, 0]
    entropy = -(jnp.exp(predicting) * predicting).sum(axis=-1)
    return TokenStats(log_probs, entropy)
