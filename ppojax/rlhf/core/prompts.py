"""Given prompts played as one-turn episodes and scored in a batch: ``make_trainer``'s step.

Each prompt starts a group of ``group_size`` episodes of a ``OneTurnEnv``
(``ppojax.rlhf.envs.one_turn``) on those prompts (``play_prompts``), and the responses are
scored after the turn in one batch by all the reward functions (``score``), as a reward model
scores best, with ``reward_weights`` and ``missing_eos_penalty``. ``make_episode_trainer``
plays a ``OneTurnEnv`` with ``max_turns=1``; both then learn through the one learn step.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ppojax.rlhf.core.config import RLHFConfig
from ppojax.rlhf.core.episodes import rollout_episodes
from ppojax.rlhf.core.sampling import KVCacheHook, PolicyApply, Sequences
from ppojax.rlhf.core.turns import Episodes, EpisodeSettings
from ppojax.rlhf.envs.one_turn import OneTurnEnv, RewardFn


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
