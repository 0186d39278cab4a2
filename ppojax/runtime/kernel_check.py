"""Kernels that prove themselves on the device before a run relies on them.

A program traced where JAX's default backend is a CUDA GPU or a TPU swaps in that platform's
defaults (``kernels.CUDA_DEFAULTS``, ``kernels.TPU_DEFAULTS``), which were chosen by counting
deviceless compiles. The first time a program traces one of them on a device,
``kernel_works`` checks it there: the kernel's probe (``ppojax.runs.kernel_probes``) builds
small inputs in the program's dtype, and the kernel and its plain form are compiled and run
side by side. The kernel stays only if it compiles, runs and agrees with the plain form (or
with an exact reference) within the probe's tolerance, which is its test's own
(tests/test_kernels.py, tests/test_gae.py, tests/test_distributions.py).

The verdict, the measured error and the tolerance are stored in ``kernel_checks.json`` in
the compile cache's folder (``cache.default_cache_dir``), one entry per device kind, jax and
jaxlib versions, ppojax version, kernel and dtype, so a later run reads it and checks
nothing. The file is written whole to a temporary file and renamed over the old one. A file
that cannot be read (corrupt, truncated, not ppojax's, another format) or holds no entry of
this device and these versions means a check, never a crash; a folder that cannot be written
keeps the verdicts in this process's memory, said in one line.

A kernel that fails is replaced by its plain form in that program and every later one, with
one warning line (``KernelCheckWarning``) naming the kernel, the device, the reason and how
to check again (``ppojax doctor --recheck``). ``ppojax doctor`` also times both forms, paired,
and drops a kernel slower than its plain form by more than ``SLOWER_THAN_PLAIN``.

Deviceless compiles (``kernels.lowering_for_cuda``, ``lowering_for_tpu``) and CPU programs
never check: they take the kernels they took before, and every CPU result stays bit for bit.
``fake_accelerator`` stands a device in for tests, with probes of their own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.metadata
import json
import math
import os
import statistics
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ppojax.runtime.cache import default_cache_dir

FILE_NAME = "kernel_checks.json"
FORMAT = "ppojax kernel checks"
FORMAT_VERSION = 1
# a kernel more than 10% slower than its plain form on the device is dropped (``ppojax
# doctor``, which times them): the bar a stand-in has to clear to be kept at all
SLOWER_THAN_PLAIN = 1.10
EPS32 = float(np.finfo(np.float32).eps)


class KernelCheckWarning(UserWarning):
    """A kernel dropped for its plain form on this device, or verdicts kept in memory only."""


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """The device a program is traced for: its platform ("cuda" or "tpu") and its kind
    (``jax.Device.device_kind``, e.g. "NVIDIA H100 80GB HBM3")."""

    platform: str
    kind: str


@dataclasses.dataclass(frozen=True)
class Trial:
    """What a probe runs: ``plain`` and ``kernel`` on ``args`` (the check traces ``plain``
    with every platform default off, ``kernel`` with its own kernel chosen, so one function
    may serve as both), and the tolerance: the kernel's outputs lie within
    ``ulps * eps32 * (scale + |expected|)`` of the expected ones (``|expected|`` left out
    where ``relative`` is False; ``scale`` may be an array). Integer and boolean outputs must
    match exactly. ``reference``, if given, computes the expected outputs from ``args``
    eagerly (an exact float64 sum, a wider dtype); else they are the plain form's."""

    plain: Callable[..., Any]
    kernel: Callable[..., Any]
    args: tuple
    ulps: float
    scale: Any = 1.0
    relative: bool = True
    reference: Callable[..., Any] | None = None


@dataclasses.dataclass(frozen=True)
class Probe:
    """How to check one kernel: ``build(dtype, large)`` gives its Trial in one of ``dtypes``
    (the first where the program's dtype is not among them); ``large`` asks for inputs of a
    run's size, for timing."""

    build: Callable[[str, bool], Trial]
    dtypes: tuple[str, ...] = ("float32",)

    def dtype_for(self, dtype: str) -> str:
        return dtype if dtype in self.dtypes else self.dtypes[0]


