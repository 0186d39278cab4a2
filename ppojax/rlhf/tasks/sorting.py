"""The sorting task: answer k distinct digits with the same digits in ascending order, trained
against a learned reward model while a programmatic gold scorer only watches.

``gold`` is the match score against the sorted digits (``ppojax.rlhf.tasks.digits``). The
reward model starts from the SFT weights and learns a scalar (the value head at the last real
token) with the Bradley-Terry loss on pairs of SFT samples ranked by gold. It only knows the
SFT policy's distribution, as a learned reward model does in practice: far from it the proxy
can be wrong, and a policy without a KL leash exploits it.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import struct

from ppojax.checks import check_positive_int, static
from ppojax.ppo import losses
from ppojax.rlhf.model import zero_value_head
from ppojax.rlhf.preference import PairData, pair_scores
from ppojax.rlhf.reward import bradley_terry_loss
from ppojax.rlhf.sampling import sample_cached
from ppojax.rlhf.sft import make_adam
from ppojax.rlhf.tasks.digits import PAD, DigitTask, scorer, sft_start, targets

SORTING = DigitTask(
    num_digits=13, min_digits=4, max_digits=7, response_len=10, d_model=64, num_heads=4,
    sft_steps=60,
)  # fmt: skip


def sorted_digits(digits: jax.Array) -> jax.Array:
    """Right-aligned digits [B, K] (PAD on the left) -> sorted ascending, left-aligned."""
    big = jnp.iinfo(digits.dtype).max
    ordered = jnp.sort(jnp.where(digits == PAD, big, digits), axis=1)
    return jnp.where(ordered == big, PAD, ordered)


gold = scorer(sorted_digits, "gold")
sorting_targets = functools.partial(targets, sorted_digits)  # (task, prompts, prompt_mask)
sorting_sft = functools.partial(sft_start, sorted_digits)  # (task, key) -> params, losses


@struct.dataclass
class RewardModelConfig:
    """The reward model's stage: Adam steps, pairs per step, learning rate."""

    steps: int = static(300)
    batch_size: int = static(64)
    learning_rate: float = 3e-4
    max_grad_norm: float = 1.0

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size"):
            check_positive_int("RewardModelConfig", name, getattr(self, name))


class PreferencePairs(NamedTuple):
    """Pairs of SFT samples ordered by gold, ``data`` (prompts [N, P], chosen and rejected
    [N, R] and their masks), and which pairs count, ``mask`` [N] (0 where gold ties)."""

    data: PairData
    mask: jax.Array


def preference_pairs(
    task: DigitTask, sft_params: dict, batch_size: int, key: jax.Array
) -> PreferencePairs:
    """Two SFT samples (temperature 1) per prompt, ordered by gold; ties masked out."""
    lm = task.model()
    prompt_key, first_key, second_key = jax.random.split(key, 3)
    prompts, prompt_mask = task.prompts(prompt_key, batch_size)
    options = dict(response_len=task.response_len, temperature=1.0, pad_id=PAD, eos_id=2)
    first, second = (
        sample_cached(lm.kv_cache, sft_params, prompts, prompt_mask, k, **options)
        for k in (first_key, second_key)
    )
    first_gold = gold(prompts, prompt_mask, first.tokens, first.mask)
    second_gold = gold(prompts, prompt_mask, second.tokens, second.mask)
    wins = (first_gold > second_gold)[:, None]

    def pick(a: jax.Array, b: jax.Array) -> jax.Array:
        return jnp.where(wins, a, b)

    data = PairData(
        prompts,
        prompt_mask,
        pick(first.tokens, second.tokens),
        pick(first.mask, second.mask),
        pick(second.tokens, first.tokens),
        pick(second.mask, first.mask),
    )
    return PreferencePairs(data, first_gold != second_gold)


def pair_loss(task: DigitTask, params: dict, pairs: PreferencePairs):
    """Bradley-Terry loss on ``pairs`` and (as aux) the accuracy on the real pairs."""
    chosen, rejected = pair_scores(task.model().critic_apply, params, pairs.data)
    accuracy = losses.masked_mean((chosen > rejected).astype(jnp.float32), pairs.mask)
    return bradley_terry_loss(chosen, rejected, pairs.mask), accuracy


def train_reward_model(
    task: DigitTask, config: RewardModelConfig, sft_params: dict, key: jax.Array
) -> tuple[dict, dict[str, jax.Array]]:
    """``config.steps`` Adam steps of Bradley-Terry on fresh pairs, from the SFT weights (value
    head at 0); the params, loss and accuracy per step, and held-out pair accuracy."""
    optimizer = make_adam(config.learning_rate, config.max_grad_norm)
    params = zero_value_head(sft_params)

    def step(carry: tuple[dict, optax.OptState], step_key: jax.Array):
        params, opt_state = carry
        pairs = preference_pairs(task, sft_params, config.batch_size, step_key)
        (loss, accuracy), grads = jax.value_and_grad(pair_loss, argnums=1, has_aux=True)(
            task, params, pairs
        )
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), (loss, accuracy)

    train_key, eval_key = jax.random.split(key)
    keys = jax.random.split(train_key, config.steps)
    (params, _), (loss, accuracy) = jax.lax.scan(step, (params, optimizer.init(params)), keys)
    held_out = pair_loss(task, params, preference_pairs(task, sft_params, 1024, eval_key))[1]
    return params, {"loss": loss, "accuracy": accuracy, "held_out_accuracy": held_out}
