"""``plan``: what a post-training step needs per device on a target, read from its compiled
program (``ppojax.plan.planner`` builds and compiles it from shapes), and whether it fits.

    p = plan("qwen2.5-0.5b", StepShape("grpo", prompts=8), "h100", devices=1)
    p.memory.peak, p.fits, p.largest_prompts   # bytes per device, the verdict, the search
    print(p.report())

Per device: the bytes of each part of the state (``bytes_per_device`` of its layout) and
XLA's ``memory_analysis()`` of the program (arguments, outputs, temporaries); the peak is
arguments + outputs - aliased + temporaries, what XLA's buffer assignment holds at once. The
launches and the bytes they move come from the program's HLO (``ppojax.runtime.launches``).
The FLOPs are counted from the model's shape (``step_flops``; XLA's cost analysis is empty
for a deviceless program), and the time is an ESTIMATE: the larger of FLOPs at the device's
dense peak and bytes at its memory bandwidth, a bound no kernel schedule beats.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ppojax.plan.estimate import Decoding, Estimate, decoding, estimate
from ppojax.plan.planner import (
    PARTS,
    RL_ALGORITHMS,
    PlanError,
    StepShape,
    check_step,
    compile_program,
    program,
    prompt_unit,
    target_mesh,
)
from ppojax.plan.published import throughput_for
from ppojax.plan.targets import CHIPS
from ppojax.rlhf.core.sharding import bytes_per_device
from ppojax.rlhf.models.config import DecoderConfig
from ppojax.rlhf.models.shapes import model_config
from ppojax.runtime import kernels
from ppojax.runtime.memory import FRACTION_VARIABLE, memory_fraction

# what a decoded token's collectives are in each sampling layout (core.sharding)
SAMPLE_LAYOUT_TEXT = {
    "replicated": "replicated sampling copy: each device decodes its own rows",
    "tensor": "tensor-parallel sampling copy: an all-reduce of activations a layer",
    "fsdp": "sampling under the training layout: the weights gathered again every token",
}
MAX_PROMPTS = 1 << 16  # where the search for the largest step stops doubling
GIB = 1024**3
# libtpu checks a program's memory against the chip's HBM as it compiles and refuses one over
# it, in one of two messages (G: GiB); the plan of such a step is "does not fit", not a crash
TPU_REFUSALS = (
    re.compile(r"HLO temporaries \((?P<temporaries>[\d.]+)G\) exceeds available HBM"),
    re.compile(r"Ran out of memory in memory space hbm\. Used (?P<used>[\d.]+)G of"),
)


@dataclasses.dataclass(frozen=True)
class Memory:
    """Bytes per device. The state's parts (PARTS); ``inputs``: the rest of the arguments
    (the batch, a key, scalars); then XLA's ``temporaries``, ``outputs`` and ``aliased``
    (outputs written into arguments); ``peak`` = arguments + outputs - aliased + temporaries."""

    parameters: int
    reference: int
    critic: int
    optimizer: int
    inputs: int
    temporaries: int
    outputs: int
    aliased: int
    peak: int


@dataclasses.dataclass(frozen=True)
class Loop:
    """One loop of the step's program at its top level (sampling's decode steps, the epochs):
    its trips and, over all of them, its launches and the bytes they move, per device."""

    trips: int | None
    launches: int
    bytes: int
    collective_bytes: int = 0  # of ``bytes``, what its collectives move


@dataclasses.dataclass(frozen=True)
class Checked:
    """A lever compiled: the flags it adds, the ``peak`` per device it planned and whether
    that fits (``error``: why it could not be planned, peak 0)."""

    lever: str
    peak: int
    fits: bool
    error: str = ""


@dataclasses.dataclass(frozen=True)
class Plan:
    """A step sized on a target: ``memory`` per device, ``launches`` and ``bytes_moved`` per
    step (per device) and the ``loops`` that hold them, ``estimate`` (None on "cpu"), whether
    it ``fits`` in ``device_memory`` x (1 - ``headroom``), the ``largest_prompts`` per step
    that fit (None when not searched; 0 when none does) and the first compile's seconds."""

    model: str
    step: StepShape
    target: str
    devices: int
    memory: Memory
    launches: int
    bytes_moved: int
    loops: tuple[Loop, ...]
    estimate: Estimate | None
    device_memory: int
    headroom: float
    compile_seconds: float
    largest_prompts: int | None = None
    checked: tuple[Checked, ...] = ()  # the levers, each compiled (``search`` on a misfit)
    decoding: Decoding | None = None  # sampling's cost per decoded token (RL steps)
    refused: str = ""  # libtpu's refusal of a program over the chip's HBM (``refusal``)

    @property
    def usable(self) -> int:
        return int(self.device_memory * (1.0 - self.headroom))

    @property
    def fits(self) -> bool:
        return self.memory.peak <= self.usable

    @property
    def loop_peak(self) -> int:
        """The peak inside ``ppojax.runs.loop``, which the model-folder commands train
        through: the step's, since that loop donates each chunk's state to the next
        (``train_loop(..., donate=True)``) as the planned step donates its state."""
        return self.memory.peak

    def to_dict(self) -> dict[str, Any]:
        found = dataclasses.asdict(self)
        found["step"]["lora_targets"] = list(self.step.lora_targets)
        return {
            **found,
            "fits": self.fits,
            "usable": self.usable,
            "loop_peak": self.loop_peak,
            "loop_fits": self.loop_peak <= self.usable,
        }

    def report(self) -> str:
        return report(self)


