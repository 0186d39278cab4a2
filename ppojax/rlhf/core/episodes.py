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

A Python env (``envs.host.PythonTextEnv``) cannot run inside a program: ``rollout_episodes``
hands it to ``host_rollout.HostRollout``, which plays the same episodes a compiled call per
turn. The pieces both share are in ``turns``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ppojax.rlhf.core.context import Context, episode_context
from ppojax.rlhf.core.host_rollout import rollout_host_episodes
from ppojax.rlhf.core.sampling import KVCacheHook, PolicyApply, TokenStats
from ppojax.rlhf.core.turns import (
    EpisodeLayout,
    Episodes,
    EpisodeSettings,
    TurnCarry,
    TurnOutput,
    assemble,
    episode_layout,
    feed_reply,
    first_carry,
    read_prompts,
    rollout_keys,
    sample_turn,
)
from ppojax.rlhf.envs.env import TextEnv, Tokens, check_observation, check_scalar
from ppojax.rlhf.envs.host import env_raised_at, runs_on_host


def select_rows(chosen: jax.Array, new: Any, old: Any) -> Any:
    """Per row of every leaf: ``new`` where ``chosen`` [B], else ``old``."""

    def pick(a: jax.Array, b: jax.Array) -> jax.Array:
        return jnp.where(chosen.reshape(chosen.shape + (1,) * (a.ndim - 1)), a, b)

    return jax.tree.map(pick, new, old)


class EnvTraceError(ValueError):
    """A JAX text env whose ``reset`` or ``step`` does not trace into the rollout's program
    (a Python ``if`` on a traced value, a state that changes shape or dtype from turn to
    turn), naming the env, the method and the env's own line."""


def defined_at(method: Any) -> str:
    """Where a method is defined, as ``' (FILE:LINE)'``; empty where that is unknown."""
    code = getattr(getattr(method, "__func__", method), "__code__", None)
    return f" ({code.co_filename}:{code.co_firstlineno})" if code else ""


def traced(env_name: str, what: str, method: Callable[..., Any], *args: Any) -> Any:
    """``method(*args)`` while the rollout is traced; an ``EnvTraceError`` naming the env,
    ``what`` and the env's line that raised for anything it raises."""
    try:
        return method(*args)
    except EnvTraceError:
        raise
    except Exception as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise EnvTraceError(
            f"text env {env_name}: {what}() raised {type(error).__name__}"
            f"{env_raised_at(error)} while traced into the rollout's program: {first_line}. A "
            "JAX env's reset and step run on traced arrays: branch with jnp.where or "
            "jax.lax.cond, not a Python if on them"
        ) from error


def checked_reset(env: TextEnv, env_name: str) -> Callable[[jax.Array], tuple]:
    """``env.reset`` traced (``traced``) and its outputs checked (see ``env``)."""

    def reset(key: jax.Array) -> tuple:
        outputs = traced(env_name, "reset", env.reset, key)
        if not (isinstance(outputs, tuple) and len(outputs) == 2):
            raise ValueError(
                f"text env {env_name}: reset() must return (state, prompt), got "
                f"{type(outputs).__name__}"
            )
        return outputs[0], check_observation(env_name, "reset", outputs[1], env.prompt_len)

    return reset


def describe(tree: Any) -> str:
    """A state's leaves as ``{name: dtype[shape], ...}`` (for messages)."""
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    shown = (f"{jax.tree_util.keystr(path) or '.'}: {jnp.result_type(leaf)}{list(jnp.shape(leaf))}"
             for path, leaf in leaves)  # fmt: skip
    return "{" + ", ".join(shown) + "}"


