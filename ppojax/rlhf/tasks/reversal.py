"""The reversal task, a verifiable reward: answer k digits with the same digits reversed.

No reward model: ``checker`` compares the response with the reversed prompt (the match score
of ``ppojax.rlhf.tasks.digits``), so the reward the policy trains on is the gold score.
"""

from __future__ import annotations

import jax

from ppojax.rlhf.tasks.digits import DigitTask, scorer, sft_start, targets


def reversed_digits(digits: jax.Array) -> jax.Array:
    """Right-aligned digits [B, K] -> the same digits reversed, left-aligned."""
    return digits[:, ::-1]


checker = scorer(reversed_digits)
checker.__name__ = "checker"


def reversal_targets(task: DigitTask, prompts: jax.Array, prompt_mask: jax.Array):
    """The ideal responses [B, response_len] and their mask."""
    return targets(reversed_digits, prompts, prompt_mask, task.response_len)


def reversal_sft(task: DigitTask, key: jax.Array) -> tuple[dict, jax.Array]:
    """The SFT start: transformer params after ``task.sft_steps`` steps, and the loss curve."""
    return sft_start(task, reversed_digits, key)
