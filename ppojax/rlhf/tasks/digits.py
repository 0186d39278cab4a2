"""What the digit tasks share: the vocabulary, left-padded prompts of varying length, target
answers and the match score against them.

A prompt is ``BOS`` and k distinct digits (k uniform in [min_digits, max_digits]), left-padded
with PAD to ``1 + max_digits`` tokens. An answer is k digits then EOS. The score of a response
with n tokens before its first EOS (all of them without one) against the target digits is

    score = #{i < min(n, k) : response_i = target_i} / max(n, k),

1 only for the exact answer closed by EOS, lower for every wrong, missing or extra token.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import struct

from ppojax.checks import ConfigError, check_positive_int, static
from ppojax.rlhf.core.sampling import Sequences
from ppojax.rlhf.models.transformer import LanguageModel, transformer
from ppojax.rlhf.post.sft import train_sft

PAD = 0
BOS = 1
EOS = 2
FIRST_DIGIT = 3


def sample_prompts(
    key: jax.Array, batch_size: int, num_digits: int, min_digits: int, max_digits: int
) -> tuple[jax.Array, jax.Array]:
    """Prompts [B, 1 + max_digits] (PAD..., BOS, k distinct digits) and their mask."""
    length_key, digit_key = jax.random.split(key)
    lengths = jax.random.randint(length_key, (batch_size,), min_digits, max_digits + 1)
    keys = jax.random.split(digit_key, batch_size)
    digits = jax.vmap(lambda k: jax.random.permutation(k, num_digits)[:max_digits])(keys)
    width = 1 + max_digits
    index = jnp.arange(width)[None, :]
    first_digit = width - lengths[:, None]  # BOS sits just before it
    shifted = jnp.pad(digits + FIRST_DIGIT, ((0, 0), (1, 0)))  # digit j at column j + 1
    tokens = jnp.where(index >= first_digit, shifted, PAD)
    tokens = jnp.where(index == first_digit - 1, BOS, tokens)
    return tokens.astype(jnp.int32), index >= first_digit - 1


def prompt_digits(prompts: jax.Array, prompt_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The digits of each prompt right-aligned [B, max_digits] (PAD on the left) and k [B]."""
    is_digit = (prompts[:, 1:] >= FIRST_DIGIT) & prompt_mask[:, 1:]
    return jnp.where(is_digit, prompts[:, 1:], PAD), is_digit.sum(axis=1)


def answers(expected: jax.Array, counts: jax.Array, response_len: int) -> tuple[jax.Array, ...]:
    """Targets [B, response_len]: the k left-aligned expected digits, EOS, PAD; and their mask."""
    batch_size, width = expected.shape
    index = jnp.arange(response_len)[None, :]
    padded = jnp.pad(expected, ((0, 0), (0, response_len - width)))
    tokens = jnp.where(index < counts[:, None], padded, PAD)
    tokens = jnp.where(index == counts[:, None], EOS, tokens)
    return tokens.astype(jnp.int32), index <= counts[:, None]


def match_score(
    expected: jax.Array, counts: jax.Array, responses: jax.Array, response_mask: jax.Array
) -> jax.Array:
    """The score [B] in [0, 1] of responses [B, R] against left-aligned targets [B, K]."""
    emitted_eos = ((responses == EOS) & response_mask).any(axis=1)
    lengths = response_mask.sum(axis=1) - emitted_eos
    width = expected.shape[1]
    inside = jnp.arange(width)[None, :] < jnp.minimum(lengths, counts)[:, None]
    matches = ((responses[:, :width] == expected) & inside).sum(axis=1)
    return matches / jnp.maximum(jnp.maximum(lengths, counts), 1)


@struct.dataclass
class DigitTask:
    """Sizes of a digit task and of the built-in transformer that learns it, and its SFT
    stage. All static: each value fixes a shape or a step count."""

    num_digits: int = static(10)  # distinct digit tokens; vocabulary = PAD, BOS, EOS + digits
    min_digits: int = static(2)
    max_digits: int = static(5)
    response_len: int = static(7)  # >= max_digits + 1, so the answer and EOS fit
    d_model: int = static(32)
    num_heads: int = static(2)
    num_layers: int = static(2)
    sft_steps: int = static(100)
    sft_batch_size: int = static(64)
    sft_learning_rate: float = static(1e-3)

    def __post_init__(self) -> None:
        for name in ("num_digits", "min_digits", "max_digits", "response_len", "sft_steps"):
            check_positive_int("DigitTask", name, getattr(self, name))
        if not self.min_digits <= self.max_digits <= self.num_digits:
            raise ConfigError(
                "max_digits",
                f"DigitTask needs min_digits <= max_digits <= num_digits, got "
                f"{self.min_digits}, {self.max_digits}, {self.num_digits}.",
            )
        if self.response_len < self.max_digits + 1:
            raise ConfigError(
                "response_len",
                f"DigitTask.response_len={self.response_len} must be >= max_digits + 1 "
                f"({self.max_digits + 1}) so the longest answer and EOS fit.",
            )
        if self.d_model % self.num_heads:
            raise ConfigError(
                "num_heads", f"DigitTask.num_heads={self.num_heads} must divide d_model."
            )

    @property
    def vocab_size(self) -> int:
        return FIRST_DIGIT + self.num_digits

    @property
    def prompt_width(self) -> int:
        return 1 + self.max_digits

    def model(self) -> LanguageModel:
        """The built-in transformer sized for this task."""
        return transformer(
            self.vocab_size,
            self.prompt_width + self.response_len,
            self.d_model,
            self.num_heads,
            self.num_layers,
        )

    def prompts(self, key: jax.Array, batch_size: int) -> tuple[jax.Array, jax.Array]:
        """Left-padded prompts [B, prompt_width] and their mask."""
        return sample_prompts(key, batch_size, self.num_digits, self.min_digits, self.max_digits)


Expected = Callable[[jax.Array], jax.Array]  # right-aligned digits -> left-aligned answer

# A task is its rule ``expected``; each task module binds it to the three functions below
# (``functools.partial``): its ideal responses, its SFT start and its reward fn.


def targets(
    expected: Expected, task: DigitTask, prompts: jax.Array, prompt_mask: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The ideal responses [B, task.response_len] to prompts and their mask."""
    digits, counts = prompt_digits(prompts, prompt_mask)
    return answers(expected(digits), counts, task.response_len)


def scorer(expected: Expected, name: str) -> Callable[..., jax.Array]:
    """A ``reward_fn(prompts, prompt_mask, responses, response_mask) -> [B]``: the match
    score of each response against the task's answer; ``name`` names it in the metrics."""

    def score(prompts, prompt_mask, responses, response_mask):
        digits, counts = prompt_digits(prompts, prompt_mask)
        return match_score(expected(digits), counts, responses, response_mask)

    score.__name__ = name
    return score


def sft_start(expected: Expected, task: DigitTask, key: jax.Array) -> tuple[dict, jax.Array]:
    """Fresh transformer params trained ``task.sft_steps`` steps on ideal answers; the params
    and the loss curve [sft_steps]. Few steps leave the model imperfect, room for RL."""
    lm = task.model()
    init_key, data_key = jax.random.split(key)

    def data(step_key: jax.Array):
        prompts, prompt_mask = task.prompts(step_key, task.sft_batch_size)
        return Sequences(prompts, prompt_mask, *targets(expected, task, prompts, prompt_mask))

    return train_sft(
        lm.policy_apply,
        lm.init(init_key),
        data,
        data_key,
        steps=task.sft_steps,
        learning_rate=task.sft_learning_rate,
    )
