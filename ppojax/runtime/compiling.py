"""How ppojax compiles the programs it runs itself: on CPU, XLA's own kernels are optimized by
LLVM at level 2 instead of XLA's default 3, and copy insertion runs its region analysis.

On CPU most of a PPO program's work is its dots, which XLA hands to YNNPACK, a library compiled
ahead of time. What LLVM optimizes while the program compiles is mostly the rest: small fused
elementwise kernels and loops over a few thousand floats, where level 3's extra passes buy no
speed. At level 2 the classic CartPole program compiles 12% (1 seed) to 22% (8 seeds) faster
and runs at the same speed on a 2-core CPU (level 0 compiles faster still but runs 3.6x
slower). What it trains agrees with level 3 up to the last bits: LLVM may fuse a
multiply and an add differently. The vmapped classic CartPole, Pendulum and MinAtar CNN
programs measured gave the same bits; a GRU policy's and a single-seed tiny program's differ
in their last bits.

Copy insertion's region analysis (``xla_cpu_copy_insertion_use_region_analysis``) finds more
of the loop-carried buffers that a ``while`` body can update in place, so fewer copies run
per iteration: the classic CartPole program has 220 copies instead of 294, and its rollout
loop copies its small env-state arrays at every step without it. That is 7% less run time at
1 seed and 2% at 8, the same compile time, and bit for bit the same results (only buffers
change, never arithmetic).

``Experiment`` runs (``ppojax train`` and ``ppojax sweep``) compile their chunk runner this
way, and RLHF run folders (``ppojax rlhf``) their chunks of steps: 16-21% less compile time
for the reversal task's PPO and GRPO chunks, the same run time. A program a user compiles
with ``jax.jit`` keeps XLA's defaults unless given ``compiler_options()``:
``jax.jit(ppojax.train, compiler_options=ppojax.compiler_options())`` (JAX takes them on a
top-level jit only). Other backends keep XLA's defaults: there LLVM generates every kernel,
and no other level was measured.

``limit_cpu_threads(n)`` sizes the thread pool XLA's CPU client runs programs on. XLA runs
independent kernels of one program on that pool at once, and YNNPACK splits a reduction of more
than 32,768 floats across it. The classic CartPole program's kernels take about a microsecond,
less than handing work to another core costs, so with one thread it trains 1.18x, 1.20x and
1.14x faster at 1, 4 and 8 seeds on a 2-core machine, and the Pendulum preset 1.15x; CartPole
with 2,048 envs and Breakout-MinAtar with 64 run 1.4x and 1.6x slower so. The client sizes
the pool by the cores the process may use when it starts, so ``limit_cpu_threads`` narrows the
process to ``n`` cores while the client starts, then gives every thread all its cores back:
compiling still uses them all.
``auto_cpu_threads`` says when a config is that small; ``ppojax train`` and ``ppojax sweep``
follow it unless given ``--cpu-threads``.

``use_cpu_devices(n)`` splits the CPU into ``n`` JAX devices. Independent runs (seeds, sweep
points) laid over them run on every core at once, each device's share as one program, without
the per-kernel hand-offs that make a shared pool slow for small programs: on a 2-core machine
4 and 8 seeds of the classic CartPole config train 1.9x faster on 2 devices than on one with
a one-thread pool, compiled once, and 2 seeds of the larger configs measured 1.15-1.55x
faster than one device with its best pool. ``Experiment``
runs (``ppojax train``, ``ppojax sweep``) split their runs over the process's devices
(``parallel.runs_sharding``); ``auto_cpu_devices`` gives the count ``--cpu-devices auto``
uses.

``use_cpu_without_accelerators()`` starts JAX's CPU backend alone on a machine with no
accelerator, so that an installed plugin without its device (``ppojax[gpu-aot]``'s CUDA
plugin) neither logs its failed start nor stays unregistered; ppojax's commands call it first.
"""

from __future__ import annotations

import functools
import glob
import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Mapping
from typing import Any

import jax

CPU_OPTIONS: dict[str, Any] = {
    "xla_backend_optimization_level": 2,
    "xla_cpu_copy_insertion_use_region_analysis": True,
}


def compiler_options(backend: str | None = None) -> dict[str, Any] | None:
    """ppojax's XLA compiler options for ``backend`` (default: JAX's default backend); None
    where XLA's defaults are kept."""
    return dict(CPU_OPTIONS) if (backend or jax.default_backend()) == "cpu" else None


