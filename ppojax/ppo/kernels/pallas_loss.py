"""PPO-Clip's loss and its gradient for an MLP actor-critic in one Pallas kernel (the kernels
candidate "pallas_ppo_loss").

On a GPU the update of a small network is launch- and memory-bound: XLA runs each layer's
products, activations, the loss terms and their backward passes as separate kernels, each
writing [rows, width] activations to memory and reading them back. This kernel takes a block
of rows through the actor and the critic, the loss and the backward pass without leaving the
chip, and writes only the block's partial gradient sums and loss sums; a sum over the blocks
outside gives the minibatch's. Loss and gradient come from the one pass.

What it computes is ``ppo.loss.ppo_loss``'s value and gradient for two MLP torsos, the
clipped objective and either a Categorical over discrete actions without a mask or a diagonal
Gaussian with a log-std parameter (tests/test_kernels.py checks both against
``jax.value_and_grad`` of it). ``jax.custom_vjp`` gives the loss the gradient the
kernel computed, so ``jax.value_and_grad`` of it works unchanged in the update.

Every dimension is padded to a power of two of at least 16, as Triton's matrix products want:
padded inputs and weights are zero, padded action logits are the lowest float32 (probability
exactly 0), a Gaussian's padded action columns are left out of its sums, and padded rows
weigh 0. Lowered for a TPU, the same kernel compiles with Mosaic in blocks of TPU_BLOCK_ROWS
rows; lowered for any other platform but a GPU's (CUDA or ROCm), it runs in Pallas's
interpreter as plain XLA ops, for tests.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ppojax.engine import losses
from ppojax.networks import flatten_observation
from ppojax.networks.fused import actor_critic_layers
from ppojax.ppo.config import PPOConfig
from ppojax.ppo.kernels.pallas_block import (
    ACTIVATIONS,
    METRICS,
    Coefficients,
    LossSettings,
    block,
)
from ppojax.ppo.types import Agent, Batch, Params
from ppojax.runtime import kernels

# Rows a program takes at a time, and blocks per program: its gradient sums stay in registers
# over BLOCKS_PER_PROGRAM blocks, and only one copy per program is written out and summed.
# 64 rows keep a [rows, 64] activation at 32 float32 registers a thread (4 warps); 32 blocks
# give a minibatch of 2^18 rows (8192 envs x 128 steps / 4) 128 programs, about one per SM.
# Neither is tuned yet on a GPU (benchmarks/gpu_parts.py measures other tiles); read when a
# program is traced, as is NUM_WARPS, the warps of a program.
BLOCK_ROWS = 64
BLOCKS_PER_PROGRAM = 32
NUM_WARPS = 4
# A TPU's (Mosaic's) rows a block: its 1-D loads of a block's rows must start at multiples of
# 128 (64 fails to compile, "cannot statically prove that index ... is a multiple of 128")
TPU_BLOCK_ROWS = 128


Layer = tuple[jax.Array, jax.Array]  # (kernel [in, out], bias [out])


class Network(NamedTuple):
    """The parameters the loss depends on, as arrays: the actor's and the critic's layers
    (torso layers, then the head; the critic's head has one output), and the Gaussian's
    log-std [A] (None for a Categorical). Their gradients come in the same structure."""

    actor: Sequence[Layer]
    critic: Sequence[Layer]
    log_std: jax.Array | None = None


def padded_size(n: int) -> int:
    """The least power of two >= max(n, 16)."""
    return max(16, 1 << (int(n) - 1).bit_length())


def pad_to(x: jax.Array, shape: Sequence[int]) -> jax.Array:
    return jnp.pad(x, [(0, size - dim) for dim, size in zip(x.shape, shape, strict=True)])


def pad_layers(layers: Sequence[Layer]) -> list[tuple[jax.Array, jax.Array]]:
    """Each (kernel, bias) zero-padded to power-of-two sizes, the bias as a row [1, out]."""
    padded = []
    for kernel, bias in layers:
        shape = (padded_size(kernel.shape[0]), padded_size(kernel.shape[1]))
        padded.append((pad_to(kernel, shape), pad_to(bias, shape[1:])[None, :]))
    return padded


def _kernel(s: LossSettings, depth: int, block_rows: int, blocks: int, *refs) -> None:
    """One program: ``blocks`` blocks of ``block_rows`` rows, their gradients and metric sums
    added up in registers and written once."""
    from jax.experimental import pallas as pl

    row_refs, coefficients_ref, refs = refs[:7], refs[7], refs[8:]
    count = 2 * (depth + 1)  # arrays per network: (kernel, bias) per layer and the head
    total = 2 * count + s.continuous  # and the Gaussian's log-std
    param_refs, grad_refs, metrics_ref = refs[:total], refs[total : 2 * total], refs[-1]
    params = [ref[...] for ref in param_refs]
    actor = [(params[2 * i], params[2 * i + 1]) for i in range(depth + 1)]
    critic = [(params[count + 2 * i], params[count + 2 * i + 1]) for i in range(depth + 1)]
    log_std = params[-1] if s.continuous else None
    numbers = coefficients_ref[...]
    slot = jax.lax.broadcasted_iota(jnp.int32, numbers.shape, 1)
    c = Coefficients(*(jnp.sum(jnp.where(slot == i, numbers, 0.0)) for i in range(4)))

    def add_block(index, totals):
        rows = pl.ds(index * block_rows, block_rows)
        loaded = tuple(ref[rows, :] if len(ref.shape) == 2 else ref[rows] for ref in row_refs)
        grads, sums = block(s, c, actor, critic, log_std, loaded)
        flat = [g for group in grads for g in group] + sums
        return [total + value for total, value in zip(totals, flat, strict=True)]

    zeros = [jnp.zeros(ref.shape, jnp.float32) for ref in grad_refs]
    zeros += [jnp.float32(0.0)] * len(METRICS)
    totals = jax.lax.fori_loop(0, blocks, add_block, zeros)
    for ref, total in zip(grad_refs, totals[: len(grad_refs)], strict=True):
        ref[...] = total
    metrics = jnp.zeros(metrics_ref.shape, jnp.float32)
    for index, total in enumerate(totals[len(grad_refs) :]):
        metrics = jnp.where(slot == index, total, metrics)
    metrics_ref[...] = metrics


def _padded_rows(settings: LossSettings, rows: tuple, padded: int) -> list[jax.Array]:
    """The kernel's row inputs, ``padded`` rows each: obs [padded, D'], action (int [padded],
    or floats [padded, A'] for a Gaussian), the four float columns, and each row's weight
    (1 / rows, 0 for padding)."""
    obs, action, *floats = rows
    weight = jnp.full((obs.shape[0],), 1.0 / obs.shape[0], jnp.float32)
    arrays = [pad_to(obs.astype(jnp.float32), (padded, padded_size(obs.shape[1])))]
    if settings.continuous:
        actions = padded_size(settings.action_dim)
        arrays.append(pad_to(action.astype(jnp.float32), (padded, actions)))
    else:
        arrays.append(pad_to(action.astype(jnp.int32), (padded,)))
    return arrays + [pad_to(x, (padded,)) for x in [*floats, weight]]


def loss_and_grads(
    settings: LossSettings,
    coefficients: Coefficients,
    network: Network,
    rows: tuple[jax.Array, ...],
    *,
    interpret: bool | None = None,
) -> tuple[jax.Array, dict[str, jax.Array], Network]:
    """The loss, its METRICS (means over the rows) and its gradient in ``network``, in the
    network's shapes. ``rows``: obs [N, D], action [N] (int; [N, A] floats for a Gaussian),
    old log-prob, normalized advantage, old value and target, each [N]. ``interpret``: None
    for the Triton kernel where the program is lowered for a GPU and Pallas's interpreter
    elsewhere (Mosaic's for a TPU); True or False (Triton) for one of them on every
    platform."""
    if settings.activation not in ACTIVATIONS:
        raise ValueError(f"activation {settings.activation!r}: the kernel has {ACTIVATIONS}")
    actor, critic, log_std = network
    params = [p for layer in (*pad_layers(actor), *pad_layers(critic)) for p in layer]
    if settings.continuous:
        actions = padded_size(settings.action_dim)
        params.append(pad_to(log_std.astype(jnp.float32), (actions,))[None, :])
    numbers = pad_to(jnp.stack([jnp.asarray(x, jnp.float32) for x in coefficients])[None], (1, 16))
    arrays = (*rows, numbers, *params)
    call = functools.partial(_programs, settings, len(actor) - 1, len(rows))
    if interpret is None:
        # The platform the program is lowered for decides, not the machine that traces it: a
        # program compiled ahead for a GPU on a CPU host gets the Triton kernel, for a TPU the
        # Mosaic one. All forms are traced; lowering keeps only the one for its platform.
        triton = functools.partial(call, "triton")  # one callable for both: traced once
        outputs = jax.lax.platform_dependent(
            *arrays,
            cuda=triton,
            rocm=triton,
            tpu=functools.partial(call, "mosaic"),
            default=functools.partial(call, "interpret"),
        )
    else:
        outputs = call("interpret" if interpret else "triton", *arrays)
    return _summed(settings, coefficients, network, outputs)


def _programs(
    settings: LossSettings, depth: int, row_count: int, form: str, *arrays: jax.Array
) -> list[jax.Array]:
    """The kernel's gradient and metric sums on ``arrays`` (the rows, the coefficients, the
    padded parameters), summed over its programs: one vector of them all (``_summed`` cuts
    it), the same shape whatever the ``form``: "triton", "mosaic" (a TPU's: blocks of
    TPU_BLOCK_ROWS rows, as its 1-D loads want multiples of 128) or Pallas's "interpret"er.
    All outputs are summed in one reduction of their rows side by side ([programs, all their
    numbers]), not one reduction per output: each number is the same sum of one value per
    program."""
    # imported here: Pallas adds ~30 ms to ``import ppojax``, for a path that is off by default
    from jax.experimental import pallas as pl

    rows, (numbers, *params) = arrays[:row_count], arrays[row_count:]
    n = rows[0].shape[0]
    wanted = TPU_BLOCK_ROWS if form == "mosaic" else BLOCK_ROWS
    block_rows = min(wanted, padded_size(n))
    blocks = max(1, min(BLOCKS_PER_PROGRAM, -(-n // block_rows)))
    chunk = block_rows * blocks
    programs = -(-n // chunk)
    row_arrays = _padded_rows(settings, rows, programs * chunk)

    row_specs = [
        pl.BlockSpec((chunk, x.shape[1]), lambda i: (i, 0))
        if x.ndim == 2
        else pl.BlockSpec((chunk,), lambda i: (i,))
        for x in row_arrays
    ]
    param_specs = [pl.BlockSpec(p.shape, lambda i: (0, 0)) for p in [numbers, *params]]
    grad_specs = [pl.BlockSpec((None, *p.shape), lambda i: (i, 0, 0)) for p in params]
    out_shape = [jax.ShapeDtypeStruct((programs, *p.shape), jnp.float32) for p in params]
    out_shape.append(jax.ShapeDtypeStruct((programs, 1, 16), jnp.float32))
    grad_specs.append(pl.BlockSpec((None, 1, 16), lambda i: (i, 0, 0)))
    if form == "mosaic":
        from jax.experimental.pallas import tpu as pallas_tpu

        compiler_params = pallas_tpu.CompilerParams()
    else:
        from jax.experimental.pallas import triton as pallas_triton

        # Triton, not Mosaic GPU: Mosaic stages whole blocks in shared memory, and a
        # program's rows (chunk x width floats) and the parameters do not fit there
        compiler_params = pallas_triton.CompilerParams(num_warps=NUM_WARPS, num_stages=1)
    outputs = pl.pallas_call(
        functools.partial(_kernel, settings, depth, block_rows, blocks),
        out_shape=out_shape,
        grid=(programs,),
        in_specs=row_specs + param_specs,
        out_specs=grad_specs,
        compiler_params=compiler_params,
        name="ppo_loss_and_grads",
        interpret=form == "interpret",
    )(*row_arrays, numbers, *params)
    side_by_side = jnp.concatenate([out.reshape(out.shape[0], -1) for out in outputs], axis=1)
    return side_by_side.sum(axis=0)


def _summed(
    settings: LossSettings, coefficients: Coefficients, network: Network, totals: jax.Array
) -> tuple[jax.Array, dict[str, jax.Array], Network]:
    """The programs' summed outputs (``_programs``) cut into the loss, its METRICS and the
    gradients, from the padded shapes to ``network``'s."""
    actor, critic, _ = network
    depth = len(actor) - 1
    shapes = [
        shape
        for kernel, bias in (*actor, *critic)
        for shape in (
            (padded_size(kernel.shape[0]), padded_size(kernel.shape[1])),
            (1, padded_size(bias.shape[0])),
        )
    ]
    if settings.continuous:
        shapes.append((1, padded_size(settings.action_dim)))
    shapes.append((1, 16))
    ends = np.cumsum([math.prod(shape) for shape in shapes])[:-1]
    sums = [
        part.reshape(shape) for part, shape in zip(jnp.split(totals, ends), shapes, strict=True)
    ]
    metric_sums = sums[-1][0]
    metrics = {name: metric_sums[i] for i, name in enumerate(METRICS)}
    loss = (  # losses.total_loss's sum (runtime/ sits below ppo/ and imports none of it)
        metrics["policy_loss"]
        + coefficients.vf_coef * metrics["value_loss"]
        - coefficients.ent_coef * metrics["entropy"]
    )
    layer_sums = sums[: 4 * (depth + 1)]
    grads = [
        (kernel_sum[: k.shape[0], : k.shape[1]], bias_sum[0, : b.shape[0]])
        for kernel_sum, bias_sum, (k, b) in zip(
            layer_sums[0::2], layer_sums[1::2], (*actor, *critic), strict=True
        )
    ]
    log_std_grad = sums[-2][0, : settings.action_dim] if settings.continuous else None
    return loss, metrics, Network(grads[: depth + 1], grads[depth + 1 :], log_std_grad)


def _no_cotangent(x: jax.Array) -> jax.Array | np.ndarray:
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.zeros_like(x)
    return np.zeros(x.shape, jax.dtypes.float0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def ppo_loss(
    settings: LossSettings, coefficients: Coefficients, network: Network, rows: tuple
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """``loss_and_grads``' loss and METRICS, differentiable in ``network``: its gradient is
    the one the kernel computed with the loss."""
    loss, metrics, _ = loss_and_grads(settings, coefficients, network, rows)
    return loss, metrics


def _ppo_loss_forward(settings, coefficients, network, rows):
    loss, metrics, grads = loss_and_grads(settings, coefficients, network, rows)
    return (loss, metrics), (grads, coefficients, rows)


def _ppo_loss_backward(settings, saved, cotangents):
    grads, coefficients, rows = saved
    loss_cotangent = cotangents[0]  # the metrics are reported, not differentiated
    return (
        jax.tree.map(_no_cotangent, coefficients),
        jax.tree.map(lambda grad: grad * loss_cotangent, grads),
        jax.tree.map(_no_cotangent, rows),
    )


ppo_loss.defvjp(_ppo_loss_forward, _ppo_loss_backward)


def applies(agent: Agent, config: PPOConfig) -> bool:
    """Whether the kernels candidate "pallas_ppo_loss" is chosen and ``fits`` the config."""
    return kernels.stand_in("pallas_ppo_loss") and fits(agent, config)


def fits(agent: Agent, config: PPOConfig) -> bool:
    """Whether the kernel computes this config's loss: PPO-Clip, one Categorical without a
    mask or a Gaussian with a log-std parameter, two float32 MLP torsos of tanh or relu."""
    spec = agent.env.spec
    return (
        config.policy_objective == "clip"
        and spec.action_nvec is None
        and not spec.masked
        and not (config.state_dependent_std and not spec.discrete)
        and config.encoder == "mlp"
        and config.recurrent is None
        and not config.shared_torso
        and config.compute_dtype == "float32"
        and config.activation in ACTIVATIONS
    )


def env_ppo_loss(
    agent: Agent, config: PPOConfig, params: Params, batch: Batch
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """``ppo.loss.ppo_loss`` where ``applies``: its value and gradient from the kernel."""
    spec = agent.env.spec
    settings = LossSettings(
        config.activation, spec.action_dim, config.vf_clip_eps is not None, not spec.discrete
    )
    coefficients = Coefficients(
        *(
            jnp.asarray(0.0 if value is None else value, jnp.float32)
            for value in (config.clip_eps, config.vf_clip_eps, config.vf_coef, config.ent_coef)
        )
    )
    advantage = batch.advantage
    if config.normalize_advantages:
        advantage = losses.normalize(advantage)
    obs = flatten_observation(batch.obs)
    rows = (obs, batch.action, batch.log_prob, advantage, batch.value, batch.target)
    actor, critic = actor_critic_layers(params["params"], len(config.hidden_sizes))
    log_std = None if spec.discrete else params["params"]["log_std"]
    network = Network(actor, critic, log_std)
    loss, metrics = ppo_loss(settings, coefficients, network, rows)
    return loss, {**metrics, "penalty_kl": jnp.float32(jnp.nan)}
