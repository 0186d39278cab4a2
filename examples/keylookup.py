"""Key lookup: a multi-turn text env of your own, trained from the shell (docs/rlhf.md, "A
worked example: key lookup").

    ppojax rlhf --env-module examples/keylookup.py --env keylookup --turns 4 --turn-len 3 \\
        --sft-steps 100 --sft-demos 64 --steps 300 --learning-rate 1e-3 --group-size 8

Each episode hides a value in 0..max_value-1 under each of ``num_keys`` keys and asks for the
sum of two of them. The prompt is BOS and the two keys; the values are never shown. A turn is
three tokens:

    GET k EOS   the reply is k's value (a digit token)
    ANS d EOS   the answer: reward 1 if d is the sum, and the episode is over
    else        the reply is "?", reward 0

so the shortest win is GET, GET, ANS. The env says its vocabulary (``vocab_size``, ``pad_id``,
``eos_id``: the command sizes the model from them), its success (``success``: the episode
ended with a right answer), and its scripted solver (``demonstrate``), which ``--sft-steps``
plays for the SFT's demonstrations. ``reset`` and ``step`` are pure JAX: the rollout runs them
inside its compiled program.

``python examples/keylookup.py FILE.jsonl N`` writes N of the solver's episodes as the
JSONL file ``--sft-demos-file`` replays (seeds 0 to N-1).
"""

from __future__ import annotations

import json
import sys
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ppojax.rlhf.envs import Tokens, register_text_env

PAD, BOS, EOS, GET, ANS, QUERY = range(6)
FIRST_KEY = 6


class Hidden(NamedTuple):
    """An episode's state: every key's value [num_keys] and the two keys asked for [2]."""

    values: jax.Array
    asked: jax.Array


class KeyLookup:
    """The env of the module, with ``num_keys`` keys of values below ``max_value``."""

    pad_id = PAD
    eos_id = EOS
    prompt_len = 3  # BOS, the two keys
    reply_len = 1  # a value's digit, or "?"

    def __init__(self, num_keys: int = 4, max_value: int = 5) -> None:
        for name, value, least in (("num_keys", num_keys, 2), ("max_value", max_value, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"keylookup: {name} must be an int >= {least}, got {value!r}")
        self.num_keys, self.max_value = num_keys, max_value
        self.first_digit = FIRST_KEY + num_keys
        # digits up to the largest sum, 2 * (max_value - 1)
        self.vocab_size = self.first_digit + 2 * max_value - 1

    def reset(self, key: jax.Array) -> tuple[Hidden, Tokens]:
        values_key, keys_key = jax.random.split(key)
        values = jax.random.randint(values_key, (self.num_keys,), 0, self.max_value)
        asked = jax.random.choice(keys_key, self.num_keys, (2,), replace=False)
        prompt = jnp.concatenate([jnp.array([BOS]), FIRST_KEY + asked]).astype(jnp.int32)
        return Hidden(values, asked), Tokens(prompt, jnp.ones(3, bool))

    def step(self, state: Hidden, response: Tokens) -> tuple[Hidden, Tokens, jax.Array, jax.Array]:
        # a turn shorter than 3 tokens (--turn-len 2) is read as padded: never a command
        width = max(3 - response.tokens.shape[0], 0)
        tokens = jnp.pad(jnp.where(response.mask, response.tokens, PAD), (0, width))[:3]
        command, operand, end = tokens[0], tokens[1], tokens[2]
        key = operand - FIRST_KEY
        ends = end == EOS
        is_get = ends & (command == GET) & (key >= 0) & (key < self.num_keys)
        is_answer = ends & (command == ANS) & (operand >= self.first_digit)
        is_answer &= operand < self.vocab_size
        value = state.values[jnp.clip(key, 0, self.num_keys - 1)]
        reply = jnp.where(is_get, self.first_digit + value, QUERY).astype(jnp.int32)
        total = state.values[state.asked].sum()
        right = is_answer & (operand - self.first_digit == total)
        return state, Tokens(reply[None], jnp.ones(1, bool)), right.astype(jnp.float32), is_answer

    def success(self, rewards: list[float], terminated: bool) -> bool:
        """An episode the model ended with the right sum."""
        return terminated and rewards[-1] == 1.0

    def demonstrate(self, rng: np.random.Generator, prompt: list[int], history: list) -> list[int]:
        """The scripted solver: GET each asked key, then answer the sum of the replies."""
        del rng
        if len(history) < 2:
            return [GET, prompt[1 + len(history)], EOS]
        total = sum(reply[0] - self.first_digit for _, reply in history[:2])
        return [ANS, self.first_digit + total, EOS]


register_text_env("keylookup", KeyLookup)


def write_demos(path: str, count: int, env: KeyLookup | None = None) -> None:
    """``count`` of the solver's episodes (seeds 0 to count-1) as ``--sft-demos-file`` lines."""
    env = KeyLookup() if env is None else env
    reset, step = jax.jit(env.reset), jax.jit(env.step)
    with open(path, "w") as file:
        for seed in range(count):
            state, prompt = reset(jax.random.key(seed))
            prompt_ids = np.asarray(prompt.tokens).tolist()
            history: list = []
            for _ in range(3):
                turn = env.demonstrate(np.random.default_rng(seed), prompt_ids, history)
                state, reply, _, _ = step(state, Tokens(jnp.array(turn), jnp.ones(3, bool)))
                history.append((turn, np.asarray(reply.tokens).tolist()))
            line = {"seed": seed, "prompt": prompt_ids, "turns": [t for t, _ in history]}
            file.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    write_demos(sys.argv[1], int(sys.argv[2]))
