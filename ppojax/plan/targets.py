"""The accelerators ``ppojax plan`` sizes a step for, as their makers publish them: each chip's
dense peak, HBM, HBM bandwidth and link bandwidth, the cost it assumes per kernel launch, the
source of each; for TPUs, the slices libtpu describes and how a slice's name counts chips.

    chip = CHIPS["v5e"]
    chip.bf16_flops, chip.hbm_bytes, chip.link_bandwidth
    tpu_slice("v5e", 8)     # "v5e:2x4": the smallest slice of at least 8 chips

``--devices`` counts chips. Cloud TPU names count chips for v5e and v6e (v5e-8 and v6e-8: 8
chips) and TensorCores for v5p, which has 2 a chip (v5p-8: 4 chips).
"""

from __future__ import annotations

import dataclasses

GPU_DATASHEETS = {
    "h100": "https://www.nvidia.com/en-us/data-center/h100/",
    "h200": "https://www.nvidia.com/en-us/data-center/h200/",
}
TPU_PAGES = {
    "v5e": "https://cloud.google.com/tpu/docs/v5e",
    "v6e": "https://cloud.google.com/tpu/docs/v6e",
    "v5p": "https://cloud.google.com/tpu/docs/v5p",
}
# The cost of one GPU kernel launch the estimate assumes, not measured by this project: a
# launch takes "on the order of microseconds" (GPU_LAUNCH_SOURCE); 2 us is this plan's pick.
GPU_LAUNCH_SOURCE = "https://modal.com/gpu-glossary/host-software/cuda-graph"
GPU_LAUNCH_SECONDS = 2e-6


@dataclasses.dataclass(frozen=True)
class Chip:
    """One accelerator: ``bf16_flops`` and ``f32_flops`` dense peaks (FLOP/s), ``hbm_bytes``
    and ``hbm_bandwidth`` (bytes/s; None for a GPU, whose XLA target spec gives both),
    ``link_bandwidth`` (bytes/s a chip sends one way to the others: half the published
    both-ways figure), ``launch_seconds`` a kernel launch costs, ``source`` of the figures,
    ``slices`` (TPU): (chips, libtpu topology name) from smallest to largest."""

    kind: str
    bf16_flops: float
    f32_flops: float
    link_bandwidth: float
    launch_seconds: float
    source: str
    hbm_bytes: int | None = None
    hbm_bandwidth: float | None = None
    slices: tuple[tuple[int, str], ...] = ()

    @property
    def is_tpu(self) -> bool:
        return self.kind == "tpu"


def gpu(name: str) -> Chip:
    # NVIDIA's H100 SXM datasheet: BF16 989 TFLOP/s and TF32 495 TFLOP/s dense (JAX runs float32
    # matmuls as TF32 on these GPUs by default), NVLink 900 GB/s both ways; the H200 has the same
    # chip, clocks and NVLink (its datasheet)
    return Chip("gpu", 989e12, 495e12, 900e9 / 2, GPU_LAUNCH_SECONDS, GPU_DATASHEETS[name])


def tpu(name: str, bf16: float, hbm: float, bandwidth: float, ici: float, slices) -> Chip:
    # A TPU runs the step as one program on the chip, with no host launch per op, and Google
    # publishes no per-op cost: none is counted. JAX's default matmul precision on a TPU runs
    # float32 matmuls as bf16 passes, so float32 gets the bf16 peak (a lower bound of the time).
    # "GB" in Google's pages is read as 1e9 bytes, the smaller reading.
    named = tuple((chips, f"{name}:{shape}") for chips, shape in slices)  # libtpu's names
    return Chip("tpu", bf16, bf16, ici / 2, 0.0, TPU_PAGES[name], int(hbm), bandwidth, named)


# Google's pages: v5e 197 TFLOP/s bf16, 16 GB HBM2 at 819 GB/s, ICI 400 GB/s both ways; v6e
# (Trillium) 918 TFLOP/s, 32 GB at 1638 GB/s, ICI 800 GB/s both ways; v5p 459 TFLOP/s, 95 GB
# at 2765 GB/s, ICI 4800 Gbps (600 GB/s, taken as both ways as the others state theirs). The
# slices are those libtpu describes on a CPU (v5e:2x2, 2x4, 4x4; v6e:2x2, 2x4; v5p:2x2x1, 2x2x2).
CHIPS = {
    "h100": gpu("h100"),
    "h200": gpu("h200"),
    "v5e": tpu("v5e", 197e12, 16e9, 819e9, 400e9, ((4, "2x2"), (8, "2x4"), (16, "4x4"))),
    "v6e": tpu("v6e", 918e12, 32e9, 1638e9, 800e9, ((4, "2x2"), (8, "2x4"))),
    "v5p": tpu("v5p", 459e12, 95e9, 2765e9, 600e9, ((4, "2x2x1"), (8, "2x2x2"))),
}
TPU_TARGETS = tuple(name for name, chip in CHIPS.items() if chip.is_tpu)


def tpu_slice(target: str, chips: int) -> str:
    """The libtpu topology of the smallest ``target`` slice with at least ``chips`` chips (a
    plan's mesh takes the first ``chips`` of them); ValueError naming --devices past the
    largest."""
    slices = CHIPS[target].slices
    for size, name in slices:
        if chips <= size:
            return name
    largest = slices[-1][0]
    raise ValueError(
        f"--devices {chips}: the largest {target} slice planned here has {largest} chips "
        f"({slices[-1][1]}); give --devices <= {largest}"
    )