def measure(
    config: DecoderConfig, step: StepShape, target: str, devices: int
) -> tuple[Memory, int, int, tuple[Loop, ...], float, int, str]:
    """Memory, launches, bytes moved and top-level loops per device of ``step``'s compiled
    program, the compile's seconds, the bytes its collectives move and, where libtpu refused
    to compile a program over the chip's HBM, its message (then the memory is what it names
    and nothing is counted); cached: a search asks again for the same step, and a program
    traced under other kernels switches is another."""
    return measured(config, step, target, devices, kernels.switches())


@functools.lru_cache(maxsize=64)
def measured(
    config: DecoderConfig, step: StepShape, target: str, devices: int, switches: tuple
) -> tuple[Memory, int, int, tuple[Loop, ...], float, int, str]:
    """``measure``'s compile, cached by its arguments and the kernels ``switches``."""
    from ppojax.runtime import launches

    check_step(step, config, devices)
    mesh = target_mesh(target, devices)
    try:
        prog = program(config, step, mesh)
    except ValueError as error:  # a tensor no axis of which the device count divides
        raise PlanError(f"--devices {devices}: {error}") from None
    started = time.perf_counter()
    held = {part: bytes_per_device(prog.held.get(part, {}), mesh) for part in PARTS}
    try:
        compiled = compile_program(prog, target, mesh)
    except Exception as error:  # noqa: BLE001 (libtpu's refusal has no type of its own)
        memory = refused_memory(error, held) if target in CHIPS else None
        if memory is None or not CHIPS[target].is_tpu:
            raise
        message = str(error).strip().splitlines()[0][:300]
        return memory, 0, 0, (), time.perf_counter() - started, 0, message
    seconds = time.perf_counter() - started
    analysis = compiled.memory_analysis()
    arguments, outputs = analysis.argument_size_in_bytes, analysis.output_size_in_bytes
    aliased, temporaries = analysis.alias_size_in_bytes, analysis.temp_size_in_bytes
    memory = Memory(
        **held,
        inputs=arguments - sum(held.values()),
        temporaries=temporaries,
        outputs=outputs,
        aliased=aliased,
        peak=arguments + outputs - aliased + temporaries,
    )
    # TPU HLO records no loop trips: they are read from the loops' conditions
    tpu = target in CHIPS and CHIPS[target].is_tpu
    counted = launches.count(compiled.as_text(), trips_from_condition=tpu)
    loops = tuple(
        Loop(loop.trips, loop.total_launches(), loop.total_bytes(), loop.collective_bytes())
        for loop in counted.loops
    )
    launched, moved = counted.total_launches(), counted.total_bytes()
    return memory, launched, moved, loops, seconds, counted.collective_bytes(), ""


