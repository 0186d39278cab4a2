"""One-turn text tasks: a set of prompts and a token reward, as episodes of one turn.

    env = OneTurnEnv(prompts [K, P], prompt_mask [K, P], reward_fn)

``reset`` draws one of the K left-padded prompts, uniformly with its key; ``step`` scores the
model's one turn with ``reward_fn(prompts, prompt_mask, responses, response_mask) -> [B]``
(the reward contract, called on a batch of one), replies nothing (``reply_len`` 0) and ends
the episode. ``make_episode_trainer`` plays it with ``max_turns=1``; ``make_trainer`` plays
the same episodes on the prompts it is given (``ppojax.rlhf.core.prompts``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from ppojax.rlhf.envs.env import Tokens

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
