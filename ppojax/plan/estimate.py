"""The step-time estimate of a planned step and the FLOP count it rests on: the larger of
the FLOPs at the device's dense peak, the bytes its kernels move at HBM bandwidth and its
launches at a stated cost each, plus its collectives at the interconnect's bandwidth; the
response tokens per second per GPU from it, beside published figures of other libraries; and
sampling's cost per decoded token against the minimum it must move. An ESTIMATE, a bound no
kernel schedule beats, not a measurement."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax

from ppojax.plan.planner import RL_ALGORITHMS, StepShape
from ppojax.plan.targets import CHIPS
from ppojax.rlhf.models.config import DecoderConfig
from ppojax.rlhf.models.shapes import abstract_params


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Seconds per step, each device doing its share: ``compute`` = FLOPs / peak FLOP/s,
    ``memory`` = bytes the kernels move in HBM / its bandwidth, ``launches`` = launches x
    the chip's ``launch_seconds`` (``ppojax.plan.targets``; 0 on a TPU), ``collectives`` =
    bytes the collectives move / the links' bandwidth one way; ``step`` = the largest of the
    first three (they overlap) plus the collectives (counted as not overlapped);
    ``tokens_per_second``: response tokens per second per device at that step time."""

    flops: float
    compute: float
    memory: float
    step: float
    launches: float = 0.0
    collectives: float = 0.0
    tokens_per_second: float = 0.0


@dataclasses.dataclass(frozen=True)
class Decoding:
    """Sampling's decode loop per decoded token, per device: its ``launches`` and the
    ``bytes`` they move (``collective_bytes`` of them by collectives), and the ``minimum``
    bytes a token must move: the policy's weights in the compute dtype read once (all of them
    on every device where the sampling layout is "replicated" or "fsdp", which gathers them;
    a device's share under "tensor") and the device's share of the KV cache read once."""

    launches: float
    bytes: float
    minimum: float
    layers: int
    collective_bytes: float = 0.0

    @property
    def launches_per_layer(self) -> float:
        return self.launches / self.layers

    @property
    def over_minimum(self) -> float:
        return self.bytes / self.minimum


def decoding(
    config: DecoderConfig, step: StepShape, devices: int, loops: tuple[Any, ...]
) -> Decoding | None:
    """The decode loop of an RL step's program, told by its trips (one a response token: the
    sampling loop is the step's only top-level loop of that many), per token; None for sft,
    dpo, rm or a program without it."""
    if step.algorithm not in RL_ALGORITHMS:
        return None
    loop = next((loop for loop in loops if loop.trips == step.response_len), None)
    if loop is None:
        return None
    item = 2 if step.dtype == "bfloat16" else 4
    # every device reads all the weights for its rows (whole, or gathered under FSDP), or its
    # share of them split tensor-parallel; its share of the cache (its rows, or its heads)
    weights = parameter_count(config) * item
    if step.sample_layout == "tensor":
        weights /= devices
    kv = config.num_layers * 2 * config.num_kv_heads * config.head_dim * item
    cache = step.rows * (step.prompt_len + step.response_len) * kv / devices
    trips = loop.trips
    return Decoding(
        loop.launches / trips,
        loop.bytes / trips,
        weights + cache,
        config.num_layers,
        loop.collective_bytes / trips,
    )


def parameter_count(config: DecoderConfig) -> int:
    """The decoder's parameter count, from its abstract params."""
    return sum(
        math.prod(leaf.shape) for leaf in jax.tree.leaves(abstract_params(config, "float32"))
    )


def step_flops(config: DecoderConfig, step: StepShape) -> float:
    """Matmul FLOPs of one step over all devices, counted from the shapes as the program
    computes them: a forward pass costs 2 x its matmul weights per token plus attention's 4 x
    heads x head_dim per (token, key) on every layer; every pass attends over all
    prompt + response positions, decoding too (the KV cache holds them all); a backward pass
    costs 2 forwards (1 with LoRA: no gradients of the frozen weights). With ``logit_chunk``
    the scoring and the update compute the head at the response positions only, the update
    twice."""
    length = step.prompt_len + step.response_len
    rows = step.rows

    def forward(tokens: int, logits: bool = True) -> float:
        return rows * tokens * token_flops(config, length, logits)

    full = forward(length)
    if step.algorithm == "sft":
        return 3 * full
    if step.algorithm == "dpo":
        return 4 * full  # policy forward and backward, reference forward
    if step.algorithm == "rm":
        return 3 * forward(length, logits=False)
    sample = forward(step.prompt_len) + forward(step.response_len)
    backward = 1 if step.lora_rank else 2
    # remat_layers: each layer's forward runs once more in the backward pass
    again = 1 if step.remat_layers else 0
    score, update = full, (1 + again + backward) * full
    if step.logit_chunk:
        # the head at the response positions only, and once more in a backward pass (its
        # chunks' logits are recomputed there, ppojax.rlhf.core.logprobs)
        trunk = forward(length, logits=False)
        head = rows * step.response_len * 2.0 * config.vocab_size * config.hidden_size
        score, update = trunk + head, (1 + again + backward) * trunk + (2 + backward) * head
    total = sample + 2 * score + step.update_epochs * update
    if step.algorithm == "ppo":  # the critic's forward, then its forward and backward per epoch
        total += forward(length, logits=False) * (1 + 3 * step.update_epochs)
    return total


def token_flops(config: DecoderConfig, keys: int, logits: bool = True) -> float:
    """Forward FLOPs of one token attending over ``keys`` positions."""
    width, heads, kv_heads = config.hidden_size, config.num_heads, config.num_kv_heads
    q_width, kv_width = heads * config.head_dim, kv_heads * config.head_dim
    attention = width * q_width * 2 + width * kv_width * 2
    mlp = (2 if config.model_type == "gpt2" else 3) * width * config.intermediate_size
    weights = config.num_layers * (attention + mlp) + (config.vocab_size * width if logits else 0)
    return 2.0 * weights + 4.0 * config.num_layers * q_width * keys


def estimate(
    config: DecoderConfig,
    step: StepShape,
    target: str,
    devices: int,
    moved: int,
    launched: int = 0,
    collective: int = 0,
) -> Estimate | None:
    """The estimate of one step on ``target`` (None for "cpu": no peak is known): ``moved``
    bytes of which ``collective`` cross the interconnect, ``launched`` kernel launches, per
    device; the chip's figures from ``ppojax.plan.targets.CHIPS``."""
    chip = CHIPS.get(target)
    if chip is None:
        return None
    flops = step_flops(config, step) / devices
    peak = chip.bf16_flops if step.dtype == "bfloat16" else chip.f32_flops
    compute = flops / peak
    memory = (moved - collective) / hbm_bandwidth(target)
    launches = launched * chip.launch_seconds
    collectives = collective / chip.link_bandwidth if devices > 1 else 0.0
    seconds = max(compute, memory, launches) + collectives
    tokens = step.rows * step.response_len / devices / seconds if seconds else 0.0
    return Estimate(flops, compute, memory, seconds, launches, collectives, tokens)


def hbm_bandwidth(target: str) -> float:
    """Bytes/s of ``target``'s HBM: a TPU's published figure, a GPU's XLA target spec."""
    chip = CHIPS[target]
    if chip.hbm_bandwidth is not None:
        return chip.hbm_bandwidth
    from ppojax.runtime import deviceless

    return deviceless.spec_number(target, "memory_bandwidth")