def check_state(env: TextEnv, env_name: str, before: Any, after: Any) -> None:
    """An ``EnvTraceError`` when ``step`` returned a state of another structure, shape or
    dtype than it was given: the rollout carries the state from turn to turn."""

    def signature(tree: Any) -> tuple:
        leaves = jax.tree.leaves(tree)
        return jax.tree.structure(tree), [(jnp.shape(x), jnp.result_type(x)) for x in leaves]

    if signature(before) != signature(after):
        raise EnvTraceError(
            f"text env {env_name}: step(){defined_at(env.step)} returned state "
            f"{describe(after)}, unlike the {describe(before)} it was given; the rollout "
            "carries the state from turn to turn, so step must keep its structure, shapes and "
            "dtypes"
        )


def checked_step(env: TextEnv, env_name: str) -> Callable[..., tuple]:
    """``env.step`` traced (``traced``) with its outputs checked at trace time (shapes,
    dtypes; the state's kept; see ``env``)."""

    def step(state: Any, response: Tokens) -> tuple:
        outputs = traced(env_name, "step", env.step, state, response)
        if not (isinstance(outputs, tuple) and len(outputs) == 4):
            raise ValueError(
                f"text env {env_name}: step() must return (state, reply, reward, done), got "
                f"{type(outputs).__name__}"
            )
        new_state, reply, reward, done = outputs
        check_state(env, env_name, state, new_state)
        reply = check_observation(env_name, "step", reply, env.reply_len)
        reward = check_scalar(env_name, "reward", reward, jnp.float32)
        return new_state, reply, reward, check_scalar(env_name, "done", done, bool)

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
    model_state, logits = feed_reply(context, carry.model_state, carry.logits, reply, column)
    carry = carry._replace(
        env_state=select_rows(stepped, env_state, carry.env_state),
        model_state=model_state,
        logits=logits,
    )
    return carry, reply, jnp.where(stepped, reward, 0.0), stepped & done


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
    starts: tuple[Any, Tokens] | None = None,
) -> Episodes:
    """``batch_size`` episodes of ``env`` played by the model (see the module): through its
    KV cache when ``model`` is a ``KVCacheHook``, else by recomputation with ``model`` as
    the ``policy_apply``. Each run of ``group_size`` adjacent rows starts from the same reset
    (the same secret, the same task), for GRPO's and RLOO's groups, whose prompt the model
    reads once: its state after the prompt is copied to the group's rows. ``starts``: the
    groups' (env states, prompts) [batch_size / group_size, ...] to play from instead of
    resets (a one-turn task's given prompts). ``env_name`` names the env in errors
    (default: its class). A Python env (``envs.host.PythonTextEnv``) is played by
    ``host_rollout.HostRollout`` instead, a compiled call per turn and the env on the host."""
    if runs_on_host(env):
        if starts is not None:
            raise ValueError("a Python env plays from its own resets: pass starts=None")
        return rollout_host_episodes(
            model, params, env, key, batch_size, settings, group_size, env_name
        )
    name = env_name or type(env).__name__
    layout = episode_layout(env, name, settings, batch_size, group_size)
    keys, resets = rollout_keys(key, layout.max_turns, layout.turn_len, batch_size // group_size)
    if starts is None:
        env_state, prompt = jax.vmap(checked_reset(env, name))(resets)
    else:
        env_state, prompt = starts
        prompt = jax.vmap(lambda p: check_observation(name, "reset", p, env.prompt_len))(prompt)
    prompt = Tokens(jnp.where(prompt.mask, prompt.tokens, settings.pad_id), prompt.mask)
    context = episode_context(model, params, layout.length, settings.pad_id, env.reply_len > 0)
    model_state, logits = read_prompts(context, prompt, group_size)
    env_state, prompt = jax.tree.map(
        lambda leaf: jnp.repeat(leaf, group_size, axis=0), (env_state, prompt)
    )
    carry = first_carry(env_state, model_state, logits, settings, layout)
    turns = jnp.arange(layout.max_turns)
    play = functools.partial(play_turn, checked_step(env, name), context, layout, settings)
    _, out = jax.lax.scan(play, carry, (turns, keys))
    return assemble(prompt, out)


class EnvOutputError(RuntimeError):
    """A JAX text env whose output went wrong inside the compiled rollout (a token id outside
    the model's vocabulary, a reward not finite), read from a step's ``env/bad_*`` metrics
    after the program (``check_env_faults``)."""


def first_flagged(flags: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The row and column of the first True of ``flags`` [B, N] in row order; (-1, -1)
    where there is none."""
    found = flags.any()
    row, column = jnp.divmod(jnp.argmax(flags.reshape(-1)), flags.shape[1])
    return jnp.where(found, row, -1), jnp.where(found, column, -1)


def env_faults(episodes: Episodes, layout: EpisodeLayout, vocab_size: int) -> dict[str, jax.Array]:
    """Where an env's output first went wrong in a batch of episodes, as int32 metrics (-1:
    nowhere): ``env/bad_token_episode``, ``env/bad_token_turn`` (-1: the prompt) and
    ``env/bad_token_id`` for an id of the env's outside [0, ``vocab_size``);
    ``env/bad_reward_episode`` and ``env/bad_reward_turn`` for a reward NaN or inf. Inside a
    program nothing can raise, and such ids or rewards turn the loss NaN, a run that seems to
    diverge: ``check_env_faults`` reads these after it."""
    env_tokens = episodes.mask & ~episodes.model_mask
    outside = (episodes.tokens < 0) | (episodes.tokens >= vocab_size)
    row, column = first_flagged(env_tokens & outside)
    turn = jnp.where(row >= 0, jnp.asarray(layout.turn_index)[column], -1)
    token = jnp.where(row >= 0, episodes.tokens[row, column], -1)
    reward_row, reward_turn = first_flagged(~jnp.isfinite(episodes.rewards))
    faults = {
        "env/bad_token_episode": row,
        "env/bad_token_turn": turn,
        "env/bad_token_id": token,
        "env/bad_reward_episode": reward_row,
        "env/bad_reward_turn": reward_turn,
    }
    return {name: value.astype(jnp.int32) for name, value in faults.items()}


def check_env_faults(
    metrics: dict[str, Any], env_name: str, vocab_size: int, first_step: int = 0
) -> None:
    """An ``EnvOutputError`` naming the env, the turn, the episode and the training step for
    the first fault ``env_faults`` flagged in ``metrics`` (each a scalar or [..., steps],
    the steps after ``first_step``); nothing where there is none."""
    if "env/bad_token_episode" not in metrics:
        return
    per_step = {name: np.asarray(value).reshape(-1) for name, value in metrics.items()
                if name.startswith("env/bad_")}  # fmt: skip
    for index in range(per_step["env/bad_token_episode"].size):
        fault = {name: int(value[index]) for name, value in per_step.items()}
        step = f"training step {first_step + index + 1}"
        episode, turn = fault["env/bad_token_episode"], fault["env/bad_token_turn"]
        where = "reset()" if turn < 0 else f"step() at turn {turn}"
        if episode >= 0:
            part = "prompt" if turn < 0 else "reply"
            raise EnvOutputError(
                f"text env {env_name}: {where}, episode {episode} of {step} returned its {part} "
                f"wrongly: token id {fault['env/bad_token_id']} is outside the model's "
                f"vocabulary [0, {vocab_size})"
            )
        episode, turn = fault["env/bad_reward_episode"], fault["env/bad_reward_turn"]
        if episode >= 0:
            raise EnvOutputError(
                f"text env {env_name}: step() at turn {turn}, episode {episode} of {step} "
                "returned a reward that is NaN or inf; it must be finite"
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


def episode_values(
    critic_apply: Callable[[Any, jax.Array, jax.Array], jax.Array],
    params: Any,
    tokens: jax.Array,
    mask: jax.Array,
) -> jax.Array:
    """[B, L]: V of the state before each column's token, the critic's value at the previous
    real column (the position whose logits predict the token), as ``episode_stats`` reads
    log-probs; meaningful on ``model_mask``."""
    values = critic_apply(params, tokens, mask)
    return jnp.take_along_axis(values, previous_real(mask), axis=1)
