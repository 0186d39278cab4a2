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
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA = "data"
FSDP = "fsdp"
# Leaves below 16Ki elements (64 KiB in float32: norms, biases, LoRA's A at rank 16 and width
# 896) cost more in gathers than they save in memory, so every device keeps them whole.
MIN_SHARD_SIZE = 1 << 14


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


# The mesh whose ("data", "fsdp") axes split a step's rows while that step is traced (set by
# ``shard_trainer``'s step, read by ``rows_split``): the rows the step makes itself, such as
# a group's copies of its prompt's prefilled cache, are laid out as the prompts' are.
_ROWS_MESH: contextvars.ContextVar[Mesh | None] = contextvars.ContextVar("rows", default=None)


@contextlib.contextmanager
def rows_on(mesh: Mesh | None) -> Iterator[None]:
    """While open (and tracing), ``rows_split`` splits rows over ``mesh``."""
    token = _ROWS_MESH.set(mesh)
    try:
        yield
    finally:
        _ROWS_MESH.reset(token)


def rows_mesh() -> Mesh | None:
    """The mesh of ``rows_on`` while it is open, else None."""
    return _ROWS_MESH.get()


def rows_split(tree: Any) -> Any:
    """Inside jit: every leaf of ``tree`` split along its rows (first axis) over the mesh of
    ``rows_on``, as the prompts are; ``tree`` as it is outside one. Without it XLA's
    partitioner may lay such rows out by another axis and replicate them to get back."""
    mesh = _ROWS_MESH.get()
    if mesh is None:
        return tree
    return jax.lax.with_sharding_constraint(tree, batch_sharding(mesh))


def constrain(tree: Any, mesh: Mesh, min_size: int) -> Any:
    """Inside jit: every leaf of ``tree`` laid out as ``state_shardings`` says."""
    return jax.lax.with_sharding_constraint(tree, state_shardings(tree, mesh, min_size))


def shard_trainer(trainer: Any, mesh: Mesh, min_size: int = MIN_SHARD_SIZE) -> Any:
    """``trainer`` (from ``make_trainer``) with jitted ``init`` and ``step`` whose state lives
    sharded over ``mesh``: init creates the reference, adapters and Adam's moments directly in
    their shards; step takes prompts [B, P] with B a multiple of the device count, splits
    them over ("data", "fsdp") and returns the state in the same layout, metrics replicated.

    ``step`` donates its state: the next state is written into the buffers of the one given,
    not beside them (without it a step's outputs held a second copy of the params, reference
    and Adam's moments), so the state passed in is deleted; keep only what ``step`` returns."""
    check_mesh(mesh)
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
        with rows_on(mesh):
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
