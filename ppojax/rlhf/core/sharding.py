"""The RLHF trainer's whole state over a ``jax.sharding.Mesh``, FSDP-style.

The mesh has two named axes, ``"data"`` (DATA) and ``"fsdp"`` (FSDP):

- every parameter-shaped leaf of the state (the policy or its LoRA adapters, the frozen
  reference, a critic, Adam's two moments) with at least ``min_size`` elements is split over
  "fsdp" along its largest axis that the fsdp size divides (the first such axis on a tie) and
  replicated over "data"; smaller leaves (norm scales, biases, a value head, Adam's count,
  beta, the step) are replicated on every device. A large leaf none of whose axes the fsdp
  size divides is an error naming it, its shape and the axis;
- a batch (prompts and their mask) is split along its rows over both axes, ("data", "fsdp"),
  and XLA's partitioner carries that layout to the rows the step derives from them: each
  device works on its own rows while XLA gathers each parameter where a layer uses it
  (ZeRO-3). "data" across hosts and "fsdp" within a host keeps the gathers on fast links.

    mesh = make_mesh(fsdp=4)                      # 1 x 4 over jax.devices()
    lm = from_pretrained(folder, mesh=mesh)       # each device receives only its shards
    trainer = shard_trainer(make_trainer(config, lm.policy_apply, rewards,
                                         kv_cache=lm.kv_cache), mesh)
    state = trainer.init(lm.params, key)          # reference and Adam created sharded
    state, metrics = trainer.step(state, prompts, prompt_mask, key)

The sharded step computes the single-device step's numbers up to float32 reduction order.

Sampling has a layout of its own (``SAMPLE_LAYOUTS``, chosen by ``shard_trainer``'s or
``rows_on``'s ``sample_layout``): once a step the policy's compute-dtype copy is resharded for
decoding (``for_sampling``), never per token. "replicated": whole on every device, each device
decoding its own rows with no collective per token; "tensor": split over "fsdp" by heads and
MLP columns (Megatron-style: q, k, v, gate and up by columns, o and down by rows, the
embedding by vocabulary), the rows over "data" only, an all-reduce of activations a layer;
"fsdp": the training layout, every decoded token gathering the weights again; "auto":
"replicated" where the copy takes at most ``AUTO_REPLICATED_SHARE`` of a device's memory,
else "tensor" (``ppojax plan`` checks the choice by compiling both).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA = "data"
FSDP = "fsdp"
# Leaves below 16Ki elements (64 KiB in float32: norms, biases, LoRA's A at rank 16 and width
# 896) cost more in gathers than they save in memory, so every device keeps them whole.
MIN_SHARD_SIZE = 1 << 14
SAMPLE_LAYOUTS = ("auto", "replicated", "tensor", "fsdp")
# "auto" replicates the sampling copy when it takes at most this share of one device's memory:
# the rest holds the sharded state (float32 masters and Adam: 12 bytes a parameter over the
# devices), the rows' KV cache and, after sampling, the update's activations
AUTO_REPLICATED_SHARE = 0.25
# Tensor-parallel sampling (Megatron's split): the projections into heads and MLP columns
# split by their output columns, the projections back by their input rows, so a layer needs
# one all-reduce of its activations; the embedding and LM head split by vocabulary.
COLUMN_SPLIT = frozenset({"q_proj", "k_proj", "v_proj", "c_attn", "gate_proj", "up_proj", "c_fc"})
ROW_SPLIT = frozenset({"o_proj", "down_proj", "c_proj"})
VOCAB_SPLIT = frozenset({"embed", "wte", "lm_head"})


def make_mesh(fsdp: int | None = None, data: int = 1, devices: list[Any] | None = None) -> Mesh:
    """A (data, fsdp) mesh over ``devices`` (default: all); ``fsdp`` None takes the devices
    that ``data`` leaves. ValueError when data x fsdp is not the number of devices."""
    devices = jax.devices() if devices is None else list(devices)
    fsdp = len(devices) // data if fsdp is None else fsdp
    if data < 1 or fsdp < 1 or data * fsdp != len(devices):
        raise ValueError(
            f"make_mesh(fsdp={fsdp}, data={data}) needs data x fsdp = {len(devices)} devices; "
            "choose sizes whose product is the device count."
        )
    return Mesh(np.asarray(devices).reshape(data, fsdp), (DATA, FSDP))


def check_mesh(mesh: Mesh) -> None:
    """ValueError unless ``mesh`` has the axes "data" and "fsdp" (``make_mesh`` builds one)."""
    if set(mesh.axis_names) != {DATA, FSDP}:
        raise ValueError(
            f"the mesh has axes {mesh.axis_names}; ppojax.rlhf's sharding needs exactly "
            f"({DATA!r}, {FSDP!r}): build it with ppojax.rlhf.core.sharding.make_mesh."
        )


def leaf_spec(name: str, shape: tuple[int, ...], fsdp_size: int, min_size: int) -> PartitionSpec:
    """The leaf ``name`` of ``shape`` split over "fsdp" along its largest axis that
    ``fsdp_size`` divides; replicated when smaller than ``min_size`` elements or fsdp_size is
    1. ValueError naming the leaf when it is large and no axis divides."""
    if fsdp_size == 1 or math.prod(shape) < min_size:
        return PartitionSpec()
    divisible = [axis for axis, size in enumerate(shape) if size % fsdp_size == 0]
    if not divisible:
        raise ValueError(
            f"tensor {name} of shape {shape} cannot be split over the mesh axis {FSDP!r} of "
            f"size {fsdp_size}: none of its axes is a multiple of {fsdp_size}. Choose an fsdp "
            "size that divides one of them, or a larger min_size to keep it replicated."
        )
    axis = max(divisible, key=lambda index: (shape[index], -index))
    return PartitionSpec(*([None] * axis), FSDP)


def path_text(key_path: tuple) -> str:
    """A pytree key path as 'params/policy/params/layers_0/mlp/up_proj/kernel'."""
    names = (
        getattr(part, "key", getattr(part, "name", getattr(part, "idx", part))) for part in key_path
    )
    return "/".join(str(name) for name in names)


def state_shardings(tree: Any, mesh: Mesh, min_size: int = MIN_SHARD_SIZE) -> Any:
    """A ``NamedSharding`` for every leaf of ``tree`` (arrays or ``jax.ShapeDtypeStruct``s):
    ``leaf_spec`` over the mesh's "fsdp" axis."""
    check_mesh(mesh)
    fsdp_size = mesh.shape[FSDP]

    def sharding(key_path: tuple, leaf: Any) -> NamedSharding:
        spec = leaf_spec(path_text(key_path), tuple(np.shape(leaf)), fsdp_size, min_size)
        return NamedSharding(mesh, spec)

    return jax.tree_util.tree_map_with_path(sharding, tree)