@dataclasses.dataclass
class Verdict:
    """One kernel's check on one device: whether it stays (``works``) and why; whether it
    compiled (None where its probe failed first), its max error and the tolerance in
    float32 ulps (``Trial``), the median seconds of the plain form and the kernel where timed,
    whether the plain form itself compiled and ran, and the check's own seconds."""

    kernel: str
    dtype: str
    device: str
    platform: str
    works: bool
    reason: str
    compiled: bool | None = None
    max_error: float | None = None
    tolerance: float | None = None
    plain_s: float | None = None
    kernel_s: float | None = None
    plain_works: bool = True
    seconds: float = 0.0
    source: str = "checked"  # "checked" now, or "stored" (read from the file)

    def entry(self) -> dict[str, Any]:
        fields = dataclasses.asdict(self)
        fields.pop("source")
        return {**fields, **versions()}


@functools.cache
def _installed_versions() -> tuple[tuple[str, str], ...]:
    try:
        ours = importlib.metadata.version("ppojax")
    except importlib.metadata.PackageNotFoundError:  # a checkout on sys.path, not installed
        ours = "not installed"
    jaxlib = importlib.metadata.version("jaxlib")
    return (("jax", jax.__version__), ("jaxlib", jaxlib), ("ppojax", ours))


def versions() -> dict[str, str]:
    """The versions a verdict holds for: jax, jaxlib and ppojax (as installed), read once."""
    return dict(_installed_versions())


def entry_key(device: str, kernel: str, dtype: str) -> str:
    found = versions()
    return (
        f"{device} | jax {found['jax']} | jaxlib {found['jaxlib']} | "
        f"ppojax {found['ppojax']} | {kernel}[{dtype}]"
    )


def verdict_file() -> Path:
    """Where the verdicts are kept: ``kernel_checks.json`` in the compile cache's folder."""
    return default_cache_dir() / FILE_NAME


# This process's state: verdicts by key, the warnings given, whether the file could not be
# written (then every verdict stays here), the fake device and its probes of a test
_verdicts: dict[str, Verdict] = {}
_warned: set[str] = set()
_memory_only: dict[str, bool] = {"said": False}
_fake: dict[str, Any] = {}
_lock = threading.Lock()


@contextlib.contextmanager
def fake_accelerator(
    probes: Mapping[str, Probe], kind: str = "Fake GPU", platform: str = "cuda"
) -> Iterator[None]:
    """Inside, programs are traced as for a ``platform`` device of ``kind`` (checked,
    their platform's defaults traced in), and ``probes`` check its kernels: a CPU test of the
    check. The programs still run on the CPU, as what the CPU runs of them."""
    before = dict(_fake)
    _fake.update(accelerator=Accelerator(platform, kind), probes=dict(probes))
    try:
        yield
    finally:
        _fake.clear()
        _fake.update(before)


def faked_platform() -> str | None:
    """The platform ``fake_accelerator`` stands in for, or None outside it."""
    fake = _fake.get("accelerator")
    return None if fake is None else fake.platform


def forget() -> None:
    """Forget this process's verdicts, warnings and memory-only notice (tests, ``doctor``)."""
    _verdicts.clear()
    _warned.clear()
    _memory_only["said"] = False


def accelerator() -> Accelerator | None:
    """The CUDA GPU or TPU that programs traced now run on: JAX's default backend (or the
    fake device inside ``fake_accelerator``); None on a CPU or a ROCm GPU (whose programs
    take none of the defaults)."""
    if "accelerator" in _fake:
        return _fake["accelerator"]
    backend = jax.default_backend()
    if backend not in ("gpu", "tpu"):
        return None
    device = jax.devices()[0]
    if backend == "gpu":
        version = getattr(device.client, "platform_version", "").lower()
        if "rocm" in version or "hip" in version:
            return None
        return Accelerator("cuda", device.device_kind)
    return Accelerator("tpu", device.device_kind)


