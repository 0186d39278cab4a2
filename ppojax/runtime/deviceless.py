"""Compiling for an NVIDIA GPU on a machine without one ("deviceless" ahead-of-time).

XLA compiles for a GPU it is only told about: a target spec (XLA's ``GpuTargetConfigProto``
as text, committed in ``gpu_specs/``) gives the device's limits, and the CUDA PJRT plugin
(``pip install "ppojax[gpu-aot]"``; no NVIDIA libraries, no driver) builds the program. The
result is the GPU's own optimized HLO, minus autotuning (each matmul gets a default Triton
gemm) and with the generic sort in place of CUB. ``ppojax.runtime.launches`` counts what it
would run.

    compiled = compile_for(jax.vmap(f), (keys,), "h200")
    compiled.as_text()  # the H200 program

Set ``JAX_PLATFORMS=cpu`` before JAX starts where the plugin is installed: otherwise the plugin
runs its CUDA checks, logs a traceback for the cuDNN it does not find and stays unregistered:
JAX runs on the CPU, and compiling for a GPU fails. ppojax's commands set it themselves
on a machine with no accelerator (``compiling.use_cpu_without_accelerators``).
"""

from __future__ import annotations

import functools
import importlib.resources
import importlib.util
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ppojax.runtime import kernels

# target name -> its spec file in gpu_specs/ (origin and license: gpu_specs/README.md)
TARGETS = {"h200": "h200.txtpb", "h100": "h100_sxm.txtpb"}
PLUGINS = ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12")
INSTALL_HINT = 'pip install "ppojax[gpu-aot]" (the CUDA plugin at jax\'s own version)'
# a field newer than the plugin of jax 0.10.2: its proto cannot parse the line
NEWER_FIELDS = ("collective_memory_granularity",)


class DevicelessError(RuntimeError):
    """Deviceless compilation is not possible here: an unknown target or no CUDA plugin."""


def spec_text(target: str) -> str:
    """The committed spec of ``target`` (one of TARGETS), as XLA publishes it, except that the
    H100's ``device_description_str`` is renamed: XLA looks CUB's sort tuning up by that name
    and, finding the H100's, asks the (absent) device for it ("invalid device ordinal"); under
    another name it takes the generic sort, as it does for the H200."""
    if target not in TARGETS:
        raise DevicelessError(
            f"unknown GPU target {target!r}; known targets: {', '.join(sorted(TARGETS))}"
        )
    folder = importlib.resources.files("ppojax.runtime") / "gpu_specs"
    text = (folder / TARGETS[target]).read_text()
    if target == "h100":
        text = text.replace(
            'device_description_str: "NVIDIA H100 80GB HBM3"',
            'device_description_str: "NVIDIA H100 80GB HBM3 (deviceless)"',
        )
    return text


def without_newer_fields(text: str) -> str:
    """``text`` without the lines of NEWER_FIELDS."""
    return "".join(
        line
        for line in text.splitlines(keepends=True)
        if line.strip().split(":")[0] not in NEWER_FIELDS
    )


def plugin_installed() -> bool:
    """Whether a CUDA PJRT plugin is installed (found without importing it)."""
    if importlib.util.find_spec("jax_plugins") is None:
        return False
    return any(importlib.util.find_spec(name) for name in PLUGINS)


def require_plugin() -> None:
    if not plugin_installed():
        raise DevicelessError(
            "compiling for a GPU without one needs JAX's CUDA plugin, which is not installed: "
            + INSTALL_HINT
        )


@functools.cache
def topology(target: str, devices: int = 1) -> Any:
    """JAX's description of ``devices`` GPUs of ``target`` (topology "1x1x<devices>"). Spec
    lines the installed plugin cannot parse (fields XLA added after it) are dropped: before
    jax 0.11 at once, since the plugin logs an error for each failed parse; after, on failure."""
    require_plugin()
    from jax.experimental import topologies

    text = spec_text(target)
    if jax_version() < (0, 11):
        text = without_newer_fields(text)
    shape = f"1x1x{devices}"
    try:
        return topologies.get_topology_desc(platform="cuda", target_config=text, topology=shape)
    except Exception as error:  # the plugin raises XlaRuntimeError, which has no public name
        if "not implemented for cuda" in str(error):
            raise DevicelessError(
                "the CUDA plugin did not start: set JAX_PLATFORMS=cpu (or the jax_platforms "
                "flag) before JAX starts its backends, so that it does not look for a GPU"
            ) from error
        if "parse" not in str(error).lower() or text == without_newer_fields(text):
            raise DevicelessError(f"no {target} topology from the CUDA plugin: {error}") from error
    return topologies.get_topology_desc(
        platform="cuda", target_config=without_newer_fields(text), topology=shape
    )


