"""The pieces of a multi-turn rollout that both paths share (the one-program rollout of a JAX
env in ``episodes``, the host's turn by turn for a Python env in ``host_rollout``): what a
rollout plays (``EpisodeSettings``), where everything sits (``EpisodeLayout``), the
``Episodes`` it returns, sampling one turn with the model's state carried in, and assembling
the turns."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ppojax.checks import ConfigError, check_range
from ppojax.rlhf.core import sharding
from ppojax.rlhf.core.context import Context
from ppojax.rlhf.core.sampling import SamplingSettings, choose
from ppojax.rlhf.envs.env import Tokens


@dataclasses.dataclass(frozen=True)
class EpisodeSettings:
    """What a rollout plays: at most ``max_turns`` turns of at most ``turn_len`` tokens each
    (``token_budget`` model tokens in all, None: no budget beyond those), sampled at
    ``temperature`` (> 0, may be traced); ``eos_id`` ends a turn, ``pad_id`` fills the gaps.
    ``greedy``: each token is the argmax instead (held-out evaluation), its log-prob still
    read at ``temperature``."""

    max_turns: int
    turn_len: int
    temperature: Any
    pad_id: int
    eos_id: int
    token_budget: int | None = None
    greedy: bool = False

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
        if not isinstance(self.greedy, bool):
            raise ValueError(f"EpisodeSettings.greedy must be a bool, got {self.greedy!r}")
        try:  # temperature 0 would divide the logits by 0: NaN log-probs, PAD tokens
            check_range("EpisodeSettings", "temperature", self.temperature, 0.0, math.inf,
                        open_low=True)  # fmt: skip
        except ConfigError as error:
            raise ConfigError(
                "temperature", f"{error} For greedy decoding pass greedy=True instead."
            ) from None


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


def model_context(model: Any) -> int | None:
    """The positions ``model`` can read, where it says them: its decoder config's
    ``max_positions`` (the built-in transformer, a pretrained model or their ``Decoder``);
    None for anything else (a bare ``policy_apply``)."""
    config = getattr(model, "config", None)
    value = getattr(config, "max_positions", None)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def check_context(where: str, layout: EpisodeLayout, context_len: int | None) -> None:
    """A ``ValueError`` naming both lengths when an episode's columns outnumber the model's
    positions: the model would clip the positions past its context and run on, wrong."""
    if context_len is None or layout.length <= context_len:
        return
    raise ValueError(
        f"{where}: an episode takes up to {layout.length} tokens (EpisodeLayout(prompt_len="
        f"{layout.prompt_len}, turn_len={layout.turn_len}, reply_len={layout.reply_len}, "
        f"max_turns={layout.max_turns}).length), more than the model's context of "
        f"{context_len}: build the model with max_len >= {layout.length}, or play fewer or "
        "shorter turns"
    )


def check_end_of_turn(env: Any, env_name: str, eos_id: int) -> None:
    """A ``ValueError`` when ``env`` says its own end-of-turn token (``eos_id``: a token env's,
    a chat env's template's) and it is not the rollout's: turns would never end where the env
    reads them."""
    env_eos = getattr(env, "eos_id", None)
    if env_eos is None or env_eos == eos_id:
        return
    what = "its chat template's end-of-turn" if hasattr(env, "chat") else "the env's eos_id"
    raise ValueError(
        f"text env {env_name} ends the model's turns at token {env_eos}, {what}, not at eos_id "
        f"{eos_id}: set eos_id (the EpisodeSettings', or RLHFConfig's for the trainer) to "
        f"{env_eos}"
    )


def episode_layout(
    env: Any, env_name: str, settings: EpisodeSettings, batch_size: int, group_size: int
) -> EpisodeLayout:
    """The layout of ``env``'s episodes under ``settings``, once the env's end of turn is the
    rollout's (``check_end_of_turn``) and ``batch_size`` holds whole groups."""
    check_end_of_turn(env, env_name, settings.eos_id)
    if batch_size % group_size:
        raise ValueError(f"batch_size {batch_size} is not a multiple of group_size {group_size}")
    return EpisodeLayout(env.prompt_len, settings.turn_len, env.reply_len, settings.max_turns)


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