def shard_state(tree: Any, mesh: Mesh, min_size: int = MIN_SHARD_SIZE) -> Any:
    """``tree`` placed by ``state_shardings``; host (NumPy) leaves go to each device's slice
    only, never whole onto one device."""
    return jax.device_put(tree, state_shardings(tree, mesh, min_size))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """The leading (row) axis split over ("data", "fsdp"), the other axes whole."""
    check_mesh(mesh)
    return NamedSharding(mesh, PartitionSpec((DATA, FSDP)))


def check_rows(mesh: Mesh, rows: int, name: str) -> None:
    """ValueError naming ``name`` when its ``rows`` do not split evenly over the mesh."""
    devices = mesh.shape[DATA] * mesh.shape[FSDP]
    if rows % devices:
        raise ValueError(
            f"{name} has {rows} rows, which the mesh axes ({DATA!r}, {FSDP!r}) of sizes "
            f"({mesh.shape[DATA]}, {mesh.shape[FSDP]}) cannot split evenly: give a multiple "
            f"of {devices} rows."
        )


def check_sample_layout(layout: str, flag: str = "--sample-layout") -> str:
    """``layout`` when it is one of SAMPLE_LAYOUTS, else ValueError naming ``flag``."""
    if layout not in SAMPLE_LAYOUTS:
        raise ValueError(
            f"{flag} {layout!r} is not one of {', '.join(SAMPLE_LAYOUTS)}: replicated decodes "
            "each device's rows with the whole model, tensor splits heads and MLP columns, "
            "fsdp decodes under the training layout, auto chooses by memory."
        )
    return layout


class StepLayout(NamedTuple):
    """How a step being traced is laid out: its ``mesh`` and its sampling layout (one of
    SAMPLE_LAYOUTS); ``sampling``: whether the sampler is being traced now."""

    mesh: Mesh
    sample: str = "auto"
    sampling: bool = False
    min_size: int = MIN_SHARD_SIZE


# The layout of the step being traced (set by ``shard_trainer``'s step and the commands'
# jobs through ``rows_on``, read by ``rows_split``, ``for_sampling`` and the decode kernel):
# the rows the step makes itself, such as a group's copies of its prompt's prefilled cache,
# are laid out as the prompts' are, and sampling reads its own layout of the weights.
_LAYOUT: contextvars.ContextVar[StepLayout | None] = contextvars.ContextVar("rows", default=None)