# The probes build inputs with the kernels' own modules (env PPO's, the LM's), which sit
# above this one: they are imported by name when a device first asks, and by then the
# kernel's module is loaded anyway (its program is calling it).
PROBES_MODULE = "ppojax.runs.kernel_probes"


def probe_for(name: str) -> Probe:
    """The probe of kernel ``name``: the fake device's, or PROBES_MODULE's."""
    if "probes" in _fake:
        return _fake["probes"][name]
    return importlib.import_module(PROBES_MODULE).PROBES[name]


def program_dtype(args: Any) -> str:
    """The floating dtype a call works in: the narrowest floating dtype among its operands
    (bfloat16 over float32), float32 where there is none."""
    found = {
        str(leaf.dtype)
        for leaf in jax.tree.leaves(args)
        if hasattr(leaf, "dtype") and jax.numpy.issubdtype(leaf.dtype, jax.numpy.floating)
    }
    for dtype in ("bfloat16", "float16"):
        if dtype in found:
            return dtype
    return "float32"


def kernel_works(name: str, args: Any) -> bool:
    """Whether the platform default ``name`` stays in a program traced now on this device
    for a call on ``args``: its stored verdict, or its check run now (once per process and
    device, then stored). A failed kernel is said once per process, in one warning line."""
    device = accelerator()
    if device is None:
        return True
    dtype = probe_for(name).dtype_for(program_dtype(args))
    found = verdict(name, dtype, device)
    if not found.works:
        warn_dropped(found)
    return found.works


def verdict(
    name: str,
    dtype: str,
    device: Accelerator,
    *,
    recheck: bool = False,
    timing: bool = False,
    store: bool = True,
) -> Verdict:
    """Kernel ``name``'s verdict in ``dtype`` on ``device``: this process's, else the
    stored one, else (or with ``recheck``, or with ``timing`` where the stored one kept the
    kernel untimed) a check run now, then stored unless ``store`` is False."""
    key = entry_key(device.kind, name, dtype)
    with _lock:
        if not recheck:
            known = _verdicts.get(key) or read_entry(key)
            # a kept kernel stored untimed (a run's check) is timed when timing is asked
            if known is not None and not (timing and known.works and known.kernel_s is None):
                _verdicts[key] = known
                return known
        found = run_check(name, dtype, device, timing=timing)
        _verdicts[key] = found
        if store:
            write_entry(key, found)
        return found


def warn_dropped(found: Verdict) -> None:
    key = entry_key(found.device, found.kernel, found.dtype)
    if key in _warned:
        return
    _warned.add(key)
    say(
        f"kernel {found.kernel} ({found.dtype}) failed its check on {found.device}: "
        f"{found.reason}; its plain form runs instead. `ppojax doctor --recheck` checks "
        f"again; PPOJAX_PLAIN_KERNELS={found.kernel} keeps the plain form without checking"
    )


def say(line: str) -> None:
    """One warning line: filed under "ppojax" with no source line to show beneath it."""
    warnings.warn_explicit(line, KernelCheckWarning, "ppojax", 0, module="ppojax")


def run_check(name: str, dtype: str, device: Accelerator, *, timing: bool) -> Verdict:
    """Kernel ``name``'s check now, in a thread of its own: inside a program's trace, JAX
    would stage the check's computations into that program instead of running them."""
    found: dict[str, Verdict] = {}

    def check() -> None:
        found["verdict"] = check_here(name, dtype, device, timing=timing)

    worker = threading.Thread(target=check, name=f"ppojax kernel check {name}")
    worker.start()
    worker.join()
    return found["verdict"]


# How a check traces each form of a kernel: ``forms(name)`` gives two context managers, the
# plain form's (every platform default off: no check within a check) and the kernel's (it
# chosen, the others off). ``ppojax.runtime.kernels``, which owns those switches, sets it when
# imported; every program that asks for a check has imported it.
_hooks: dict[str, Callable[[str], tuple[Callable, Callable]]] = {}


def set_forms(forms: Callable[[str], tuple[Callable, Callable]]) -> None:
    _hooks["forms"] = forms


