"""RLHFConfig: every setting of the SFT -> reward model -> PPO pipeline, validated at construction.

Fields that fix shapes or the program are static (``pytree_node=False``); scalar
hyperparameters are pytree leaves, so ``jax.vmap`` can sweep them (for example ``kl_coef``)
in one compiled call.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from flax import struct

from ppojax.config import check_bool, check_choice, check_positive_int, check_range

KL_ESTIMATORS = ("k1", "k3")


def static(default: Any) -> Any:
    return struct.field(pytree_node=False, default=default)


@struct.dataclass
class RLHFConfig:
    """Hyperparameters of one RLHF run on the sorting task (see ``ppojax.rlhf.task``).

    Static: task and model sizes (num_digits, prompt_len, response_len, d_model, num_heads,
    num_layers), the critic layout (separate_critic), the program (kl_estimator, adaptive_kl)
    and the step counts and batch sizes of the three stages. Traced: temperature, learning
    rates, the PPO coefficients and the KL controller's coefficients.
    """

    num_digits: int = static(13)  # distinct digit tokens; vocabulary = PAD, BOS, EOS + digits
    prompt_len: int = static(8)  # BOS + prompt_len - 1 distinct digits
    response_len: int = static(10)  # sampled positions; the ideal answer needs prompt_len
    d_model: int = static(64)
    num_heads: int = static(4)
    num_layers: int = static(2)
    separate_critic: bool = static(False)  # False: value head on the policy trunk
    kl_estimator: str = static("k1")  # per-token KL in the reward: "k1" or "k3"
    adaptive_kl: bool = static(False)  # False: beta stays kl_coef

    sft_steps: int = static(60)
    sft_batch_size: int = static(64)
    rm_steps: int = static(300)
    rm_batch_size: int = static(64)
    ppo_steps: int = static(200)  # PPO iterations, each on batch_size fresh prompts
    batch_size: int = static(64)
    ppo_epochs: int = static(4)
    num_minibatches: int = static(4)

    temperature: float = 1.0
    sft_learning_rate: float = 1e-3
    rm_learning_rate: float = 3e-4
    learning_rate: float = 1e-4
    max_grad_norm: float = 1.0
    gamma: float = 1.0
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    vf_clip_eps: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    kl_coef: float = 0.05  # beta, or its start value under adaptive_kl
    target_kl: float = 2.0  # adaptive_kl: wanted sequence KL (nats)
    kl_horizon: float = 1000.0  # adaptive_kl: beta *= 1 + e * batch_size / kl_horizon
    missing_eos_penalty: float = 0.0  # subtracted from the score of responses without EOS

    def __post_init__(self) -> None:
        validate(self)

    @property
    def vocab_size(self) -> int:
        """PAD, BOS, EOS and the digits."""
        return 3 + self.num_digits

    @property
    def max_len(self) -> int:
        """Longest sequence the model sees: prompt plus response."""
        return self.prompt_len + self.response_len

    @property
    def minibatch_size(self) -> int:
        """Prompt-response pairs per gradient step: batch_size // num_minibatches."""
        return self.batch_size // self.num_minibatches


def _check_shapes(config: RLHFConfig) -> None:
    ints = ("num_digits", "prompt_len", "response_len", "d_model", "num_heads", "num_layers")
    counts = ("sft_steps", "sft_batch_size", "rm_steps", "rm_batch_size", "ppo_steps")
    for name in ints + counts + ("batch_size", "ppo_epochs", "num_minibatches"):
        check_positive_int("RLHFConfig", name, getattr(config, name))
    if config.prompt_len < 2 or config.prompt_len - 1 > config.num_digits:
        raise ValueError(
            f"RLHFConfig.prompt_len={config.prompt_len} must hold BOS plus 1..num_digits "
            f"({config.num_digits}) distinct digits."
        )
    if config.response_len < config.prompt_len:
        raise ValueError(
            f"RLHFConfig.response_len={config.response_len} must be >= prompt_len "
            f"({config.prompt_len}) so the sorted digits and EOS fit."
        )
    if config.d_model % config.num_heads:
        raise ValueError(
            f"RLHFConfig.num_heads={config.num_heads} must divide d_model={config.d_model}."
        )
    if config.batch_size % config.num_minibatches:
        raise ValueError(
            f"RLHFConfig.num_minibatches={config.num_minibatches} must divide "
            f"batch_size={config.batch_size}."
        )


def validate(config: RLHFConfig) -> None:
    """Raise ``ValueError`` naming the field and the fix for any invalid setting."""
    _check_shapes(config)
    for name in ("separate_critic", "adaptive_kl"):
        check_bool("RLHFConfig", name, getattr(config, name))
    check_choice("RLHFConfig", "kl_estimator", config.kl_estimator, KL_ESTIMATORS)
    positive = ("temperature", "sft_learning_rate", "rm_learning_rate", "learning_rate")
    for name in positive + ("max_grad_norm", "clip_eps", "vf_clip_eps", "target_kl"):
        check_range("RLHFConfig", name, getattr(config, name), 0.0, math.inf, open_low=True)
    check_range("RLHFConfig", "kl_horizon", config.kl_horizon, 0.0, math.inf, open_low=True)
    for name in ("gamma", "gae_lambda"):
        check_range("RLHFConfig", name, getattr(config, name), 0.0, 1.0, open_low=False)
    for name in ("vf_coef", "ent_coef", "kl_coef", "missing_eos_penalty"):
        check_range("RLHFConfig", name, getattr(config, name), 0.0, math.inf, open_low=False)


def config_names() -> tuple[str, ...]:
    """Every field name, for command-line parsing and error messages."""
    return tuple(f.name for f in dataclasses.fields(RLHFConfig))
