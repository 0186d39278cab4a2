"""The sorting task: answer k distinct digits with the same digits in ascending order, trained
against a learned reward model while a programmatic gold scorer only watches.

``gold`` is the match score against the sorted digits (``ppojax.rlhf.tasks.digits``). The
reward model starts from the SFT weights and learns a scalar (the value head at the last real
token) with the Bradley-Terry loss on every pair among K SFT samples of a prompt, ranked by
gold. It only knows the SFT policy's distribution, as a learned reward model does in
practice: far from it the proxy can be wrong, and a policy without a KL leash exploits it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
from flax import struct

from ppojax.checks import ConfigError, check_positive_int, static
from ppojax.engine.optim import clipped_adam
from ppojax.rlhf.core.sampling import SamplingSettings, sample_responses
from ppojax.rlhf.models.transformer import zero_value_head
from ppojax.rlhf.post.reward_model import RankedSamples, ranking_loss
from ppojax.rlhf.tasks.digits import EOS, PAD, DigitTask, scorer, sft_start, targets

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
    """The reward model's stage: Adam steps, prompts per step, SFT samples per prompt (every
    pair of them with different gold is a comparison), learning rate.

    The defaults are what the sorting demo needs for PPO to raise the gold score
    (``benchmarks/rlhf.py``): 300 steps of one pair per prompt at 3e-4 make a proxy that
    ranks 68% of held-out pairs right, against which PPO does not move gold. Four samples per
    prompt give six comparisons for four forward passes (InstructGPT ranks K responses per
    prompt for the same reason).
    """

    steps: int = static(600)
    batch_size: int = static(64)
    samples_per_prompt: int = static(4)
    learning_rate: float = 1e-3
    max_grad_norm: float = 1.0

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size"):
            check_positive_int("RewardModelConfig", name, getattr(self, name))
        if not isinstance(self.samples_per_prompt, int) or self.samples_per_prompt < 2:
            raise ConfigError(
                "samples_per_prompt",
                f"RewardModelConfig.samples_per_prompt must be an int >= 2 (a comparison needs "
                f"two responses), got {self.samples_per_prompt!r}.",
            )


def ranked_samples(
    task: DigitTask, sft_params: dict, batch_size: int, samples: int, key: jax.Array
) -> RankedSamples:
    """``samples`` SFT samples (temperature 1) for each of ``batch_size`` fresh prompts,
    ranked by their gold scores."""
    prompt_key, sample_key = jax.random.split(key)
    prompts, prompt_mask = task.prompts(prompt_key, batch_size)
    repeated, repeated_mask = (jnp.repeat(x, samples, axis=0) for x in (prompts, prompt_mask))
    settings = SamplingSettings(task.response_len, temperature=1.0, pad_id=PAD, eos_id=EOS)
    drawn = sample_responses(
        task.model().kv_cache, sft_params, repeated, repeated_mask, sample_key, settings
    )
    scores = gold(repeated, repeated_mask, drawn.tokens, drawn.mask)
    shape = (batch_size, samples, task.response_len)
    return RankedSamples(
        prompts,
        prompt_mask,
        drawn.tokens.reshape(shape),
        drawn.mask.reshape(shape),
        scores.reshape(batch_size, samples),
    )


def train_reward_model(
    task: DigitTask, config: RewardModelConfig, sft_params: dict, key: jax.Array
) -> tuple[dict, dict[str, jax.Array]]:
    """``config.steps`` Adam steps of Bradley-Terry on fresh ranked samples, from the SFT
    weights (value head at 0); the params, loss and accuracy per step, and the held-out
    accuracy on 1024 independent pairs (two samples per prompt)."""
    optimizer = clipped_adam(config.learning_rate, config.max_grad_norm)
    params = zero_value_head(sft_params)
    critic_apply = task.model().critic_apply

    def step(carry: tuple[dict, optax.OptState], step_key: jax.Array):
        params, opt_state = carry
        ranked = ranked_samples(
            task, sft_params, config.batch_size, config.samples_per_prompt, step_key
        )
        (loss, accuracy), grads = jax.value_and_grad(ranking_loss, argnums=1, has_aux=True)(
            critic_apply, params, ranked
        )
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), (loss, accuracy)

    train_key, eval_key = jax.random.split(key)
    keys = jax.random.split(train_key, config.steps)
    (params, _), (loss, accuracy) = jax.lax.scan(step, (params, optimizer.init(params)), keys)
    held_out_samples = ranked_samples(task, sft_params, 1024, 2, eval_key)
    held_out = ranking_loss(critic_apply, params, held_out_samples)[1]
    return params, {"loss": loss, "accuracy": accuracy, "held_out_accuracy": held_out}
