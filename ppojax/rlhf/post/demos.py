"""Demonstrations for SFT before RL on a text env: episodes a scripted policy plays against
the env, laid out as the rollouts' ``Episodes``, and the SFT loss on the model's tokens only.

    demos = play_demos(env, consistent_guesser(10), key, 256, trainer.settings)
    params, loss_curve = train_on_demos(lm.policy_apply, params, demos, key, steps=300,
                                        batch_size=32, learning_rate=1e-3)

A script is ``script(rng, prompt, history) -> response``: token id lists, ``history`` the
turns so far as (response, reply) pairs, the response with its end-of-turn token. The env
plays as in a rollout (a JAX env through its jitted ``reset`` and ``step``, a Python env
directly), and the episode ends when the env says done or after ``max_turns`` turns. The
env's tokens (prompt, replies) are context: ``demo_loss`` reads the log-probs of the
``model_mask`` tokens only, through ``episode_stats`` as the episode trainer does, so SFT and
RL train the same positions. Training reuses ``post.sft.train_sft`` with that loss.

An env offers its own demonstrations with a method ``demonstrate(rng, prompt, history)``, a
script (``env_script``), which ``ppojax rlhf --env ID --sft-steps N`` plays.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ppojax.engine import losses
from ppojax.rlhf.core.episodes import episode_stats
from ppojax.rlhf.core.sampling import PolicyApply
from ppojax.rlhf.core.turns import EpisodeLayout, Episodes, EpisodeSettings
from ppojax.rlhf.envs import calculator as calc
from ppojax.rlhf.envs import guessing
from ppojax.rlhf.envs.env import Tokens
from ppojax.rlhf.envs.host import runs_on_host
from ppojax.rlhf.post.sft import train_sft

Script = Callable[[np.random.Generator, list[int], list[tuple[list[int], list[int]]]], list[int]]


def consistent_guesser(num_values: int) -> Script:
    """The guessing game's script: a guess drawn uniformly among the numbers the replies so
    far leave possible (it uses the replies, but binary search needs fewer turns)."""

    def script(rng: np.random.Generator, prompt: list[int], history: list) -> list[int]:
        low, high = 0, num_values - 1
        for response, reply in history:
            digits = response[: response.index(guessing.EOS)]
            guess = int("".join(str(t - guessing.FIRST_DIGIT) for t in digits))
            if reply == [guessing.HIGHER]:
                low = max(low, guess + 1)
            elif reply == [guessing.LOWER]:
                high = min(high, guess - 1)
        guess = int(rng.integers(low, high + 1))
        return [guessing.FIRST_DIGIT + int(d) for d in str(guess)] + [guessing.EOS]

    return script


def tool_then_answer(rng: np.random.Generator, prompt: list[int], history: list) -> list[int]:
    """The calculator's script: call the tool on the prompt's sum, then answer its reply."""
    del rng
    if not history:
        return [*calc.encode(calc.decode(prompt[1:]) + "="), calc.EOS]
    return [*history[-1][1], calc.EOS]


def env_script(env: Any) -> Script | None:
    """The script that plays ``env``'s demonstrations: the env's own ``demonstrate(rng,
    prompt, history) -> response`` (a ``Script``), else the built-in one of the guessing game
    or the calculator; None for an env without one."""
    own = getattr(env, "demonstrate", None)
    if callable(own):
        return own
    if isinstance(env, guessing.NumberGuessing):
        return consistent_guesser(env.num_values)
    if isinstance(env, calc.Calculator):
        return tool_then_answer
    return None


def padded(ids: list[int], width: int, pad_id: int, left: bool) -> tuple[list[int], list[bool]]:
    """``ids`` padded to ``width`` (on the left for a prompt) and its mask."""
    gap = width - len(ids)
    if gap < 0:
        raise ValueError(f"{len(ids)} token ids do not fit in {width} columns")
    if left:
        return [pad_id] * gap + ids, [False] * gap + [True] * len(ids)
    return ids + [pad_id] * gap, [True] * len(ids) + [False] * gap


class HostCalls(NamedTuple):
    """An env's reset and step on token id lists, one episode per call."""

    reset: Callable[[jax.Array], tuple[Any, list[int]]]
    step: Callable[[Any, list[int]], tuple[Any, list[int], float, bool]]


def host_calls(env: Any, turn_len: int, pad_id: int) -> HostCalls:
    """``env``'s calls on lists: a Python env's own, a JAX env's jitted, its Tokens read."""
    if runs_on_host(env):
        return HostCalls(env.reset, env.step)
    reset, step = jax.jit(env.reset), jax.jit(env.step)

    def ids(tokens: Tokens) -> list[int]:
        return np.asarray(tokens.tokens)[np.asarray(tokens.mask)].tolist()

    def reset_ids(key: jax.Array) -> tuple[Any, list[int]]:
        state, prompt = reset(key)
        return state, ids(prompt)

    def step_ids(state: Any, response: list[int]) -> tuple[Any, list[int], float, bool]:
        tokens, mask = padded(response, turn_len, pad_id, left=False)
        state, reply, reward, done = step(state, Tokens(jnp.asarray(tokens), jnp.asarray(mask)))
        return state, ids(reply), float(reward), bool(done)

    return HostCalls(reset_ids, step_ids)


