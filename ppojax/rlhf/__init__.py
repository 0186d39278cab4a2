"""PPO for language models (RLHF) on a synthetic sorting task: a small causal transformer,
KV-cache sampling, SFT, a Bradley-Terry reward model, and the PPO-RLHF step as one jitted pure
function of (state, prompts, key)."""

from ppojax.rlhf.config import RLHFConfig
from ppojax.rlhf.model import KVCache, TransformerLM, build_model, init_model_params
from ppojax.rlhf.pipeline import PipelineOutput, format_table, run_pipeline
from ppojax.rlhf.ppo import (
    PPO_METRICS,
    PPOBatch,
    RLHFState,
    collect_batch,
    init_rlhf_state,
    kl_estimate,
    ppo_loss,
    ppo_step,
    run_ppo,
    token_advantages,
    token_rewards,
    update_kl_coef,
)
from ppojax.rlhf.reward import bradley_terry_loss, reward_scores, train_reward_model
from ppojax.rlhf.sampling import Samples, response_stats, sample_responses
from ppojax.rlhf.sft import sft_loss, train_sft
from ppojax.rlhf.task import gold_score, sample_prompts, target_responses

__all__ = [
    "PPO_METRICS",
    "KVCache",
    "PPOBatch",
    "PipelineOutput",
    "RLHFConfig",
    "RLHFState",
    "Samples",
    "TransformerLM",
    "bradley_terry_loss",
    "build_model",
    "collect_batch",
    "format_table",
    "gold_score",
    "init_model_params",
    "init_rlhf_state",
    "kl_estimate",
    "ppo_loss",
    "ppo_step",
    "reward_scores",
    "response_stats",
    "run_pipeline",
    "run_ppo",
    "sample_prompts",
    "sample_responses",
    "sft_loss",
    "target_responses",
    "token_advantages",
    "token_rewards",
    "train_reward_model",
    "train_sft",
    "update_kl_coef",
]