def first_carry(
    env_state: Any,
    model_state: Any,
    logits: jax.Array,
    settings: EpisodeSettings,
    layout: EpisodeLayout,
) -> TurnCarry:
    """The carry into turn 0, after the prompts: no episode over, each row (of ``logits``
    [B, V]) with the whole token budget."""
    rows = logits.shape[0]
    budget = settings.token_budget or layout.max_turns * layout.turn_len
    over = jnp.zeros((rows,), bool)
    return TurnCarry(env_state, model_state, logits, over, jnp.full((rows,), budget, jnp.int32))


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
        done = ended | (budget_left <= 0)
        if settings.greedy:
            token, log_prob, real = choose_greedy(logits, done, sampling)
        else:
            token, log_prob, real = choose(logits, step_key, done, sampling)
        model_state, new = context.feed(model_state, token[:, None], real[:, None], column + index)
        logits = jnp.where(real[:, None], new[:, 0], logits)
        ended = ended | (token == settings.eos_id)
        return (model_state, logits, ended, budget_left - real), (token, log_prob, real)

    start = (carry.model_state, carry.logits, carry.over, carry.budget_left)
    inputs = (jnp.arange(settings.turn_len), jax.random.split(key, settings.turn_len))
    (model_state, logits, _, budget_left), turn = jax.lax.scan(step, start, inputs)
    carry = carry._replace(model_state=model_state, logits=logits, budget_left=budget_left)
    return carry, TurnTokens(*turn)


def choose_greedy(
    logits: jax.Array, done: jax.Array, settings: SamplingSettings
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``choose`` without the draw: the argmax token [B] (pad_id where ``done``), its
    log-prob under softmax(logits / temperature) (0 where done) and whether it is real."""
    scaled = jax.nn.log_softmax(logits / settings.temperature, axis=-1)
    token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    log_prob = jnp.take_along_axis(scaled, token[:, None], axis=1)[:, 0]
    real = ~done
    return jnp.where(real, token, settings.pad_id), jnp.where(real, log_prob, 0.0), real


def read_prompts(context: Context, prompt: Tokens, group_size: int) -> tuple[Any, jax.Array]:
    """The model's state and next-token logits [B * group_size, V] after each group's prompt
    [B, P], read once a group (one prefill of [B, P]) and copied to the group's adjacent rows,
    which read the same tokens and so would compute the same state."""
    model_state, logits = context.start(prompt)
    if group_size == 1:
        return model_state, logits
    copied = jax.tree.map(lambda leaf: jnp.repeat(leaf, group_size, axis=0), (model_state, logits))
    return sharding.rows_split(copied)  # over a mesh, as the rows are


def rollout_keys(
    key: jax.Array, max_turns: int, turn_len: int, num_groups: int
) -> tuple[jax.Array, jax.Array]:
    """The keys of a rollout: turn keys [max_turns] (``sample_turn`` draws turn k's token keys
    as split(turn key, R)) and reset keys [num_groups]. Turn 0's key is ``key`` itself, so a
    one-turn episode draws its tokens from the keys ``sample_responses`` draws a response
    from (split(key, R)); the other keys are split(key, R + max_turns - 1 + num_groups)[R:],
    none of which is one of turn 0's token keys."""
    rest = jax.random.split(key, turn_len + max_turns - 1 + num_groups)[turn_len:]
    turn_keys = jnp.concatenate([key[None], rest[: max_turns - 1]])
    return turn_keys, rest[max_turns - 1 :]


def feed_reply(
    context: Context, model_state: Any, logits: jax.Array, reply: Tokens, column: Any
) -> tuple[Any, jax.Array]:
    """The model's state and next-token logits [B, V] after the replies [B, O] fed at
    ``column`` (``logits`` kept for a row whose reply has no real token); nothing to feed
    for an env that never replies (O = 0: a one-turn env)."""
    if reply.tokens.shape[1] == 0:
        return model_state, logits
    model_state, chunk_logits = context.feed(model_state, *reply, column)
    return model_state, last_real_logits(logits, chunk_logits, reply.mask)


def last_real_logits(logits: jax.Array, chunk_logits: jax.Array, mask: jax.Array) -> jax.Array:
    """The logits [B, V] after a chunk [B, S] (mask [B, S]): those at its last real token, or
    ``logits`` unchanged for a row without one."""
    width = mask.shape[1]
    last = width - 1 - jnp.argmax(mask[:, ::-1], axis=1)
    picked = jnp.take_along_axis(chunk_logits, last[:, None, None], axis=1)[:, 0]
    return jnp.where(mask.any(axis=1)[:, None], picked, logits)


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