def _compiled(fn: Callable, args: tuple, form: Callable) -> Callable:
    def traced(*args: Any) -> Any:  # a new function a check: traced afresh, in its form
        with form():
            return fn(*args)

    return jax.jit(traced).lower(*args).compile()


def _run(compiled: Callable, args: tuple) -> Any:
    return jax.block_until_ready(compiled(*args))


def _failure(error: BaseException) -> str:
    first = (str(error).strip().splitlines() or [""])[0]
    text = f"{type(error).__name__}: {first}" if first else type(error).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def check_here(name: str, dtype: str, device: Accelerator, *, timing: bool) -> Verdict:
    """Kernel ``name``'s check in this thread: build, compile and run both forms, compare,
    and with ``timing`` time them (``paired_medians``)."""
    began = time.perf_counter()
    result = Verdict(name, dtype, device.kind, device.platform, works=False, reason="")

    def done(works: bool, reason: str) -> Verdict:
        result.works, result.reason = works, reason
        result.seconds = time.perf_counter() - began
        return result

    plain_form, kernel_form = _hooks["forms"](name)
    try:
        trial = probe_for(name).build(dtype, False)
    except Exception as error:  # a probe that cannot build its inputs: keep to the plain form
        return done(False, f"its probe failed ({_failure(error)})")
    result.tolerance = float(trial.ulps)
    try:
        plain = _compiled(trial.plain, trial.args, plain_form)
        plain_out = _run(plain, trial.args)
        with plain_form():
            expected = plain_out if trial.reference is None else trial.reference(*trial.args)
    except Exception as error:
        result.plain_works = False
        return done(False, f"its plain form failed here too ({_failure(error)})")
    try:
        kernel = _compiled(trial.kernel, trial.args, kernel_form)
    except Exception as error:
        result.compiled = False
        return done(False, f"it does not compile ({_failure(error)})")
    result.compiled = True
    try:
        kernel_out = _run(kernel, trial.args)
    except Exception as error:
        return done(False, f"it fails when run ({_failure(error)})")
    result.max_error = ulp_error(kernel_out, expected, trial.scale, trial.relative)
    if not result.max_error <= trial.ulps:
        return done(
            False,
            f"it computes another result (max error {result.max_error:.3g} ulps, "
            f"tolerance {trial.ulps:g})",
        )
    if timing:
        try:
            big = probe_for(name).build(dtype, True)
            plain = _compiled(big.plain, big.args, plain_form)
            kernel = _compiled(big.kernel, big.args, kernel_form)
            result.plain_s, result.kernel_s = paired_medians(
                lambda: _run(plain, big.args), lambda: _run(kernel, big.args)
            )
        except Exception as error:
            return done(False, f"it fails at a run's size ({_failure(error)})")
        if result.kernel_s > SLOWER_THAN_PLAIN * result.plain_s:
            slower = result.kernel_s / result.plain_s - 1.0
            return done(False, f"it is {slower:.0%} slower than its plain form here")
    return done(True, "it agrees with its plain form")


