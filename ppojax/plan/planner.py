"""Sizing a post-training step before the GPUs are rented: the real step, compiled from shapes
alone for a target and its FSDP mesh, and what it needs per device.

    p = plan("qwen2.5-0.5b", StepShape("grpo", prompts=8, group_size=8), "h100", devices=1)
    print(p.report())        # bytes by part, launches, a time estimate, the verdict

The step is the one the commands train: for ppo, grpo and rloo ``make_trainer``'s step under
``shard_trainer`` (sampling through the decoder's KV cache, the policy's, reference's and
critic's forward passes, the epochs of updates); for sft, dpo and rm the optimizer step of
``make_sft_step``, ``make_dpo_step`` and ``make_reward_model_step`` on one batch, its state and
reference laid out by the same FSDP rules. Nothing is allocated: the init runs under
``jax.eval_shape`` and every input is a ``jax.ShapeDtypeStruct`` with its ``NamedSharding``.
For "h100" and "h200" the program is XLA's CUDA program, compiled without a GPU
(``ppojax.runtime.deviceless``, the ``gpu-aot`` extra); for "cpu" the CPU backend's own.

Left out: the reward (a token reward that costs nothing stands in for the commands' text
rewards and reward model), and the dataset arrays a command's job keeps on the device.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ppojax.engine import precision
from ppojax.engine.optim import clipped_adam
from ppojax.rlhf.core.config import RLHFConfig
from ppojax.rlhf.core.episode_trainer import make_trainer
from ppojax.rlhf.core.logprobs import computing
from ppojax.rlhf.core.sharding import (
    SAMPLE_LAYOUTS,
    batch_sharding,
    constrain,
    make_mesh,
    shard_trainer,
    state_shardings,
)
from ppojax.rlhf.models.config import DecoderConfig
from ppojax.rlhf.models.decoder import Decoder
from ppojax.rlhf.models.pretrained import PretrainedLM, contract, resolve_dtype
from ppojax.rlhf.models.shapes import abstract_params
from ppojax.rlhf.post.dpo import make_dpo_step
from ppojax.rlhf.post.pairs import PairData
from ppojax.rlhf.post.reward_model import make_reward_model_step
from ppojax.rlhf.post.sft import CompletionData, make_sft_step

RL_ALGORITHMS = ("ppo", "grpo", "rloo")
ALGORITHMS = (*RL_ALGORITHMS, "sft", "dpo", "rm")
DTYPES = ("float32", "bfloat16")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
PARTS = ("parameters", "reference", "critic", "optimizer")


class PlanError(ValueError):
    """A step, target or mesh the planner cannot build; the message names the flag."""


@dataclasses.dataclass(frozen=True)
class StepShape:
    """What one step does. ``prompts``: prompts per step (sft: rows, dpo and rm: pairs);
    ``group_size``: responses per prompt (ppo, grpo, rloo); ``prompt_len`` and
    ``response_len``: tokens (sft, dpo, rm: the completion's); ``lora_rank`` 0: full
    fine-tuning, else adapters on ``lora_targets``; ``dtype``: params and compute;
    ``update_epochs``, ``num_minibatches``, ``remat_layers`` and ``logit_chunk`` (ppo, grpo,
    rloo: response tokens whose LM-head logits are computed at once, 0 all): RLHFConfig's,
    which the commands default to; ``master_weights``: the commands' flag of that name."""

    algorithm: str = "grpo"
    prompts: int = 8
    group_size: int = 8
    prompt_len: int = 512
    response_len: int = 1024
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = LORA_TARGETS
    dtype: str = "bfloat16"
    update_epochs: int = 4
    num_minibatches: int = 4
    remat_layers: bool = False
    logit_chunk: int = RLHFConfig.logit_chunk
    master_weights: bool = True  # float32 params and moments (False: in ``dtype``)
    # how sampling lays out the policy (ppojax.rlhf.core.sharding.SAMPLE_LAYOUTS); "auto": the
    # plan compiles "replicated" and takes "tensor" where that does not fit (sizing.plan)
    sample_layout: str = "auto"

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise PlanError(f"--algorithm {self.algorithm!r} is not one of {', '.join(ALGORITHMS)}")
        if self.dtype not in DTYPES:
            raise PlanError(f"--dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        for name in ("prompts", "group_size", "prompt_len", "response_len", "update_epochs"):
            check_count(name, getattr(self, name))
        check_count("num_minibatches", self.num_minibatches)
        for name in ("lora_rank", "logit_chunk"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                flag = name.replace("_", "-")
                raise PlanError(f"--{flag} must be an int >= 0, got {value!r}")
        if self.lora_rank and self.algorithm not in RL_ALGORITHMS:
            raise PlanError(f"--lora-rank is for ppo, grpo and rloo, not {self.algorithm}")
        if self.remat_layers and self.algorithm not in RL_ALGORITHMS:
            raise PlanError(f"--remat-layers is for ppo, grpo and rloo, not {self.algorithm}")
        if self.sample_layout not in SAMPLE_LAYOUTS:
            raise PlanError(
                f"--sample-layout {self.sample_layout!r} is not one of {', '.join(SAMPLE_LAYOUTS)}"
            )
        if self.algorithm in ("grpo", "rloo") and self.group_size < 2:
            raise PlanError(f"--group-size must be >= 2 for {self.algorithm}, got 1")

    @property
    def rows(self) -> int:
        """Sequences per step: prompts x group size (RL), rows (sft), 2 per pair (dpo, rm)."""
        if self.algorithm in RL_ALGORITHMS:
            return self.prompts * self.group_size
        return self.prompts * (1 if self.algorithm == "sft" else 2)


def check_count(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PlanError(f"--{name.replace('_', '-')} must be an int >= 1, got {value!r}")


def prompt_unit(step: StepShape, devices: int) -> int:
    """The smallest number of prompts a step can take on ``devices``: its rows split evenly
    over the devices (prompts) and over the minibatches (prompts x group size)."""
    unit = devices
    if step.algorithm in RL_ALGORITHMS:
        per_prompt = step.num_minibatches // math.gcd(step.num_minibatches, step.group_size)
        unit = math.lcm(unit, per_prompt)
    return unit


def check_step(step: StepShape, config: DecoderConfig, devices: int) -> None:
    """PlanError naming the flags when the step cannot run on ``devices`` or in the model."""
    if step.prompts % devices:
        raise PlanError(
            f"--prompts {step.prompts} cannot be split over --devices {devices}: give a "
            f"multiple of {devices}"
        )
    rows = step.prompts * step.group_size
    if step.algorithm in RL_ALGORITHMS and rows % step.num_minibatches:
        raise PlanError(
            f"--num-minibatches {step.num_minibatches} must divide --prompts {step.prompts} x "
            f"--group-size {step.group_size} = {rows}"
        )
    width = step.prompt_len + step.response_len
    if width > config.max_positions:
        raise PlanError(
            f"--prompt-len {step.prompt_len} + --response-len {step.response_len} = {width} "
            f"tokens, more than the model's context ({config.max_positions})"
        )


class Program(NamedTuple):
    """A jitted step, its abstract arguments (with their shardings), and the trees each
    device holds by part (PARTS)."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    held: dict[str, Any]


def placed(tree: Any, shardings: Any) -> Any:
    """Each ``ShapeDtypeStruct`` of ``tree`` with its sharding from ``shardings``."""
    return jax.tree.map(
        lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
        tree,
        shardings,
    )


def on_state(tree: Any, mesh: Mesh) -> Any:
    return placed(tree, state_shardings(tree, mesh))


def rows_of(shape: tuple[int, ...], dtype: Any, mesh: Mesh) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sharding(mesh))


def replicated(value: Any, mesh: Mesh) -> jax.ShapeDtypeStruct:
    shape = jax.eval_shape(lambda: value)
    return jax.ShapeDtypeStruct(
        shape.shape, shape.dtype, sharding=NamedSharding(mesh, PartitionSpec())
    )


def abstract_lm(config: DecoderConfig, dtype: str) -> PretrainedLM:
    """The decoder's contract around its abstract params (no tokenizer, nothing allocated)."""
    module = Decoder(config, resolve_dtype(dtype))
    policy_apply, critic_apply, hook = contract(module)
    params = abstract_params(config, module.dtype)
    return PretrainedLM(module, params, policy_apply, critic_apply, hook, None, config)


def token_reward(prompts: Any, prompt_mask: Any, responses: Any, response_mask: Any) -> Any:
    """A reward of no cost (the response's length), standing in for the run's rewards."""
    return response_mask.sum(axis=1).astype(jnp.float32)


def rl_config(step: StepShape, config: DecoderConfig) -> RLHFConfig:
    eos = config.eos_ids[0] if config.eos_ids else 1
    lora = dict(lora_rank=step.lora_rank, lora_targets=step.lora_targets) if step.lora_rank else {}
    return RLHFConfig(
        pad_id=0 if eos != 0 else 1,
        eos_id=eos,
        response_len=step.response_len,
        algorithm=step.algorithm,
        group_size=step.group_size,
        update_epochs=step.update_epochs,
        num_minibatches=step.num_minibatches,
        remat_layers=step.remat_layers,
        logit_chunk=step.logit_chunk,
        master_weights=step.master_weights,
        **lora,
    )


def rl_program(lm: PretrainedLM, step: StepShape, mesh: Mesh) -> Program:
    """``shard_trainer(make_trainer(...))``'s step as ``ppojax rlhf --model`` builds it: PPO's
    critic a copy of the model with a value head."""
    config = rl_config(step, lm.config)
    critic = lm.critic_apply if config.needs_critic else None
    trainer = make_trainer(config, lm.policy_apply, token_reward, critic, kv_cache=lm.kv_cache)
    critic_params = jax.eval_shape(lm.init_value_head, lm.params) if critic else None
    key = jax.random.key(0)
    state = on_state(jax.eval_shape(trainer.init, lm.params, key, critic_params), mesh)
    shape = (step.prompts, step.prompt_len)
    args = (state, rows_of(shape, jnp.int32, mesh), rows_of(shape, bool, mesh))
    held = {
        "parameters": state.params["policy"],
        "reference": state.reference,
        "critic": state.params.get("critic", {}),
        "optimizer": state.opt_state,
    }
    layout = "replicated" if step.sample_layout == "auto" else step.sample_layout
    stepped = shard_trainer(trainer, mesh, sample_layout=layout).step
    return Program(stepped, (*args, replicated(key, mesh)), held)


def supervised_program(lm: PretrainedLM, step: StepShape, mesh: Mesh) -> Program:
    """The optimizer step ``ppojax sft | dpo | rm`` take on one batch (``ppojax.runs.lm.jobs``)."""
    adam = clipped_adam(1e-5, 1.0)
    rows, prompt, response = step.prompts, step.prompt_len, step.response_len
    prompts = (rows_of((rows, prompt), jnp.int32, mesh), rows_of((rows, prompt), bool, mesh))
    answer = (rows_of((rows, response), jnp.int32, mesh), rows_of((rows, response), bool, mesh))
    params, extra, held = lm.params, (), {}
    # float32 masters, the model's functions casting them to its dtype (as runs.lm.jobs does)
    policy, critic = (
        computing(lm.policy_apply, lm.module.dtype),
        computing(lm.critic_apply, lm.module.dtype),
    )
    if step.algorithm == "sft":
        update, batch = make_sft_step(policy, adam), CompletionData(*prompts, *answer)
    elif step.algorithm == "dpo":
        update, batch = make_dpo_step(policy, adam), PairData(*prompts, *answer, *answer)
        extra = (on_state(lm.params, mesh), replicated(jnp.float32(0.1), mesh))
        held["reference"] = extra[0]
    else:
        params = jax.eval_shape(lm.init_value_head, lm.params)
        update = make_reward_model_step(critic, adam)
        batch = PairData(*prompts, *answer, *answer)
    if step.master_weights:
        params = jax.eval_shape(precision.widened, params)
    params = on_state(params, mesh)
    opt_state = on_state(jax.eval_shape(adam.init, params), mesh)
    min_size = 1 << 14

    def run(params: Any, opt_state: Any, batch: Any, *extra: Any) -> Any:
        params, opt_state, metrics = update(params, opt_state, batch, *extra)
        return constrain(params, mesh, min_size), constrain(opt_state, mesh, min_size), metrics

    held.update(parameters=params, optimizer=opt_state)
    # donating, as the commands' loop does: the next params and moments over the given ones
    return Program(jax.jit(run, donate_argnums=(0, 1)), (params, opt_state, batch, *extra), held)


def program(config: DecoderConfig, step: StepShape, mesh: Mesh) -> Program:
    """The step of ``step.algorithm`` for ``config`` on ``mesh``, from shapes alone."""
    lm = abstract_lm(config, step.dtype)
    if step.algorithm in RL_ALGORITHMS:
        return rl_program(lm, step, mesh)
    return supervised_program(lm, step, mesh)


def target_mesh(target: str, devices: int) -> Mesh:
    """A (data=1, fsdp=devices) mesh over ``devices`` abstract GPUs of ``target`` ("h100",
    "h200"), over the first ``devices`` chips of the smallest TPU slice that holds them ("v5e",
    "v6e", "v5p"; ``ppojax.plan.targets.tpu_slice``) or over the process's CPU devices
    ("cpu")."""
    from ppojax.plan.targets import TPU_TARGETS
    from ppojax.runtime import deviceless

    if target == "cpu":
        found = jax.devices("cpu")
        if devices > len(found):
            raise PlanError(
                f"--devices {devices}: this process has {len(found)} CPU device(s); plan for "
                "cpu with at most that many (or start it with ppojax.use_cpu_devices)"
            )
        return make_mesh(fsdp=devices, devices=found[:devices])
    if target in TPU_TARGETS:
        from ppojax.runtime import deviceless_tpu

        chips = deviceless_tpu.slice_devices(*tpu_mesh(target, devices))
        return make_mesh(fsdp=devices, devices=chips)
    if target not in deviceless.TARGETS:
        known = ", ".join(("cpu", *sorted(deviceless.TARGETS), *TPU_TARGETS))
        raise PlanError(f"--target {target!r} is unknown; known targets: {known}")
    return make_mesh(fsdp=devices, devices=deviceless.target_devices(target, devices))


def tpu_mesh(target: str, devices: int) -> tuple[str, int]:
    """The TPU slice a ``devices``-chip plan of ``target`` compiles on, and its chip count;
    PlanError naming --devices past the largest slice or --target without libtpu (both
    before anything compiles)."""
    from ppojax.plan.targets import tpu_slice
    from ppojax.runtime import deviceless_tpu

    try:
        name = tpu_slice(target, devices)
    except ValueError as error:
        raise PlanError(str(error)) from None
    if not deviceless_tpu.libtpu_installed():
        raise PlanError(
            f"--target {target} compiles for a TPU with libtpu, which is not installed: "
            f"{deviceless_tpu.INSTALL_HINT}"
        )
    return name, devices


def compile_program(prog: Program, target: str, mesh: Mesh) -> Any:
    """``prog`` compiled for ``target``: the CPU backend's program, a TPU slice's (libtpu) or
    CUDA's, without the device."""
    from ppojax.plan.targets import TPU_TARGETS
    from ppojax.runtime import deviceless

    if target == "cpu":
        return prog.fn.lower(*prog.args).compile()
    if target in TPU_TARGETS:
        # traced with the CPU as the default backend: the plain forms, without the TPU's
        # defaults (kernels.TPU_DEFAULTS, counted for env PPO), as its committed plans were
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return prog.fn.lower(*prog.args).compile()
    return deviceless.compile_lowered(lambda: prog.fn.lower(*prog.args), mesh)
