"""RLHF for any causal language model: PPO (token-level GAE), GRPO and RLOO as one jitted pure
step of (state, prompts, prompt_mask, key), built from the user's ``policy_apply``, optional
``critic_apply`` and reward functions by ``make_trainer``. Tasks live in
``ppojax.rlhf.tasks``; the library never imports them."""

from ppojax.rlhf.advantages import (
    group_advantages,
    kl_estimate,
    leave_one_out_advantages,
    token_advantages,
    token_rewards,
    update_kl_coef,
)
from ppojax.rlhf.config import RLHFConfig
from ppojax.rlhf.lora import tree_bytes
from ppojax.rlhf.model import LanguageModel, TransformerLM, transformer
from ppojax.rlhf.models import from_pretrained, generate, save_pretrained
from ppojax.rlhf.objective import RLHFBatch, aggregate
from ppojax.rlhf.reward import bradley_terry_loss, reward_model
from ppojax.rlhf.sampling import (
    KVCacheHook,
    Samples,
    response_mask,
    response_stats,
    sample_cached,
    sample_full,
)
from ppojax.rlhf.sft import sft_loss, train_sft
from ppojax.rlhf.trainer import RLHFState, Trainer, make_trainer, run_steps

__all__ = [
    "KVCacheHook",
    "LanguageModel",
    "RLHFBatch",
    "RLHFConfig",
    "RLHFState",
    "Samples",
    "Trainer",
    "TransformerLM",
    "aggregate",
    "bradley_terry_loss",
    "from_pretrained",
    "generate",
    "group_advantages",
    "kl_estimate",
    "leave_one_out_advantages",
    "make_trainer",
    "response_mask",
    "response_stats",
    "reward_model",
    "run_steps",
    "save_pretrained",
    "sample_cached",
    "sample_full",
    "sft_loss",
    "token_advantages",
    "token_rewards",
    "train_sft",
    "transformer",
    "tree_bytes",
    "update_kl_coef",
]