@contextlib.contextmanager
def rows_on(
    mesh: Mesh | None, sample_layout: str = "auto", min_size: int = MIN_SHARD_SIZE
) -> Iterator[None]:
    """While open (and tracing), ``rows_split`` splits rows over ``mesh``, the sampler runs
    in ``sample_layout`` and ``for_training`` lays params out as ``state_shardings`` with
    ``min_size`` does."""
    check_sample_layout(sample_layout)
    layout = None if mesh is None else StepLayout(mesh, sample_layout, min_size=min_size)
    token = _LAYOUT.set(layout)
    try:
        yield
    finally:
        _LAYOUT.reset(token)


def step_layout() -> StepLayout | None:
    """The layout of ``rows_on`` while it is open, else None."""
    return _LAYOUT.get()


def rows_mesh() -> Mesh | None:
    """The mesh of ``rows_on`` while it is open, else None."""
    layout = _LAYOUT.get()
    return None if layout is None else layout.mesh


def rows_spec() -> PartitionSpec:
    """How rows split now: over ("data", "fsdp"), or over "data" alone while a tensor-parallel
    sampler is traced (its "fsdp" devices share rows and split the heads)."""
    layout = _LAYOUT.get()
    if layout is not None and layout.sampling and layout.sample == "tensor":
        return PartitionSpec(DATA)
    return PartitionSpec((DATA, FSDP))


def rows_split(tree: Any) -> Any:
    """Inside jit: every leaf of ``tree`` split along its rows (first axis) over the mesh of
    ``rows_on`` (``rows_spec``), as the prompts are; ``tree`` as it is outside one. Without it
    XLA's partitioner may lay such rows out by another axis and replicate them to get back."""
    layout = _LAYOUT.get()
    if layout is None:
        return tree
    spec = rows_spec()
    split = math.prod(layout.mesh.shape[axis] for axis in jax.tree.leaves(tuple(spec)))
    rows = NamedSharding(layout.mesh, spec)

    def constrained(leaf: Any) -> Any:
        # rows that do not split evenly (a minibatch smaller than the mesh) stay as XLA lays
        # them out
        if np.ndim(leaf) == 0 or np.shape(leaf)[0] % split:
            return leaf
        return jax.lax.with_sharding_constraint(leaf, rows)

    return jax.tree.map(constrained, tree)


def tensor_spec(key_path: tuple, shape: tuple[int, ...], size: int) -> PartitionSpec:
    """The tensor-parallel spec of one leaf of a decoder's params over an axis of ``size``:
    COLUMN_SPLIT kernels (and their biases) by their last axis, ROW_SPLIT kernels by their
    first, VOCAB_SPLIT tables by their vocabulary; replicated where the axis does not divide
    or the leaf is none of those (norms, the row-split layers' biases)."""
    names = [str(getattr(part, "key", getattr(part, "name", part))) for part in key_path]
    module, leaf = (names[-2], names[-1]) if len(names) >= 2 else ("", "")
    axis = None
    if module in COLUMN_SPLIT and leaf in ("kernel", "bias"):
        axis = len(shape) - 1
    elif module in ROW_SPLIT and leaf == "kernel":
        axis = 0
    elif module in VOCAB_SPLIT and leaf in ("embedding", "kernel", "bias"):
        axis = 0 if leaf == "embedding" else len(shape) - 1
    if size == 1 or axis is None or shape[axis] % size:
        return PartitionSpec()
    return PartitionSpec(*([None] * axis), FSDP)


def sampling_shardings(tree: Any, mesh: Mesh, sample_layout: str) -> Any:
    """A ``NamedSharding`` for each leaf of the policy's params as ``sample_layout`` lays
    them out for decoding ("auto" resolved first): whole on every device, split
    tensor-parallel over "fsdp", or as training does."""
    check_mesh(mesh)
    layout = resolve_sample_layout(sample_layout, tree, mesh)
    if layout == "fsdp":
        return state_shardings(tree, mesh)
    if layout == "replicated":
        return jax.tree.map(lambda _: NamedSharding(mesh, PartitionSpec()), tree)
    size = mesh.shape[FSDP]
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: NamedSharding(mesh, tensor_spec(path, tuple(np.shape(leaf)), size)),
        tree,
    )


def device_memory(mesh: Mesh) -> int | None:
    """Bytes of memory of the mesh's first device where its backend says (a GPU's or TPU's
    ``memory_stats``), None where it does not (a CPU, a deviceless target)."""
    device = mesh.devices.flat[0]
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 (backends without the call raise their own errors)
        return None
    return None if not stats else stats.get("bytes_limit")