def backends_started() -> bool:
    """Whether JAX has created its backends (clients) in this process, asked without starting
    them: once they exist, JAX's config refuses another ``jax_num_cpu_devices`` (RuntimeError);
    before, the other count is set and at once set back."""
    current = jax.config.jax_num_cpu_devices
    try:
        jax.config.update("jax_num_cpu_devices", 2 if current == 1 else 1)
    except RuntimeError:
        return True
    jax.config.update("jax_num_cpu_devices", current)
    return False


def check_count(name: str, value: Any) -> None:
    """A ValueError naming ``name`` unless ``value`` is a positive int (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def limit_cpu_threads(threads: int) -> bool:
    """Start JAX's backends with a CPU thread pool of ``threads`` threads; True if the pool
    is smaller than the cores this process may use, False where nothing changes (as many
    threads as cores or more, or an OS without ``sched_setaffinity``).

    Must run before JAX's first computation in the process (the pool is sized once, when the
    client starts); raises RuntimeError after it. Every thread keeps or gets back its cores,
    so compiling and other work still run on all of them.
    """
    check_count("threads", threads)
    if backends_started():
        raise RuntimeError(
            "limit_cpu_threads must run before JAX's first computation in this process "
            "(JAX sizes its CPU thread pool once, when its backend starts); call it first, "
            "or start the process under `taskset -c 0`"
        )
    if not hasattr(os, "sched_getaffinity"):
        return False
    cores = sorted(os.sched_getaffinity(0))
    if threads >= len(cores):
        return False
    before = {}
    for tid in _thread_ids():
        try:
            before[tid] = os.sched_getaffinity(tid)
        except ProcessLookupError:
            pass  # a thread that ended meanwhile
    os.sched_setaffinity(0, cores[:threads])
    try:
        jax.devices()  # the clients start here, sized by the cores allowed now
    finally:
        for tid in _thread_ids():  # threads started meanwhile inherited the narrow mask
            try:
                os.sched_setaffinity(tid, before.get(tid, cores))
            except (ProcessLookupError, PermissionError):
                pass  # a thread that ended meanwhile
    return True


def _thread_ids() -> list[int]:
    try:
        return [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def use_cpu_devices(devices: int) -> bool:
    """Give JAX ``devices`` CPU devices (``jax_num_cpu_devices``); True if that changes the
    count (one device per process by default). Must run before JAX's first computation in the
    process, and before ``limit_cpu_threads``; after it, raises RuntimeError unless JAX
    already has that many CPU devices."""
    check_count("devices", devices)
    if backends_started():
        if len(jax.devices("cpu")) == devices:
            return False
        raise RuntimeError(
            "use_cpu_devices must run before JAX's first computation in this process "
            "(JAX creates its CPU devices once, when its backend starts); call it first, or "
            f"set JAX_NUM_CPU_DEVICES={devices}"
        )
    if jax.config.jax_num_cpu_devices == devices or (
        devices == 1 and jax.config.jax_num_cpu_devices < 1
    ):
        return False
    jax.config.update("jax_num_cpu_devices", devices)
    return True


def cpu_cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def auto_cpu_devices(runs: int, cores: int | None = None) -> int | None:
    """The CPU devices to split ``runs`` independent runs over: the largest count of at most
    ``cores`` (default: the cores this process may use) that divides the runs evenly, when
    that is more than one; None (one device) otherwise, and wherever an accelerator plugin is
    installed or ``JAX_NUM_CPU_DEVICES``, ``jax_num_cpu_devices`` or XLA_FLAGS'
    ``--xla_force_host_platform_device_count`` already sets the count."""
    if accelerator_installed() or os.environ.get("JAX_NUM_CPU_DEVICES", "").strip():
        return None
    if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        return None
    if jax.config.jax_num_cpu_devices > 0:
        return None
    from ppojax.runtime.sharding import even_split

    devices = even_split(runs, cpu_cores() if cores is None else cores)
    return devices if devices > 1 else None


# Up to both sizes, one thread runs an MLP policy's program fastest on a 2-core machine
# (widest = the widest hidden layer): runs x envs x widest, the rollout's width, and
# runs x minibatch size x widest**2, a minibatch step's matmul work. Env steps/s with a
# one-thread pool against two, measured: 1, 4 and 8 seeds of the classic
# CartPole config (4 envs, 64-64, minibatches of 128) 1.18x, 1.20x, 1.14x; 16 envs (1,024;
# 2**21) 1.15x; 4 envs with 256-256 layers (1,024; 2**23) 1.18x. Past them: 16 seeds (4,096;
# 2**23) 0.97x, 64 envs (4,096; 2**23) 0.80x, 8 envs with 256-256 layers (2,048; 2**24) 0.97x.
SMALL_ROLLOUT = 2048
SMALL_MINIBATCH = 2**23


def auto_cpu_threads(config: Any, runs: int = 1) -> int | None:
    """1 where ``runs`` vmapped runs of ``config`` make a program small enough that a
    one-thread pool runs it fastest on CPU (SMALL_ROLLOUT, SMALL_MINIBATCH); None (every
    core) for larger ones, CNN and recurrent policies (not measured), and wherever an
    accelerator plugin is installed (the program runs there). ``config`` is a PPOConfig or a
    mapping of its fields (all of them, as a config.json holds)."""
    field = config.get if isinstance(config, Mapping) else functools.partial(getattr, config)
    recurrent = field("recurrent")
    if isinstance(recurrent, str) and recurrent.lower() in ("none", "off"):
        recurrent = None
    if accelerator_installed() or field("encoder") != "mlp" or recurrent is not None:
        return None
    widest = max(field("hidden_sizes"), default=1)
    minibatch = field("num_envs") * field("num_steps") // field("num_minibatches")
    rollout_small = runs * field("num_envs") * widest <= SMALL_ROLLOUT
    minibatch_small = runs * minibatch * widest**2 <= SMALL_MINIBATCH
    return 1 if rollout_small and minibatch_small else None


def accelerator_installed() -> bool:
    """Whether JAX may find a backend other than the CPU, judged without starting one:
    ``JAX_PLATFORMS`` names another platform, or a PJRT plugin (CUDA, ROCm, TPU) is
    installed."""
    platforms = os.environ.get("JAX_PLATFORMS", "").strip()
    if platforms:
        return any(name.strip() not in ("", "cpu") for name in platforms.split(","))
    if importlib.metadata.entry_points(group="jax_plugins"):
        return True
    return any(importlib.util.find_spec(name) for name in ("jax_plugins", "libtpu"))


# Device nodes of the accelerators JAX has plugins for: NVIDIA's (the nodes JAX's own check
# looks for, /dev/dxg on WSL2), ROCm's, and a TPU VM's (v4 and v5e chips as accel nodes, v5p
# and v6e as VFIO groups; /dev/vfio/vfio alone is the container any Linux may have)
ACCELERATOR_NODES = (
    "/dev/nvidia0",
    "/dev/nvidiactl",
    "/dev/dxg",
    "/dev/kfd",
    "/dev/accel*",
    "/dev/vfio/[0-9]*",
)


def accelerator_present() -> bool:
    """Whether this machine has an accelerator's device node (ACCELERATOR_NODES)."""
    return any(glob.glob(pattern) for pattern in ACCELERATOR_NODES)


def use_cpu_without_accelerators() -> bool:
    """Start only JAX's CPU backend (``JAX_PLATFORMS=cpu``, for this process and those it
    starts) on a Linux machine with no accelerator; True if it did. Nothing changes where
    ``JAX_PLATFORMS`` is set (empty included: JAX's own choice), an accelerator's device node
    exists, the OS is not Linux (Apple's Metal plugin has no node to look for) or JAX's
    backends have started.

    An installed plugin without its device otherwise tries to start: the CUDA plugin of
    ``[gpu-aot]`` logs a traceback for the cuDNN it does not find and is left unregistered,
    so that compiling for a GPU without one fails too; with the CPU named, it skips its CUDA
    checks and registers as the compiler ``ppojax.runtime.deviceless`` needs."""
    if "JAX_PLATFORMS" in os.environ or jax.config.jax_platforms is not None:
        return False
    if not sys.platform.startswith("linux"):
        return False
    if accelerator_present() or backends_started():
        return False
    os.environ["JAX_PLATFORMS"] = "cpu"
    jax.config.update("jax_platforms", "cpu")  # jax read the variable when it was imported
    return True
