"""How ppojax compiles the programs it runs itself: on CPU, XLA's own kernels are optimized by
LLVM at level 2 instead of XLA's default 3, and copy insertion runs its region analysis.

On CPU most of a PPO program's work is its dots, which XLA hands to YNNPACK, a library compiled
ahead of time. What LLVM optimizes while the program compiles is mostly the rest: small fused
elementwise kernels and loops over a few thousand floats, where level 3's extra passes buy no
speed. At level 2 the classic CartPole program compiles 12% (1 seed) to 22% (8 seeds) faster
and runs at the same speed (``benchmarks/xla_options.py``; level 0 compiles faster still but
runs 3.6x slower). What it trains agrees with level 3 up to the last bits: LLVM may fuse a
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
"""

from __future__ import annotations

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
