"""``run_pipeline(config, key)``: SFT -> reward model -> PPO, and the table of PPO metrics."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

import jax
import numpy as np

from ppojax.rlhf.config import RLHFConfig
from ppojax.rlhf.ppo import RLHFState, init_rlhf_state, run_ppo
from ppojax.rlhf.reward import train_reward_model
from ppojax.rlhf.sft import train_sft

TABLE_COLUMNS = (
    "reward_score",
    "gold_score",
    "kl",
    "kl_coef",
    "entropy",
    "approx_kl",
    "clip_fraction",
    "explained_variance",
    "response_length",
)


class PipelineOutput(NamedTuple):
    """Results of the three stages; ``metrics`` holds ``PPO_METRICS`` [ppo_steps] each."""

    sft_params: dict
    sft_loss: jax.Array
    reward_params: dict
    reward_metrics: dict[str, jax.Array]
    state: RLHFState
    metrics: dict[str, jax.Array]


def run_pipeline(
    config: RLHFConfig, key: jax.Array, log: Callable[[str], None] | None = print
) -> PipelineOutput:
    """Train the SFT reference, the Bradley-Terry reward model on its samples, then PPO against
    the reward model with ``config.kl_coef`` as the initial beta. Each stage is one jitted
    call; ``log`` (None for silence) receives a progress line per stage and the metric table."""
    sft_key, reward_key, ppo_key = jax.random.split(key, 3)
    say = log or (lambda _: None)
    start = time.perf_counter()
    sft_params, sft_loss = jax.jit(train_sft)(config, sft_key)
    say(
        f"SFT: {config.sft_steps} steps, final loss {float(sft_loss[-1]):.3f} "
        f"({time.perf_counter() - start:.1f} s)"
    )
    start = time.perf_counter()
    reward_params, reward_metrics = jax.jit(train_reward_model)(config, sft_params, reward_key)
    say(
        f"reward model: {config.rm_steps} steps, held-out pair accuracy "
        f"{float(reward_metrics['held_out_accuracy']):.3f} ({time.perf_counter() - start:.1f} s)"
    )
    start = time.perf_counter()
    state = init_rlhf_state(config, sft_params, reward_params, config.kl_coef)
    state, metrics = jax.jit(run_ppo)(config, state, ppo_key)
    jax.block_until_ready(metrics)
    say(f"PPO: {config.ppo_steps} steps ({time.perf_counter() - start:.1f} s)")
    say(format_table(metrics))
    return PipelineOutput(sft_params, sft_loss, reward_params, reward_metrics, state, metrics)


def format_table(metrics: dict[str, jax.Array], rows: int = 10) -> str:
    """About ``rows`` evenly spaced PPO steps (first and last included) of ``TABLE_COLUMNS``."""
    num_steps = len(metrics["kl"])
    steps = sorted(set(np.linspace(0, num_steps - 1, min(rows, num_steps)).astype(int)))
    header = "step " + " ".join(f"{name:>{max(10, len(name))}}" for name in TABLE_COLUMNS)
    lines = [header]
    for step in steps:
        values = " ".join(
            f"{float(metrics[name][step]):{max(10, len(name))}.4f}" for name in TABLE_COLUMNS
        )
        lines.append(f"{step:4d} {values}")
    return "\n".join(lines)
