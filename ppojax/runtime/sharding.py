"""Devices and hosts, through JAX's own machinery (``jax.sharding``, ``jax.distributed``).

Three ways to use several devices:

- independent runs (seeds, sweep points) split across devices: ``ppojax.sweep(..., mesh=mesh)``
  lays the [points, seeds] runs over the devices with a ``NamedSharding``; the runs never
  communicate and the results stay on the devices that computed them.
- a PBT population split across devices: ``ppojax.pbt(..., mesh=mesh)`` keeps each member's
  state on one device; only the exploit step's copies cross between devices.
- one run's environments split across devices: ``ppojax.train(config, key, mesh=mesh)`` keeps
  every array with an env axis sharded over the mesh (``with_sharding_constraint``); XLA's
  partitioner runs each device's envs locally and all-reduces the gradients of the replicated
  parameters, so the run computes the same numbers as on one device.

Several hosts: call ``initialize(...)`` (``jax.distributed.initialize``) in every process
before anything else touches JAX, then build the mesh over ``jax.devices()``, which then lists
the devices of all processes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec


def make_mesh(devices: list[Any] | None = None, axis_name: str = "devices") -> Mesh:
    """A 1-D mesh over ``devices`` (default: every device of every process)."""
    devices = jax.devices() if devices is None else list(devices)
    return Mesh(np.asarray(devices), (axis_name,))


def num_mesh_devices(mesh: Mesh) -> int:
    return math.prod(mesh.devices.shape)


def leading_axis_sharding(mesh: Mesh) -> NamedSharding:
    """Leading array axis split over all of ``mesh``'s axes; the rest replicated."""
    return NamedSharding(mesh, PartitionSpec(mesh.axis_names))


def even_split(runs: int, limit: int) -> int:
    """The most parts, at most ``limit``, that ``runs`` divide into evenly (1 at least)."""
    return max(n for n in range(1, min(limit, runs) + 1) if runs % n == 0)


def runs_sharding(runs: int, devices: list[Any] | None = None) -> NamedSharding | None:
    """``runs`` independent runs along a leading axis, split over the most of ``devices``
    (default: this process's) that divide them evenly, when that is more than one device;
    None (JAX's default device) otherwise."""
    devices = jax.local_devices() if devices is None else list(devices)
    count = even_split(runs, len(devices))
    if count < 2:
        return None
    return leading_axis_sharding(make_mesh(devices[:count], "runs"))


def place_runs(tree: Any, runs: int) -> Any:
    """``tree`` (leaves [runs, ...]) on the devices ``runs_sharding(runs)`` gives."""
    sharding = runs_sharding(runs)
    return tree if sharding is None else jax.device_put(tree, sharding)


def jit_over_runs(function: Callable[..., Any], runs: int) -> Any:
    """``jax.jit(function)``, its outputs (leaves [runs, ...]) placed as ``runs_sharding``."""
    sharding = runs_sharding(runs)
    return jax.jit(function) if sharding is None else jax.jit(function, out_shardings=sharding)


def check_divisible(size: int, mesh: Mesh, what: str) -> None:
    devices = num_mesh_devices(mesh)
    if size % devices:
        raise ValueError(
            f"{what}={size} cannot be split evenly over {devices} devices; "
            f"choose a multiple of {devices}"
        )


def constrain_env_axis(tree: Any, mesh: Mesh | None, what: str = "the env axis") -> Any:
    """Inside jit: keep the leading (env) axis of every leaf of ``tree`` split over ``mesh``; a
    ``ValueError`` naming ``what`` when that axis cannot be split evenly over its devices."""
    if mesh is None:
        return tree
    for size in sorted({leaf.shape[0] for leaf in jax.tree.leaves(tree)}):
        check_divisible(size, mesh, what)
    sharding = leading_axis_sharding(mesh)
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, sharding), tree)


def axis_sharding(mesh: Mesh, axis: int | None) -> NamedSharding:
    """Axis ``axis`` of an array split over all of ``mesh``'s axes, the rest replicated (all
    replicated for None)."""
    if axis is None:
        return NamedSharding(mesh, PartitionSpec())
    return NamedSharding(mesh, PartitionSpec(*([None] * axis), mesh.axis_names))


def put_global(tree: Any, sharding: NamedSharding) -> Any:
    """Host arrays (the same full value in every process) as global arrays laid out by
    ``sharding``; works with one process or many."""

    def place(leaf: Any) -> jax.Array:
        if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            data = put_global(np.asarray(jax.random.key_data(leaf)), sharding)
            return jax.random.wrap_key_data(data, impl=jax.random.key_impl(leaf))
        host = np.asarray(leaf)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    return jax.tree.map(place, tree)


def grid_mesh(mesh: Mesh, num_points: int, num_seeds: int) -> Mesh:
    """``mesh``'s devices as a 2-D ("points", "seeds") mesh that divides [points, seeds]:
    as many devices along seeds as divide both, the rest along points."""
    devices = num_mesh_devices(mesh)
    along_seeds = math.gcd(num_seeds, devices)
    along_points = devices // along_seeds
    if num_points % along_points:
        raise ValueError(
            f"{num_points} sweep points x {num_seeds} seeds cannot be split evenly over "
            f"{devices} devices; make the seeds or the points a multiple of the device count"
        )
    layout = np.asarray(mesh.devices).reshape(along_points, along_seeds)
    return Mesh(layout, ("points", "seeds"))


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    local_device_ids: list[int] | None = None,
) -> None:
    """Join a multi-host run: ``jax.distributed.initialize`` with the same arguments (all
    optional on managed clusters such as TPU pods and SLURM, where JAX finds them itself)."""
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        local_device_ids=local_device_ids,
    )