def paired_medians(
    plain: Callable[[], Any],
    kernel: Callable[[], Any],
    pairs: int = 7,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[float, float]:
    """The median seconds of ``plain()`` and ``kernel()`` over ``pairs`` pairs, each pair
    one of each back to back (the first after the other every second pair), after one call
    of each: both see the same state of a shared machine."""
    plain(), kernel()
    times: dict[str, list[float]] = {"plain": [], "kernel": []}
    for index in range(pairs):
        order = [("plain", plain), ("kernel", kernel)]
        for label, call in order if index % 2 == 0 else order[::-1]:
            start = clock()
            call()
            times[label].append(clock() - start)
    return statistics.median(times["plain"]), statistics.median(times["kernel"])


def ulp_error(actual: Any, desired: Any, scale: Any = 1.0, relative: bool = True) -> float:
    """The largest ``|actual - desired| / (eps32 * (scale + |desired|))`` over two pytrees'
    float leaves (``|desired|`` left out where ``relative`` is False): inf where their
    structures, shapes or NaNs differ, or an integer or boolean leaf differs at all."""
    actual_leaves, actual_tree = jax.tree.flatten(actual)
    desired_leaves, desired_tree = jax.tree.flatten(desired)
    if actual_tree != desired_tree:
        return math.inf
    worst = 0.0
    for have, want in zip(actual_leaves, desired_leaves, strict=True):
        have, want = np.asarray(have), np.asarray(want)
        if have.shape != want.shape:
            return math.inf
        # bfloat16 is no NumPy kind "f" (ml_dtypes'): ask JAX which dtypes are floats
        if not (
            jax.numpy.issubdtype(want.dtype, jax.numpy.inexact)
            and jax.numpy.issubdtype(have.dtype, jax.numpy.inexact)
        ):
            if not np.array_equal(have, want):
                return math.inf
            continue
        have, want = have.astype(np.float64), want.astype(np.float64)
        nan = np.isnan(want)
        if not np.array_equal(nan, np.isnan(have)):
            return math.inf
        have, want = have[~nan], want[~nan]
        same = have == want  # equal infinities too
        if not same.all():
            bound = np.broadcast_to(np.asarray(scale, np.float64), nan.shape)[~nan]
            if relative:
                bound = bound + np.abs(want)
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.abs(have - want)[~same] / (EPS32 * bound[~same])
            worst = max(worst, float(np.nan_to_num(ratio, nan=math.inf).max()))
    return worst


def read_store(path: Path | None = None) -> tuple[dict[str, Any], str]:
    """The stored entries and the file's state: "absent", "read", or why it was passed
    over ("corrupt: ...", "not ppojax's", "format N"): those mean a check, and are
    rewritten whole when a verdict is stored."""
    path = verdict_file() if path is None else path
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}, "absent"
    except (OSError, UnicodeDecodeError) as error:
        return {}, f"unreadable: {_failure(error)}"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        return {}, f"corrupt: {error}"
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return {}, "not ppojax's kernel checks"
    if data.get("version") != FORMAT_VERSION or not isinstance(data.get("entries"), dict):
        return {}, f"format {data.get('version')!r}, not {FORMAT_VERSION}"
    return data["entries"], "read"


_ENTRY_TYPES = {
    "kernel": str,
    "dtype": str,
    "device": str,
    "platform": str,
    "works": bool,
    "reason": str,
}


def read_entry(key: str, path: Path | None = None) -> Verdict | None:
    """The stored verdict of ``key``, or None where there is none or it is malformed or of
    other versions (then the kernel is checked again)."""
    entries, _ = read_store(path)
    entry = entries.get(key)
    if not isinstance(entry, dict) or any(entry.get(k) != v for k, v in versions().items()):
        return None
    if any(not isinstance(entry.get(k), kind) for k, kind in _ENTRY_TYPES.items()):
        return None
    if entry_key(entry["device"], entry["kernel"], entry["dtype"]) != key:
        return None
    fields = {field.name for field in dataclasses.fields(Verdict)} - {"source"}
    try:
        return Verdict(**{k: v for k, v in entry.items() if k in fields}, source="stored")
    except TypeError:
        return None


def write_entry(key: str, found: Verdict, path: Path | None = None) -> bool:
    """Store ``found`` under ``key``, the file rewritten whole through a temporary file
    renamed over it (no reader ever sees half a file). False, said once in a line, where
    the folder cannot be written: the verdicts stay in this process's memory."""
    path = verdict_file() if path is None else path
    entries, _ = read_store(path)
    entries[key] = found.entry()
    data = {"format": FORMAT, "version": FORMAT_VERSION, "entries": entries}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{FILE_NAME}.", dir=path.parent)
        try:
            with os.fdopen(handle, "w") as file:
                json.dump(data, file, indent=1, sort_keys=True)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
    except OSError as error:
        if not _memory_only["said"]:
            _memory_only["said"] = True
            say(
                f"kernel checks kept in memory only: cannot write {path} "
                f"({error.strerror or error}); every new process checks again. Set "
                f"XDG_CACHE_HOME to a writable folder to keep them"
            )
        return False
    return True
