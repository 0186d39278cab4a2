"""Compiling for a Google TPU on a machine without one (deviceless ahead-of-time).

libtpu (``pip install "ppojax[tpu-aot]"``: jax's own tpu extra, libtpu at the installed jax's
version) describes TPU slices by name and compiles for them with no TPU attached. Single-chip
names (``v5e:1x1``) are refused, so one chip of a target is one device of its smallest slice
(``TARGETS``), and a program compiled over a mesh of that one device is the chip's program.
``ppojax.runtime.launches`` counts what it runs; TPU HLO records no loop trip counts, so
``launches.count(text, trips_from_condition=True)`` reads them from the loops' conditions.

    compiled = compile_for(jax.vmap(f), (keys,), "v5e")
    compiled.as_text()  # one v5e chip's program

JAX traces such a program with the CPU as its default backend; ``compile_for`` traces it
inside ``kernels.lowering_for_tpu``, so that it gets the forms a TPU gets
(``kernels.TPU_DEFAULTS``; the CUDA defaults stay off).
libtpu logs warnings about TPU_ACCELERATOR_TYPE and worker hostnames on a machine without a
TPU; they do not matter for compiling. ``topology`` lets several processes load libtpu at once
(``ALLOW_MULTIPLE_LIBTPU_LOAD``), which would otherwise refuse all but the first.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.sharding import Mesh

from ppojax.runtime import deviceless, kernels

# target name -> (the smallest slice libtpu describes, the chip's name in its devices)
TARGETS = {"v5e": ("v5e:2x2", "TPU v5 lite"), "v6e": ("v6e:2x2", "TPU v6 lite")}
INSTALL_HINT = 'pip install "ppojax[tpu-aot]" (libtpu at jax\'s own version)'


class DevicelessTPUError(deviceless.DevicelessError):
    """Deviceless compilation for a TPU is not possible here: an unknown target or no libtpu."""


def libtpu_installed() -> bool:
    """Whether libtpu is installed (found without importing it)."""
    return importlib.util.find_spec("libtpu") is not None


def require_libtpu() -> None:
    if not libtpu_installed():
        raise DevicelessTPUError(
            "compiling for a TPU without one needs libtpu, which is not installed: " + INSTALL_HINT
        )


def topology(target: str) -> Any:
    """JAX's description of ``target``'s smallest slice (``TARGETS``)."""
    if target not in TARGETS:
        raise DevicelessTPUError(
            f"unknown TPU target {target!r}; known targets: {', '.join(sorted(TARGETS))}"
        )
    return slice_topology(TARGETS[target][0])


@functools.cache
def slice_topology(name: str) -> Any:
    """JAX's description of the TPU slice libtpu calls ``name`` ("v5e:2x4": 8 v5e chips)."""
    require_libtpu()
    from jax.experimental import topologies

    # libtpu locks /tmp/libtpu_lockfile for the TPU of the machine, and a second process
    # compiling at once (a test beside a benchmark, two pytest workers) fails on it: a
    # deviceless compile holds no TPU
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        return topologies.get_topology_desc(topology_name=name, platform="tpu")
    except Exception as error:  # libtpu raises XlaRuntimeError, which has no public name
        raise DevicelessTPUError(f"no {name} topology from libtpu: {error}") from error


def slice_devices(name: str, chips: int) -> list[Any]:
    """The first ``chips`` abstract chips of the slice ``name``, for a mesh of any shape."""
    return list(slice_topology(name).devices)[:chips]


def target_mesh(target: str, axis_name: str = "devices") -> Mesh:
    """A 1-D mesh over one abstract chip of ``target``."""
    return Mesh(list(topology(target).devices)[:1], (axis_name,))


def compile_for(
    fn: Callable[..., Any], args: Sequence[Any], target: str, static_argnums: tuple[int, ...] = ()
) -> Any:
    """``jax.jit(fn)`` compiled for one chip of ``target`` for arguments shaped like ``args``
    (as ``deviceless.compile_for`` takes them). Returns the ``jax.stages.Compiled``: it cannot
    run here, but ``as_text()`` is the chip's optimized HLO and ``memory_analysis()`` its
    buffers."""
    require_libtpu()
    mesh = target_mesh(target)
    lower = deviceless.lowering_on(fn, args, mesh, static_argnums)
    # the program is a TPU's: its defaults (kernels.TPU_DEFAULTS) go in
    with kernels.lowering_for_tpu(), jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        return lower().compile()
