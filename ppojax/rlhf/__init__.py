"""RLHF for any causal language model: PPO (token-level GAE), GRPO and RLOO as one jitted pure
step of (state, prompts, prompt_mask, key), built from the user's ``policy_apply``, optional
``critic_apply`` and reward functions by ``make_trainer``; SFT, reward models and DPO beside it.

In tiers, each importing only those before it: ``envs`` (the text env API, the games, the
one-turn env, Python and chat envs on the host), ``core`` (the algorithm on token arrays and
the one LM trainer over turns: ``make_trainer`` is its one-turn form), ``models`` (the
built-in transformer, Hugging Face families), ``data`` and ``text_rewards`` (text as arrays,
rewards on text), ``post`` (SFT, reward models, DPO, SFT on demonstrations). ``tasks`` (the
digit demos) sits on top, and the run folders of the commands above in ``ppojax.runs.lm``; the
library never imports them, nor anything of ``ppojax.runs`` or ``ppojax.cli``. ``agents``, the
old home of envs, the trainer and the demonstrations, keeps its names a release, deprecated."""

from ppojax.deprecation import moved_alias, moved_attribute  # noqa: F401
from ppojax.moved import MOVED_NAMES
from ppojax.rlhf.core.advantages import (
    group_advantages,
    leave_one_out_advantages,
    token_advantages,
    token_rewards,
)
from ppojax.rlhf.core.aggregation import aggregate
from ppojax.rlhf.core.config import RLHFConfig
from ppojax.rlhf.core.episode_trainer import make_trainer
from ppojax.rlhf.core.kl import kl_estimate, update_kl_coef
from ppojax.rlhf.core.logprobs import SplitPolicy
from ppojax.rlhf.core.lora import tree_bytes
from ppojax.rlhf.core.sampling import (
    KVCacheHook,
    Samples,
    SamplingSettings,
    Sequences,
    response_mask,
    response_stats,
    sample_responses,
)
from ppojax.rlhf.core.trainer import RLHFState, Trainer, run_steps
from ppojax.rlhf.core.update import EpisodeBatch
from ppojax.rlhf.data import (
    PromptData,
    draw_batch,
    hf_split,
    load_prompts,
    read_jsonl,
    split_held_out,
)
from ppojax.rlhf.models import from_pretrained, generate, save_pretrained
from ppojax.rlhf.models.transformer import LanguageModel, TransformerLM, transformer
from ppojax.rlhf.post.dpo import dpo_loss, make_dpo_step, pair_log_probs
from ppojax.rlhf.post.pairs import PairData, load_pairs
from ppojax.rlhf.post.reward_model import (
    bradley_terry_loss,
    make_reward_model_step,
    pair_accuracy,
    reward_model,
)
from ppojax.rlhf.post.sft import (
    CompletionData,
    load_completions,
    make_sft_step,
    sft_loss,
    train_sft,
)
from ppojax.rlhf.text_rewards import (
    call_text_reward,
    exact_match,
    extract_answer,
    length_penalty,
    regex_reward,
    text_reward,
)

__all__ = [
    "CompletionData",
    "KVCacheHook",
    "LanguageModel",
    "PairData",
    "PromptData",
    "EpisodeBatch",
    "RLHFConfig",
    "RLHFState",
    "Samples",
    "SamplingSettings",
    "Sequences",
    "SplitPolicy",
    "Trainer",
    "TransformerLM",
    "aggregate",
    "bradley_terry_loss",
    "call_text_reward",
    "dpo_loss",
    "draw_batch",
    "exact_match",
    "extract_answer",
    "from_pretrained",
    "generate",
    "group_advantages",
    "hf_split",
    "kl_estimate",
    "leave_one_out_advantages",
    "length_penalty",
    "load_completions",
    "load_pairs",
    "load_prompts",
    "make_dpo_step",
    "make_reward_model_step",
    "make_sft_step",
    "make_trainer",
    "pair_accuracy",
    "pair_log_probs",
    "read_jsonl",
    "regex_reward",
    "response_mask",
    "response_stats",
    "reward_model",
    "run_steps",
    "sample_responses",
    "save_pretrained",
    "sft_loss",
    "split_held_out",
    "text_reward",
    "token_advantages",
    "token_rewards",
    "train_sft",
    "transformer",
    "tree_bytes",
    "update_kl_coef",
]


# Names moved out of ppojax.rlhf, with where they live now (ppojax.moved): deprecated aliases
# for a release. moved_alias stays importable from here, where it was first written.
MOVED = MOVED_NAMES[__name__]


def __getattr__(name: str):
    # the planner sits above the library (ppojax/plan imports ppojax.rlhf), so the alias
    # imports it when asked for, never at import time
    return moved_attribute(__name__, name)