def refused_memory(error: Exception, held: dict[str, int]) -> Memory | None:
    """The memory libtpu named in refusing to compile a program over the chip's HBM: the
    temporaries it needs (the peak then at least the state's parts and those), or the whole
    program's use; None for an error that is no such refusal."""
    text = str(error)
    for pattern in TPU_REFUSALS:
        found = pattern.search(text)
        if found is None:
            continue
        named = {name: int(float(value) * GIB) for name, value in found.groupdict().items()}
        state = sum(held.values())
        temporaries = named.get("temporaries", max(named.get("used", 0) - state, 0))
        return Memory(
            **held, inputs=0, temporaries=temporaries, outputs=0, aliased=0,
            peak=state + temporaries,
        )  # fmt: skip
    return None


def device_memory_of(target: str) -> int:
    """The target's memory in bytes: its spec's ``device_memory_size``; the host's RAM for
    "cpu"."""
    if target == "cpu":
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if CHIPS[target].hbm_bytes is not None:  # a TPU's published HBM
        return CHIPS[target].hbm_bytes
    from ppojax.runtime import deviceless

    return int(deviceless.spec_number(target, "device_memory_size"))


def is_number(value: Any) -> bool:
    """Whether ``value`` is a finite int or float (bools excluded)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def largest_fitting(fits: Any, start: int, unit: int, limit: int = MAX_PROMPTS) -> int:
    """The largest multiple of ``unit`` up to ``limit`` for which ``fits`` holds, ``fits``
    being monotone (true up to some size, false above): doubling from ``start`` (a multiple
    of ``unit``), then bisection. 0 when ``unit`` itself does not fit."""
    low, high = 0, None  # in units: low fits (0: nothing known to), high does not
    count = max(start // unit, 1)
    while count * unit <= limit:
        if not fits(count * unit):
            high = count
            break
        low, count = count, count * 2
    if high is None:
        high = limit // unit + 1
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle * unit) else (low, middle)
    return low * unit


def plan(
    model: str | Path | DecoderConfig,
    step: StepShape | None = None,
    target: str = "h100",
    devices: int = 1,
    *,
    device_memory: int | None = None,
    headroom: float | None = None,
    search: bool = False,
    max_prompts: int = MAX_PROMPTS,
) -> Plan:
    """Size ``step`` (default: GRPO, 8 prompts x 8 responses of 512 + 1024 tokens, bf16) for
    ``model`` (a config.json, a folder, a built-in shape name or a ``DecoderConfig``) on
    ``devices`` of ``target`` ("h100", "h200", "cpu") in a (data=1, fsdp=devices) mesh.
    ``device_memory``: bytes per device (default: the target's spec, the host's RAM on cpu);
    ``headroom``: the share of it kept free (default: 1 - ``memory_fraction()``, so that the
    plan judges against the memory a training command's process preallocates); ``search``:
    also find the largest prompts per step that fit (one compile a probe)."""
    step = StepShape() if step is None else step
    if not isinstance(devices, int) or isinstance(devices, bool) or devices < 1:
        raise PlanError(f"--devices must be an int >= 1, got {devices!r}")
    if headroom is None:
        headroom = round(1.0 - memory_fraction(), 6)  # 0.1, not 0.09999999999999998
    if not is_number(headroom) or not 0.0 <= headroom < 1.0:
        raise PlanError(
            f"--headroom must be in [0, 1) (the share of memory kept free), got {headroom!r}"
        )
    if device_memory is not None and not (is_number(device_memory) and 0 < device_memory):
        raise PlanError(f"device_memory must be a number of bytes > 0, got {device_memory!r}")
    config = model if isinstance(model, DecoderConfig) else model_config(model)
    name = config.model_type if isinstance(model, DecoderConfig) else str(model)

    def capacity() -> int:  # after a first compile, which names an unknown target
        return device_memory_of(target) if device_memory is None else int(device_memory)

    step = with_sample_layout(
        config, step, target, devices, lambda: int(capacity() * (1.0 - headroom))
    )
    measured_step = measure(config, step, target, devices)
    memory, launched, moved, loops, seconds, collective, refused = measured_step
    found = Plan(
        name,
        step,
        target,
        devices,
        memory,
        launched,
        moved,
        loops,
        None if refused else estimate(config, step, target, devices, moved, launched, collective),
        capacity(),
        headroom,
        seconds,
        refused=refused,
    )
    if not refused:
        found = dataclasses.replace(found, decoding=decoding(config, step, devices, loops))
    if not search:
        return found

    def fits(prompts: int) -> bool:
        sized = dataclasses.replace(step, prompts=prompts)
        return measure(config, sized, target, devices)[0].peak <= found.usable

    unit = prompt_unit(step, devices)
    start = step.prompts - step.prompts % unit or unit
    largest = largest_fitting(fits, start, unit, max_prompts)
    found = dataclasses.replace(found, largest_prompts=largest)
    if found.fits:
        return found
    checked = []
    for text, changed, more in lever_steps(found):
        try:
            peak = measure(config, changed, target, more)[0].peak
        except PlanError as error:  # e.g. more devices than a "cpu" plan's process has
            checked.append(Checked(text, 0, False, str(error)))
            continue
        checked.append(Checked(text, peak, peak <= found.usable))
    return dataclasses.replace(found, checked=tuple(checked))


def with_sample_layout(
    config: DecoderConfig, step: StepShape, target: str, devices: int, usable: Callable[[], int]
) -> StepShape:
    """``step`` with its "auto" sampling layout chosen by compiling: "replicated" (the whole
    compute copy on every device, no collective a decoded token) where its peak fits in
    ``usable()`` bytes or on one device, else "tensor" where that peaks lower. An RL step's
    explicit layout, and any other step, as given."""
    if step.algorithm not in RL_ALGORITHMS or step.sample_layout != "auto":
        return step
    replicated = dataclasses.replace(step, sample_layout="replicated")
    if devices == 1 or measure(config, replicated, target, devices)[0].peak <= usable():
        return replicated
    tensor = dataclasses.replace(step, sample_layout="tensor")
    peak = measure(config, tensor, target, devices)[0].peak  # the measures are cached
    return tensor if peak < measure(config, replicated, target, devices)[0].peak else replicated


def size_text(size: int) -> str:
    """Bytes in GiB, or in MiB or KiB below one of those."""
    for unit, name in ((GIB, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if size >= unit:
            return f"{size / unit:9.3f} {name}"
    return f"{size:9d} B"


def report(p: Plan) -> str:
    """The plan as text: the step, bytes per device by part, launches, the estimate, the
    verdict."""
    s, m = p.step, p.memory
    plural = "s" if s.group_size > 1 else ""
    group = f" x {s.group_size} response{plural}" if s.algorithm in RL_ALGORITHMS else ""
    lora = f", LoRA r{s.lora_rank}" if s.lora_rank else ", full fine-tuning"
    if s.dtype != "float32":
        lora += ", float32 master weights" if s.master_weights else f", {s.dtype}-only state"
    lines = [
        f"{p.model}: {s.algorithm}, {s.prompts} prompts{group}, {s.prompt_len} + "
        f"{s.response_len} tokens, {s.dtype}{lora}",
        f"on {p.devices} x {p.target} (mesh data=1 x fsdp={p.devices}), "
        + (f"sampling {s.sample_layout}, " if s.algorithm in RL_ALGORITHMS else "")
        + ("refused by libtpu after " if p.refused else "compiled in ")
        + f"{p.compile_seconds:.1f} s",
        "per device:",
    ]
    for name in (*PARTS, "inputs", "temporaries", "outputs"):
        lines.append(f"  {name:<12} {size_text(getattr(m, name))}")
    if m.aliased:
        lines.append(f"  {'aliased':<12} -{size_text(m.aliased)}")
    lines.append(f"  {'peak':<12} {size_text(m.peak)}")
    if p.refused:
        lines.append(
            f"libtpu refused to compile it ({p.refused}): the peak above is at least the "
            "state and the temporaries it named; nothing else was counted"
        )
    else:
        lines.append(
            f"launches per step: {p.launches}, bytes they move: {size_text(p.bytes_moved).strip()}"
        )
    for loop in p.loops:
        lines.append(
            f"  in a loop of {loop.trips} trips: {loop.launches} launches, "
            f"{size_text(loop.bytes).strip()}"
        )
    if p.decoding is not None:
        d = p.decoding
        lines.append(
            f"  decoding, per token: {d.launches:,.0f} launches ({d.launches_per_layer:.1f} a "
            f"layer), {size_text(int(d.bytes)).strip()}: {d.over_minimum:.2f}x the minimum "
            f"{size_text(int(d.minimum)).strip()} (the weights and the KV cache read once; "
            f"{counted_from(p.target)})"
        )
        if p.devices > 1:
            lines.append(
                f"  collectives per decoded token: {size_text(int(d.collective_bytes)).strip()} "
                f"({SAMPLE_LAYOUT_TEXT[s.sample_layout]})"
            )
    if p.estimate is not None:
        lines += estimate_lines(p, p.estimate)
    verdict = "fits" if p.fits else "does NOT fit"
    at_least = "at least " if p.refused else ""
    lines.append(
        f"verdict: {verdict}: peak {at_least}{size_text(m.peak).strip()} of "
        f"{size_text(p.usable).strip()} usable ({budget_text(p)})"
    )
    if p.largest_prompts is not None:
        lines.append(f"largest prompts per step that fit: {p.largest_prompts}")
    if not p.fits and p.checked:
        lines.append("to make it fit, add one of (each compiled, --search):")
        lines += [f"  {checked_text(c)}" for c in p.checked]
    elif not p.fits:
        lines.append("to make it fit, try adding (--search compiles each):")
        lines += [f"  {lever}" for lever in levers(p)]
    return "\n".join(lines)


def counted_from(target: str) -> str:
    """Whose program the counts read, and how far a device's own may differ."""
    if target in CHIPS and CHIPS[target].is_tpu:
        return "counted from libtpu's program, compiled without a TPU"
    return "counted without autotuning, a GPU's program may differ"


def estimate_lines(p: Plan, e: Estimate) -> list[str]:
    """The estimate's parts, the tokens per second per device, and beside them what other
    libraries publish for the same model, step and target (``ppojax.plan.published``)."""
    chip = CHIPS[p.target]
    launch = (
        f"launches x {chip.launch_seconds * 1e6:.0f} us -> {e.launches:.3g} s"
        if chip.launch_seconds
        else "launches not costed (a TPU runs the step as one program)"
    )
    lines = [
        f"step time ESTIMATE: {e.step:.3g} s, the largest of compute {e.flops / 1e12:.4g} "
        f"TFLOP -> {e.compute:.3g} s, HBM {e.memory:.3g} s and {launch}, plus collectives at "
        f"{chip.link_bandwidth / 1e9:.0f} GB/s -> {e.collectives:.3g} s (figures: {chip.source})",
        f"  {e.tokens_per_second:,.0f} response tokens/s per device at that time",
    ]
    for t in throughput_for(p.model, p.step.algorithm, p.target):
        same = "same count" if t.devices == p.devices else f"not {p.devices}"
        lines.append(
            f"  published: {t.library}, {t.algorithm} on {t.devices} x {t.target} ({same}): "
            f"{t.tokens_per_second:,.0f} tokens/s per GPU, {t.setting} ({t.source})"
        )
    return lines


def checked_text(c: Checked) -> str:
    """A compiled lever: its flags, then its peak and verdict or why it was not planned."""
    if c.error:
        return f"{c.lever}: not planned here: {c.error}"
    verdict = "fits" if c.fits else "does NOT fit"
    return f"{c.lever}: {verdict}, peak {size_text(c.peak).strip()}"


def budget_text(p: Plan) -> str:
    """The memory the verdict judges against, and on a GPU whether it is the share a training
    command's process preallocates (``XLA_PYTHON_CLIENT_MEM_FRACTION``)."""
    text = f"{size_text(p.device_memory).strip()} less {p.headroom:.0%} headroom"
    if p.target == "cpu" or CHIPS[p.target].is_tpu:  # the fraction is the GPU allocator's
        return text
    fraction = memory_fraction()
    if math.isclose(1.0 - p.headroom, fraction):
        return f"{text}: the {fraction:g} a training command preallocates, {FRACTION_VARIABLE}"
    return (
        f"{text}; a training command preallocates {fraction:g} ({FRACTION_VARIABLE}), which "
        f"--headroom {1.0 - fraction:.3g} judges against"
    )


def levers(p: Plan) -> list[str]:
    """What would shrink a step that does not fit, each as the flags to add to ``ppojax plan``
    (and to the command it plans) and why: rematerialized layers, fewer prompts, LoRA, more
    devices. ``plan(..., search=True)`` compiles each (``Plan.checked``)."""
    return [f"{text}  ({why})" for text, why, _, _ in lever_options(p)]


def lever_steps(p: Plan) -> list[tuple[str, StepShape, int]]:
    """Each lever of ``levers`` as the flags, the step and the device count it plans."""
    return [(f"{text}  ({why})", step, devices) for text, why, step, devices in lever_options(p)]


def lever_options(p: Plan) -> list[tuple[str, str, StepShape, int]]:
    """(flags, why, step, devices) of each lever that is not on already."""
    s, found = p.step, []
    rl = s.algorithm in RL_ALGORITHMS
    if rl and not s.remat_layers:
        why = "recompute each layer in the backward pass, not keep it"
        found.append(("--remat-layers", why, dataclasses.replace(s, remat_layers=True), p.devices))
    unit = prompt_unit(s, p.devices)
    if p.largest_prompts:
        fewer = dataclasses.replace(s, prompts=p.largest_prompts)
        why = "the largest that fits, searched"
        found.append((f"--prompts {p.largest_prompts}", why, fewer, p.devices))
    elif p.largest_prompts is None and s.prompts // 2 >= unit:
        fewer = s.prompts // 2 // unit * unit
        why = "fewer prompts a step; --search finds the largest"
        found.append((f"--prompts {fewer}", why, dataclasses.replace(s, prompts=fewer), p.devices))
    if rl and not s.lora_rank:
        why = "adapters: no gradients or Adam moments of the weights"
        found.append(("--lora-rank 16", why, dataclasses.replace(s, lora_rank=16), p.devices))
    more = 2 * p.devices
    unit = prompt_unit(s, more)  # the prompts must split over the devices too
    prompts = s.prompts if s.prompts % unit == 0 else max(s.prompts // unit, 1) * unit
    split = "" if prompts == s.prompts else f" --prompts {prompts}"
    chip = CHIPS.get(p.target)
    why = f"the state and the batch split over more {'chips' if chip and chip.is_tpu else 'GPUs'}"
    found.append((f"--devices {more}{split}", why, dataclasses.replace(s, prompts=prompts), more))
    return found
