"""One-turn text tasks: a set of prompts and a token reward, as episodes of one turn.

    env = OneTurnEnv(prompts [K, P], prompt_mask [K, P], reward_fn)

``reset`` draws one of the K left-padded prompts, uniformly with its key; ``step`` scores the
model's one turn with ``reward_fn(prompts, prompt_mask, responses, response_mask) -> [B]``
(the reward contract, called on a batch of one), replies nothing (``reply_len`` 0) and ends
the episode. ``make_episode_trainer`` plays it with ``max_turns=1``.

``make_trainer``'s step is the same episodes on the prompts it is given (``play_prompts``):
each prompt starts a group of ``group_size`` episodes, and the responses are scored after the
turn in one batch by all the reward functions (``score``), as a reward model scores best, with
``reward_weights`` and ``missing_eos_penalty``. Both then learn through the one learn step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ppojax.rlhf.agents.env import Tokens
from ppojax.rlhf.agents.episodes import rollout_episodes
from ppojax.rlhf.agents.turns import Episodes, EpisodeSettings
from ppojax.rlhf.core.config import RLHFConfig
from ppojax.rlhf.core.sampling import KVCacheHook, PolicyApply, Sequences

RewardFn = Callable[[jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True, eq=False)
class OneTurnEnv:
    """A JAX text env of one turn (see the module); its state is the prompt drawn.
    ``reward_fn`` None: the turn's reward is 0, the trainer scoring the responses after."""

    prompts: Any
    prompt_mask: Any
    reward_fn: RewardFn | None
    reply_len: int = 0

    @property
    def prompt_len(self) -> int:
        return int(self.prompts.shape[1])

    def reset(self, key: jax.Array) -> tuple[Tokens, Tokens]:
        """A prompt drawn uniformly from the K prompts; the state is that prompt."""
        index = jax.random.randint(key, (), 0, self.prompts.shape[0])
        prompts = jnp.asarray(self.prompts, jnp.int32)
        prompt = Tokens(prompts[index], jnp.asarray(self.prompt_mask, bool)[index])
        return prompt, prompt

    def starts(self) -> tuple[Tokens, Tokens]:
        """Every prompt in order, as ``reset`` would give it: (states, prompts) [K, ...]."""
        prompts = Tokens(jnp.asarray(self.prompts, jnp.int32), jnp.asarray(self.prompt_mask, bool))
        return prompts, prompts

    def step(self, state: Tokens, response: Tokens) -> tuple[Tokens, Tokens, jax.Array, jax.Array]:
        """The reward of the response to the prompt ``state``; no reply; done."""
        reply = Tokens(jnp.zeros((0,), jnp.int32), jnp.zeros((0,), bool))
        if self.reward_fn is None:
            return state, reply, jnp.float32(0.0), jnp.bool_(True)
        reward = self.reward_fn(
            state.tokens[None], state.mask[None], response.tokens[None], response.mask[None]
        )
        return state, reply, jnp.asarray(reward, jnp.float32).reshape(()), jnp.bool_(True)


class ScoredEpisodes(NamedTuple):
    """One-turn episodes whose ``rewards`` [N, 1] are the scores, and what made them: each
    reward function's unweighted rewards [F, N] and which responses emitted EOS [N]."""

    episodes: Episodes
    rewards: jax.Array
    emitted_eos: jax.Array


def play_prompts(
    config: RLHFConfig,
    model: KVCacheHook | PolicyApply,
    reward_fns: tuple[RewardFn, ...],
    policy: Any,
    prompts: jax.Array,
    prompt_mask: jax.Array,
    key: jax.Array,
) -> ScoredEpisodes:
    """``config.group_size`` one-turn episodes a prompt [B, P] (the rows of a prompt
    adjacent, the prompt read once), played by ``model`` (a ``KVCacheHook`` or a
    ``policy_apply``) with the full ``policy`` params, then scored (``score``)."""
    settings = EpisodeSettings(
        1, config.response_len, config.temperature, config.pad_id, config.eos_id
    )
    env = OneTurnEnv(prompts, prompt_mask.astype(bool), None)
    episodes = rollout_episodes(
        model, policy, env, key, prompts.shape[0] * config.group_size, settings,
        config.group_size, starts=env.starts(),
    )  # fmt: skip
    prompt_len = prompts.shape[1]
    sequences = Sequences(
        episodes.tokens[:, :prompt_len],
        episodes.mask[:, :prompt_len],
        episodes.tokens[:, prompt_len:],
        episodes.model_mask[:, prompt_len:],
    )
    rewards, scores, emitted_eos = score(config, reward_fns, sequences)
    return ScoredEpisodes(episodes._replace(rewards=scores[:, None]), rewards, emitted_eos)


def score(
    config: RLHFConfig, reward_fns: tuple[RewardFn, ...], sequences: Sequences
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Unweighted rewards [F, N], the weighted score minus the missing-EOS penalty [N], and
    which responses emitted EOS [N]."""
    rewards = jnp.stack([reward_column(fn, sequences) for fn in reward_fns])
    weights = config.reward_weights or (1.0,) * len(reward_fns)
    emitted_eos = ((sequences.responses == config.eos_id) & sequences.response_mask).any(axis=1)
    penalty = jnp.where(emitted_eos, 0.0, config.missing_eos_penalty)
    return rewards, jnp.asarray(weights, jnp.float32) @ rewards - penalty, emitted_eos


def reward_column(fn: RewardFn, sequences: Sequences) -> jax.Array:
    """``fn``'s rewards [N] as float32, ``fn`` called with the four arrays of ``sequences``
    (the reward contract); a ``ValueError`` naming ``fn`` at trace time for any other shape
    (a scalar would be broadcast to every response)."""
    rewards = jnp.asarray(fn(*sequences), jnp.float32)
    rows = sequences.responses.shape[0]
    if rewards.shape != (rows,):
        name = getattr(fn, "__name__", repr(fn))
        raise ValueError(
            f"reward function {name} returned an array of shape {rewards.shape}; it must "
            f"return one reward per response, shape [B] = ({rows},)"
        )
    return rewards