def play_demo(
    calls: HostCalls,
    script: Script,
    key: tuple[jax.Array, np.ndarray],
    layout: EpisodeLayout,
    pad_id: int,
) -> tuple[list[int], list[bool], list[bool], list[float], int, bool]:
    """One episode of ``script``, ``key`` its env's reset key and its script's seed: its
    tokens, mask and model mask [L], rewards per turn [max_turns], the turns played and
    whether the env said done."""
    reset_key, script_seed = key
    rng = np.random.default_rng(script_seed.tolist())
    state, prompt = calls.reset(reset_key)
    tokens, mask = padded(prompt, layout.prompt_len, pad_id, left=True)
    model_mask = [False] * layout.prompt_len
    rewards = [0.0] * layout.max_turns
    history: list[tuple[list[int], list[int]]] = []
    done = False
    for turn in range(layout.max_turns):
        response = script(rng, prompt, history)
        state, reply, rewards[turn], done = calls.step(state, response)
        history.append((response, reply))
        for ids, width in ((response, layout.turn_len), (reply, layout.reply_len)):
            more_tokens, more_mask = padded(ids, width, pad_id, left=False)
            tokens, mask = tokens + more_tokens, mask + more_mask
        model_mask += padded(response, layout.turn_len, pad_id, False)[1]
        model_mask += [False] * layout.reply_len
        if done:
            break
    gap = layout.length - len(tokens)
    tokens, mask = tokens + [pad_id] * gap, mask + [False] * gap
    return tokens, mask, model_mask + [False] * gap, rewards, len(history), done


def episodes_of(rows: list[tuple]) -> Episodes:
    """``Episodes`` of played rows (``play_demo``'s tuples), log-probs 0: no model sampled
    them."""
    tokens, mask, model_mask, rewards, turns, done = (
        np.asarray(part) for part in zip(*rows, strict=True)
    )
    return Episodes(
        jnp.asarray(tokens, jnp.int32),
        jnp.asarray(mask, bool),
        jnp.asarray(model_mask, bool),
        jnp.zeros(tokens.shape, jnp.float32),
        jnp.asarray(rewards, jnp.float32),
        jnp.asarray(turns, jnp.int32),
        jnp.asarray(done, bool),
    )


def play_demos(
    env: Any, script: Script, key: jax.Array, num_episodes: int, settings: EpisodeSettings
) -> Episodes:
    """``num_episodes`` episodes of ``script`` against ``env`` (see the module), each from
    its own key split from ``key``, in the layout of a rollout with ``settings`` (log-probs
    0: no model sampled them). A script's turn must end with ``settings.eos_id`` within
    ``turn_len`` tokens; a token budget is not played (a ValueError)."""
    if settings.token_budget is not None:
        raise ValueError("play_demos plays no token budget: use settings with token_budget None")
    layout = EpisodeLayout(env.prompt_len, settings.turn_len, env.reply_len, settings.max_turns)
    calls = host_calls(env, settings.turn_len, settings.pad_id)
    reset_keys, script_keys = jax.random.split(key, (2, num_episodes))
    seeds = np.asarray(jax.random.key_data(script_keys))  # drawn at once: a dispatch is slow
    rows = []
    for episode_key in zip(reset_keys, seeds, strict=True):
        rows.append(
            play_demo(calls, checked(script, settings), episode_key, layout, settings.pad_id)
        )
    return episodes_of(rows)


def checked(script: Script, settings: EpisodeSettings) -> Script:
    """``script`` with each turn checked: it ends with the end-of-turn token and fits."""

    def run(rng: np.random.Generator, prompt: list[int], history: list) -> list[int]:
        response = script(rng, prompt, history)
        if not response or response[-1] != settings.eos_id or len(response) > settings.turn_len:
            raise ValueError(
                f"a script's turn must end with eos_id {settings.eos_id} within turn_len "
                f"{settings.turn_len} tokens, got {response}"
            )
        return response

    return run


class DemoBatch(NamedTuple):
    """Episodes for SFT, all [B, L]: tokens, real-token mask, model-token mask."""

    tokens: jax.Array
    mask: jax.Array
    model_mask: jax.Array


def demo_loss(policy_apply: PolicyApply, params: Any, batch: DemoBatch) -> jax.Array:
    """-mean over the model's tokens [B, L] of log pi(token | the real tokens before it)."""
    stats = episode_stats(policy_apply, params, batch.tokens, batch.mask, 1.0)
    return -losses.masked_mean(stats.log_probs, batch.model_mask)


def demo_batches(demos: Episodes, batch_size: int) -> Callable[[jax.Array], DemoBatch]:
    """``draw(key) -> DemoBatch``: ``batch_size`` demonstrations drawn with replacement."""
    count = demos.tokens.shape[0]

    def draw(key: jax.Array) -> DemoBatch:
        rows = jax.random.randint(key, (batch_size,), 0, count)
        return DemoBatch(demos.tokens[rows], demos.mask[rows], demos.model_mask[rows])

    return draw


def train_on_demos(
    policy_apply: PolicyApply,
    params: Any,
    demos: Episodes,
    key: jax.Array,
    *,
    steps: int,
    batch_size: int,
    learning_rate: Any = 1e-3,
    max_grad_norm: Any = 1.0,
) -> tuple[Any, jax.Array]:
    """``steps`` Adam steps of ``demo_loss`` on batches of ``demos`` (``train_sft``, one
    ``lax.scan``; jittable and vmappable over seeds); the params and the loss [steps]."""
    return train_sft(
        policy_apply,
        params,
        demo_batches(demos, batch_size),
        key,
        steps=steps,
        learning_rate=learning_rate,
        max_grad_norm=max_grad_norm,
        loss=demo_loss,
    )
