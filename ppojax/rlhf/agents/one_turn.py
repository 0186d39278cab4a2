"""A one-turn text env from a set of prompts and a token reward: the RLHF step as episodes.

    env = OneTurnEnv(prompts [K, P], prompt_mask [K, P], reward_fn)

``reset`` draws one of the K left-padded prompts, uniformly with its key; ``step`` scores the
model's one turn with ``reward_fn(prompts, prompt_mask, responses, response_mask) -> [B]``
(``make_trainer``'s reward contract, called on a batch of one), replies nothing
(``reply_len`` 0) and ends the episode. Played with ``max_turns=1`` by
``make_episode_trainer``, a step is ``make_trainer``'s step on the prompts the env drew, bit
for bit (docs/rlhf.md, tests/test_agents_trainer.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from ppojax.rlhf.agents.env import Tokens


@dataclasses.dataclass(frozen=True, eq=False)
class OneTurnEnv:
    """A JAX text env of one turn (see the module); its state is the prompt drawn."""

    prompts: Any
    prompt_mask: Any
    reward_fn: Callable[[jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]
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

    def step(self, state: Tokens, response: Tokens) -> tuple[Tokens, Tokens, jax.Array, jax.Array]:
        """The reward of the response to the prompt ``state``; no reply; done."""
        reward = self.reward_fn(
            state.tokens[None], state.mask[None], response.tokens[None], response.mask[None]
        )
        reply = Tokens(jnp.zeros((0,), jnp.int32), jnp.zeros((0,), bool))
        return state, reply, jnp.asarray(reward, jnp.float32).reshape(()), jnp.bool_(True)
