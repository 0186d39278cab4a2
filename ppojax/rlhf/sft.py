"""Supervised fine-tuning: the reference model, trained on sorted answers with cross-entropy.

The SFT stage runs a fixed, small number of steps, so the reference model is good but not
perfect: sampled at temperature 1 it still makes mistakes, which leaves RL room to improve.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from ppojax import losses
from ppojax.rlhf.config import RLHFConfig
from ppojax.rlhf.model import TransformerLM, build_model, init_model_params
from ppojax.rlhf.sampling import response_stats
from ppojax.rlhf.task import response_mask, sample_prompts, target_responses


def sft_loss(
    model: TransformerLM, params: dict, prompts: jax.Array, responses: jax.Array
) -> jax.Array:
    """Masked next-token cross-entropy: -mean over real response tokens of log pi(token)."""
    stats = response_stats(model, params, prompts, responses, 1.0)
    return -losses.masked_mean(stats.log_probs, response_mask(responses))


def make_adam(learning_rate: float | jax.Array, max_grad_norm: float | jax.Array):
    """Global-norm gradient clipping, then Adam."""
    return optax.chain(optax.clip_by_global_norm(max_grad_norm), optax.adam(learning_rate))


def train_sft(config: RLHFConfig, key: jax.Array) -> tuple[dict, jax.Array]:
    """``config.sft_steps`` Adam steps on fresh batches of (prompt, sorted answer); returns the
    reference parameters and the loss per step [sft_steps]."""
    model = build_model(config)
    init_key, data_key = jax.random.split(key)
    params = init_model_params(config, init_key)
    optimizer = make_adam(config.sft_learning_rate, config.max_grad_norm)

    def step(carry: tuple[dict, optax.OptState], step_key: jax.Array):
        params, opt_state = carry
        prompts = sample_prompts(
            step_key, config.sft_batch_size, config.prompt_len, config.num_digits
        )
        targets = target_responses(prompts, config.response_len)
        loss, grads = jax.value_and_grad(sft_loss, argnums=1)(model, params, prompts, targets)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    keys = jax.random.split(data_key, config.sft_steps)
    (params, _), loss_curve = jax.lax.scan(step, (params, optimizer.init(params)), keys)
    return params, loss_curve


def zero_value_head(params: dict) -> dict:
    """``params`` with the value head reset to 0, so a fresh critic starts at V = 0."""
    head = params["params"]["value_head"]
    zeroed = jax.tree.map(jnp.zeros_like, head)
    return {"params": {**params["params"], "value_head": zeroed}}
