"""A number-guessing game that takes several turns: a JAX text environment (id "guessing").

The env draws a secret uniformly in [0, num_values). The prompt is one BOS token. Each turn
the model writes a guess in decimal digits and ends its turn with EOS; the env replies with
one token:

    HIGHER   the secret is above the guess      reward 0
    LOWER    the secret is below the guess      reward 0
    CORRECT  the guess is the secret            reward 1, the episode is over
    INVALID  not 1 to num_digits digits, or a number >= num_values (the turn still counts)

The episode is also over after ``max_turns`` turns. The digits read are the response's real
tokens before its first EOS (all of them when the turn hit its token limit without one);
leading zeros are allowed ("07" is 7). Binary search needs ceil(log2(num_values + 1)) turns
at most, so ``max_turns`` at that number makes the game winnable every time.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from ppojax.rlhf.envs.env import Tokens

PAD = 0
BOS = 1
EOS = 2  # the model's end-of-turn token
HIGHER = 3
LOWER = 4
CORRECT = 5
INVALID = 6
FIRST_DIGIT = 7  # digit d is token FIRST_DIGIT + d
VOCAB_SIZE = FIRST_DIGIT + 10


class GuessingState(NamedTuple):
    """The secret [] and the turns played so far [], both int32."""

    secret: jax.Array
    turn: jax.Array


@dataclasses.dataclass(frozen=True)
class NumberGuessing:
    """The game for secrets in [0, num_values), over after ``max_turns`` turns."""

    num_values: int = 100
    max_turns: int = 8
    prompt_len: int = 1
    reply_len: int = 1
    # The vocabulary a model for this env needs (not fields: the game fixes them).
    vocab_size = VOCAB_SIZE
    pad_id = PAD
    eos_id = EOS
    # A success is a right guess: the return a correct guess brings.
    success_return = 1.0

    def __post_init__(self) -> None:
        for name in ("num_values", "max_turns"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"NumberGuessing.{name} must be an int >= 1, got {value!r}")

    @property
    def num_digits(self) -> int:
        """The most digits a valid guess has: those of num_values - 1."""
        return len(str(self.num_values - 1))

    def reset(self, key: jax.Array) -> tuple[GuessingState, Tokens]:
        """A fresh secret; the prompt [BOS]."""
        secret = jax.random.randint(key, (), 0, self.num_values, jnp.int32)
        prompt = Tokens(jnp.full((1,), BOS, jnp.int32), jnp.ones((1,), bool))
        return GuessingState(secret, jnp.int32(0)), prompt

    def step(
        self, state: GuessingState, response: Tokens
    ) -> tuple[GuessingState, Tokens, jax.Array, jax.Array]:
        """The reply to one guess (see the module), its reward and whether the game is over."""
        guess, valid = read_guess(response, self.num_digits)
        valid = valid & (guess < self.num_values)
        answer = jnp.where(
            guess == state.secret, CORRECT, jnp.where(state.secret > guess, HIGHER, LOWER)
        )
        answer = jnp.where(valid, answer, INVALID)
        correct = answer == CORRECT
        turn = state.turn + 1
        done = correct | (turn >= self.max_turns)
        reply = Tokens(jnp.full((1,), answer, jnp.int32), jnp.ones((1,), bool))
        return GuessingState(state.secret, turn), reply, correct.astype(jnp.float32), done


def read_guess(response: Tokens, num_digits: int) -> tuple[jax.Array, jax.Array]:
    """The number [] a response [R] spells in digit tokens before its first EOS, and whether
    it is one: 1 to ``num_digits`` digits and nothing else."""
    tokens, mask = response
    before_eos = jnp.cumsum(tokens == EOS) == 0
    content = mask & before_eos
    count = content.sum()
    digit = tokens - FIRST_DIGIT
    is_digit = (digit >= 0) & (digit < 10)
    valid = (count >= 1) & (count <= num_digits) & (is_digit | ~content).all()
    # The real tokens form a prefix of the response, so digit i has weight 10^(count - 1 - i).
    exponent = jnp.clip(count - 1 - jnp.arange(tokens.shape[0]), 0, num_digits)
    value = jnp.where(content & is_digit, digit * 10**exponent, 0).sum()
    return value.astype(jnp.int32), valid


def number_guessing(num_values: int = 100, max_turns: int = 8) -> NumberGuessing:
    """The "guessing" id's factory."""
    return NumberGuessing(num_values, max_turns)


def guess_tokens(number: int, width: int) -> Tokens:
    """The response [width] that guesses ``number``: its digits, EOS, then PAD (a host helper
    for demonstrations and tests)."""
    digits = [FIRST_DIGIT + int(d) for d in str(number)] + [EOS]
    if len(digits) > width:
        raise ValueError(f"guess {number} needs {len(digits)} tokens, more than {width}")
    pad = width - len(digits)
    return Tokens(
        jnp.asarray(digits + [PAD] * pad, jnp.int32),
        jnp.asarray([True] * len(digits) + [False] * pad),
    )