def resolve_sample_layout(sample_layout: str, tree: Any, mesh: Mesh) -> str:
    """``sample_layout`` with "auto" made concrete: "replicated" on one device, or where the
    whole of ``tree`` takes at most AUTO_REPLICATED_SHARE of a device's memory (or the
    backend names no memory), else "tensor"."""
    check_sample_layout(sample_layout)
    if sample_layout != "auto":
        return sample_layout
    if mesh.devices.size == 1:
        return "replicated"
    whole = sum(
        math.prod(np.shape(leaf)) * np.dtype(leaf.dtype).itemsize for leaf in jax.tree.leaves(tree)
    )
    capacity = device_memory(mesh)
    if capacity is None or whole <= AUTO_REPLICATED_SHARE * capacity:
        return "replicated"
    return "tensor"


def for_training(params: Any) -> Any:
    """Inside a sharded step: ``params`` (the compute-dtype copy of the state's float32
    masters) held split as the state is, so that each layer gathers this copy where it is
    used, never the masters (which gathered twice the bytes in bfloat16); as they are
    outside one."""
    layout = _LAYOUT.get()
    if layout is None:
        return params
    return constrain(params, layout.mesh, layout.min_size)


def for_sampling(params: Any) -> Any:
    """Inside a sharded step: the policy's compute-dtype ``params`` resharded once into the
    step's sampling layout (one gather a leaf for "replicated", a slice for "tensor"), to be
    decoded from; ``params`` as they are outside one."""
    layout = _LAYOUT.get()
    if layout is None:
        return params
    shardings = sampling_shardings(params, layout.mesh, layout.sample)
    return jax.lax.with_sharding_constraint(params, shardings)


def sample_with(params: Any, rows: Any, play: Callable[[Any, Any], Any]) -> Any:
    """``play(params, rows)`` traced as the step's sampler: ``params`` laid out for sampling
    (``for_sampling``), ``rows`` (the prompts: arrays [B, ...]) and the rows the sampler makes
    split as that layout splits them. What it returns is the caller's to split over the
    training rows again (``rows_split`` after it)."""
    layout = _LAYOUT.get()
    if layout is None:
        return play(params, rows)
    resolved = resolve_sample_layout(layout.sample, params, layout.mesh)
    token = _LAYOUT.set(layout._replace(sample=resolved, sampling=True))
    try:
        return play(for_sampling(params), rows_split(rows))
    finally:
        _LAYOUT.reset(token)


def constrain(tree: Any, mesh: Mesh, min_size: int) -> Any:
    """Inside jit: every leaf of ``tree`` laid out as ``state_shardings`` says."""
    return jax.lax.with_sharding_constraint(tree, state_shardings(tree, mesh, min_size))


def shard_trainer(
    trainer: Any, mesh: Mesh, min_size: int = MIN_SHARD_SIZE, sample_layout: str = "auto"
) -> Any:
    """``trainer`` (from ``make_trainer``) with jitted ``init`` and ``step`` whose state lives
    sharded over ``mesh``: init creates the reference, adapters and Adam's moments directly in
    their shards; step takes prompts [B, P] with B a multiple of the device count, splits
    them over ("data", "fsdp") and returns the state in the same layout, metrics replicated.

    ``step`` donates its state: the next state is written into the buffers of the one given,
    not beside them (without it a step's outputs held a second copy of the params, reference
    and Adam's moments), so the state passed in is deleted; keep only what ``step`` returns."""
    check_mesh(mesh)
    check_sample_layout(sample_layout, "sample_layout")
    rows = batch_sharding(mesh)

    def init(policy_params: Any, key: jax.Array, critic_params: Any = None) -> Any:
        return constrain(trainer.init(policy_params, key, critic_params), mesh, min_size)

    def step(
        state: Any, prompts: jax.Array, prompt_mask: jax.Array, key: jax.Array
    ) -> tuple[Any, dict[str, jax.Array]]:
        check_rows(mesh, prompts.shape[0], "prompts")
        prompts = jax.lax.with_sharding_constraint(prompts, rows)
        prompt_mask = jax.lax.with_sharding_constraint(prompt_mask, rows)
        state = constrain(state, mesh, min_size)
        with rows_on(mesh, sample_layout, min_size):
            state, metrics = trainer.step(state, prompts, prompt_mask, key)
        return constrain(state, mesh, min_size), metrics

    return trainer._replace(init=jax.jit(init), step=jax.jit(step, donate_argnums=0))


def bytes_per_device(tree: Any, mesh: Mesh, min_size: int = MIN_SHARD_SIZE) -> int:
    """The bytes one device holds of ``tree`` (arrays or ``jax.ShapeDtypeStruct``s) laid out
    by ``state_shardings``: each leaf's shard shape times its item size."""
    layout = state_shardings(tree, mesh, min_size)
    sizes = jax.tree.map(
        lambda leaf, sharding: (
            math.prod(sharding.shard_shape(tuple(np.shape(leaf)))) * np.dtype(leaf.dtype).itemsize
        ),
        tree,
        layout,
    )
    return int(sum(jax.tree.leaves(sizes)))