def jax_version() -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", jax.__version__)[:3])


def target_devices(target: str, devices: int = 1) -> list[Any]:
    """The ``devices`` abstract GPUs of ``target``'s "1x1x<devices>" topology, for a mesh of
    any shape (``jax.sharding.Mesh`` over them)."""
    if not isinstance(devices, int) or isinstance(devices, bool) or devices < 1:
        raise DevicelessError(f"a {target} topology needs a device count >= 1, got {devices!r}")
    return list(topology(target, devices).devices)


def spec_number(target: str, field: str) -> float:
    """A number of ``target``'s spec (``device_memory_size`` in bytes, ``memory_bandwidth`` in
    bytes/s, ``clock_rate_ghz``, ...); DevicelessError when the spec has no such field."""
    found = re.search(rf"^\s*{re.escape(field)}:\s*([0-9.eE+-]+)\s*$", spec_text(target), re.M)
    if found is None:
        raise DevicelessError(f"the {target} spec has no field {field!r}")
    return float(found.group(1))


def target_mesh(target: str, devices: int = 1, axis_name: str = "devices") -> Mesh:
    """A 1-D mesh over ``devices`` abstract GPUs of ``target``."""
    from jax.experimental import topologies

    return topologies.make_mesh(topology(target, devices), (devices,), (axis_name,))


def abstract(tree: Any, mesh: Mesh) -> Any:
    """Every leaf of ``tree`` as a ``jax.ShapeDtypeStruct`` replicated over ``mesh``: its
    shape and dtype, and weak type for Python numbers (as ``jit`` would trace them)."""
    replicated = NamedSharding(mesh, PartitionSpec())

    def leaf(x: Any) -> jax.ShapeDtypeStruct:
        if isinstance(x, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct(
                x.shape, x.dtype, sharding=replicated, weak_type=x.weak_type
            )
        weak = isinstance(x, int | float | complex) and not isinstance(x, bool)
        dtype = x.dtype if hasattr(x, "dtype") else jax.numpy.asarray(x).dtype
        return jax.ShapeDtypeStruct(np.shape(x), dtype, sharding=replicated, weak_type=weak)

    return jax.tree.map(leaf, tree)


def compile_for(
    fn: Callable[..., Any],
    args: Sequence[Any],
    target: str,
    static_argnums: tuple[int, ...] = (),
) -> Any:
    """``jax.jit(fn)`` compiled for one GPU of ``target`` for arguments shaped like ``args``
    (arrays, Python numbers or ``ShapeDtypeStruct`` leaves; ``static_argnums`` pass as they
    are). Returns the ``jax.stages.Compiled``; it cannot run here, but ``as_text()`` is the
    target's optimized HLO and ``memory_analysis()`` its buffers."""
    require_plugin()  # before the cached topology, so that its absence is always named
    mesh = target_mesh(target)
    return compile_lowered(lowering_on(fn, args, mesh, static_argnums), mesh)


def lowering_on(
    fn: Callable[..., Any], args: Sequence[Any], mesh: Mesh, static_argnums: tuple[int, ...]
) -> Callable[[], Any]:
    """``lower()`` of ``jax.jit(fn)`` for arguments shaped like ``args`` on ``mesh``'s
    abstract devices (``static_argnums`` passed as they are), for a deviceless compile."""
    shaped = [
        arg if index in static_argnums else abstract(arg, mesh) for index, arg in enumerate(args)
    ]
    lowering = jax.jit(fn, static_argnums=static_argnums).lower
    return lambda: lowering(*shaped)


def compile_lowered(lower: Callable[[], Any], mesh: Mesh) -> Any:
    """``lower()`` (a function returning a ``jax.stages.Lowered``, traced for the abstract GPUs
    of ``mesh``) lowered and compiled as CUDA's program. Returns the ``jax.stages.Compiled``."""
    require_plugin()
    with kernels.lowering_for_cuda():  # the program is CUDA's: its defaults go in
        if jax_version() < (0, 11):  # Pallas's Triton lowering assumes compute capability 9.0
            return lower().compile()
        # from jax 0.11 it reads the GPU from the abstract mesh when none is attached
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return lower().compile()
