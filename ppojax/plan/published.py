"""What other post-training libraries publish for the shapes ``ppojax plan`` sizes, each with
its source: response-token throughput per GPU (printed beside the plan's estimate) and the
TPU recipes a target's own libraries use (beside docs/rlhf.md's TPU table).

Only figures a source states; a library whose tables were not found for a shape has no row.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Throughput:
    """``tokens_per_second``: tokens per second per GPU of ``library``'s ``algorithm`` step on
    ``model`` over ``devices`` x ``target``, as ``source`` states it, in the ``setting`` it
    states (its tokens are the library's count, which need not be response tokens alone)."""

    library: str
    model: str
    algorithm: str
    target: str
    devices: int
    tokens_per_second: float
    setting: str
    source: str


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A published TPU recipe: what ``library`` trains, on which slice, and how."""

    library: str
    model: str
    slice: str
    what: str
    source: str


# NeMo RL v0.4's table (DGX-H100, BF16, Megatron-core; GRPO on OpenMathInstruct-2): tokens/s/GPU
# is its "total tokens processed" over the step's time and the GPUs
NEMO_RL = (
    "https://github.com/NVIDIA-NeMo/RL/blob/c31fb937afaf7239b3781a0f1b9debef12dfa01f/"
    "docs/about/performance-summary.md"
)


def nemo_llama(tokens: float, generated: str, how: str) -> Throughput:
    """A row of NeMo RL's Llama-3.1-8B GRPO on 16 H100s: 2,048 responses a step."""
    setting = f"2,048 responses a step, sequences up to 4,096 (generated {generated} on average)"
    return Throughput(
        "NeMo RL", "llama-3.1-8b", "grpo", "h100", 16, tokens, f"{setting}, {how}", NEMO_RL
    )


THROUGHPUT = (
    nemo_llama(1562, "1,060", "on-policy, 97.7 s a step"),
    nemo_llama(2161, "1,129", "1-step off-policy, 74.6 s a step"),
)

TUNIX_DEMO = (
    "https://github.com/google/tunix/blob/300e84acb6b2c954f946df674620be0daf19333d/"
    "examples/grpo_gemma.ipynb"
)
RECIPES = (
    Recipe(
        "Tunix",
        "gemma-3-1b-it",
        "v6e-1; 8 chips as fsdp 1 x tp 4",
        "GRPO, LoRA r64, 2 responses a prompt, 256 + 768 tokens, micro-batch 1",
        TUNIX_DEMO,
    ),
    Recipe(
        "Tunix (Kaggle hackathon)",
        "gemma-2-2b, gemma-3-1b",
        "v5e-8",
        "the whole post-training (SFT, GRPO) in one v5e-8 for 9 hours",
        'Google Developers Blog, \'How the community trained Gemma to "Think" with Tunix and '
        "TPUs' (2026-05-28); https://www.kaggle.com/competitions/google-tunix-hackathon",
    ),
)


def throughput_for(model: str, algorithm: str, target: str) -> list[Throughput]:
    """The published figures of ``model``'s ``algorithm`` step on ``target`` GPUs, any count."""
    return [
        t
        for t in THROUGHPUT
        if (t.model, t.algorithm, t.target) == (model.lower(), algorithm, target)
    ]
