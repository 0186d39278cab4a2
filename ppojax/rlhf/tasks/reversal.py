"""The reversal task, a verifiable reward: answer k digits with the same digits reversed.

No reward model: ``checker`` compares the response with the reversed prompt (the match score
of ``ppojax.rlhf.tasks.digits``), so the reward the policy trains on is the gold score.
"""

from __future__ import annotations

import functools

import jax

from ppojax.rlhf.tasks.digits import scorer, sft_start, targets


def reversed_digits(digits: jax.Array) -> jax.Array:
    """Right-aligned digits [B, K] -> the same digits reversed, left-aligned."""
    return digits[:, ::-1]


checker = scorer(reversed_digits, "checker")
reversal_targets = functools.partial(targets, reversed_digits)  # (task, prompts, prompt_mask)
reversal_sft = functools.partial(sft_start, reversed_digits)  # (task, key) -> params, losses
