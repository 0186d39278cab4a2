"""``ppojax doctor``: what this machine's device makes of ppojax's kernels.

It prints the device, the versions and the verdict file it reads
(``ppojax.runtime.kernel_check``), then for each platform default a run here would use: whether
the kernel compiled, its max error against its tolerance, the median seconds of its plain form
and of the kernel (paired, at a run's size) and the verdict, which it stores for later runs.
A kernel more than 10% slower than its plain form is dropped too. Stored verdicts are reused
unless ``--recheck``; ``--json FILE`` writes the table. On a machine without an accelerator
it says so, and ``--interpret`` runs every check on the CPU, Pallas's kernels in its
interpreter, to show what a check costs (nothing is stored: no device is judged).

Exit 0 when every form a run would use works here (a dropped kernel's plain form takes its
place), 1 when a plain form itself fails, 2 for bad flags.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ppojax.cli.values import Parser


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="ppojax doctor",
        description="Check ppojax's kernels on this machine's GPU or TPU: each compiled and "
        "run beside its plain form, its error against its tolerance, both timed; a kernel "
        "that fails (or is >10% slower) is dropped for its plain form in later runs.",
    )
    parser.add_argument(
        "--recheck", action="store_true", help="check again, ignoring the stored verdicts"
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the table as JSON")
    parser.add_argument(
        "--interpret",
        action="store_true",
        help="run every check on the CPU, Pallas's kernels in its interpreter (not timed, "
        "not stored): what the checks cost, on a machine without an accelerator",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_json_path(args.json)
        with warnings.catch_warnings():
            warnings.showwarning = show_warning
            return run(args)
    except (ValueError, OSError) as error:
        sys.stderr.write(f"ppojax doctor: error: {error}\n")
        return 2


def show_warning(message: Any, category: type[Warning], *args: Any, **kwargs: Any) -> None:
    """A warning (the verdicts kept in memory only, a library's) as one line on stderr."""
    sys.stderr.write(f"ppojax doctor: warning: {message}\n")


def check_json_path(path: Path | None) -> None:
    """--json's file: its folder must exist and it must not be a folder (checked before the
    checks run, which take seconds to minutes)."""
    if path is None:
        return
    if path.is_dir():
        raise ValueError(f"--json {path} is a folder; give a file name such as {path}/doctor.json")
    if not path.parent.is_dir():
        raise ValueError(
            f"--json {path}: folder {path.parent} does not exist; make it first or give "
            "another path"
        )


def run(args: argparse.Namespace) -> int:
    import jax

    from ppojax.runtime import kernel_check, kernels

    kernel_check.forget()  # what the file holds, not what this process checked before
    device = kernel_check.accelerator()
    found = kernel_check.versions()
    path = kernel_check.verdict_file()
    _, state = kernel_check.read_store(path)
    plain_only, _ = kernels.switches()
    report: dict[str, Any] = {
        "backend": jax.default_backend(),
        "device": None if device is None else device.kind,
        "platform": None if device is None else device.platform,
        **found,
        "verdict_file": str(path),
        "verdict_file_state": state,
        "kernels": [],
    }
    print(f"device: {describe(device, jax)}")
    print(f"versions: jax {found['jax']}, jaxlib {found['jaxlib']}, ppojax {found['ppojax']}")
    print(f"verdicts: {path} ({state})")
    if device is None and not args.interpret:
        print(
            "no accelerator: runs here use the plain forms and check no kernel. "
            "`ppojax doctor --interpret` runs the checks in Pallas's interpreter on this CPU."
        )
        write_json(args.json, report)
        return 0
    if args.interpret:
        names = kernels.PLATFORM_DEFAULTS
        judged = kernel_check.Accelerator("interpret", "cpu (Pallas interpreter)")
        print("checks on the CPU, Pallas's kernels interpreted: not timed, not stored")
    else:
        names = kernels.CUDA_DEFAULTS if device.platform == "cuda" else kernels.TPU_DEFAULTS
        judged = device
    began = time.perf_counter()
    rows = []
    with cpu_device(args.interpret, jax):
        for name in names:
            if name in plain_only:
                rows.append(forced_row(name))
                continue
            probe = kernel_check.probe_for(name)
            for dtype in probe.dtypes:
                verdict = kernel_check.verdict(
                    name,
                    dtype,
                    judged,
                    recheck=args.recheck or args.interpret,
                    timing=not args.interpret,
                    store=not args.interpret,
                )
                rows.append(verdict_row(verdict))
    seconds = time.perf_counter() - began
    report["kernels"] = rows
    report["seconds"] = round(seconds, 2)
    print_table(rows)
    print(f"checks took {seconds:.1f} s")
    write_json(args.json, report)
    failing = [row["kernel"] for row in rows if not row["plain_works"]]
    if failing:
        print(f"the plain form of {', '.join(failing)} fails here too: a run would fail")
        return 1
    return 0


def describe(device: Any, jax: Any) -> str:
    if device is None:
        return f"no accelerator (JAX's default backend is {jax.default_backend()})"
    return f"{device.kind} ({device.platform}) x {jax.device_count()}"


class cpu_device:
    """JAX's CPU as the default device inside, where ``interpret`` asks for it."""

    def __init__(self, interpret: bool, jax: Any) -> None:
        self.context = jax.default_device(jax.devices("cpu")[0]) if interpret else None

    def __enter__(self) -> None:
        if self.context is not None:
            self.context.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self.context is not None:
            self.context.__exit__(*exc)


def forced_row(name: str) -> dict[str, Any]:
    return {
        "kernel": name,
        "dtype": "-",
        "compiled": None,
        "max_error": None,
        "tolerance": None,
        "plain_s": None,
        "kernel_s": None,
        "works": False,
        "plain_works": True,
        "verdict": "plain form (PPOJAX_PLAIN_KERNELS)",
        "source": "switch",
    }


def verdict_row(verdict: Any) -> dict[str, Any]:
    return {
        "kernel": verdict.kernel,
        "dtype": verdict.dtype,
        "compiled": verdict.compiled,
        "max_error": verdict.max_error,
        "tolerance": verdict.tolerance,
        "plain_s": verdict.plain_s,
        "kernel_s": verdict.kernel_s,
        "works": verdict.works,
        "plain_works": verdict.plain_works,
        "verdict": "kept" if verdict.works else f"dropped: {verdict.reason}",
        "source": verdict.source,
        "check_s": round(verdict.seconds, 2),
    }


def _number(value: float | None, scale: float = 1.0, digits: str = ".3g") -> str:
    return "-" if value is None else format(value * scale, digits)


def print_table(rows: list[dict[str, Any]]) -> None:
    header = ("kernel", "dtype", "compiled", "error/tolerance (ulps)", "plain ms", "kernel ms")
    lines = [header]
    for row in rows:
        compiled = {True: "yes", False: "no", None: "-"}[row["compiled"]]
        error = f"{_number(row['max_error'])} / {_number(row['tolerance'], digits='g')}"
        lines.append(
            (
                row["kernel"],
                row["dtype"],
                compiled,
                error,
                _number(row["plain_s"], 1e3),
                _number(row["kernel_s"], 1e3),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line, row in zip(lines, [None, *rows], strict=True):
        text = "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True))
        if row is None:
            print(f"{text}  verdict")
        else:
            stored = " (stored)" if row["source"] == "stored" else ""
            print(f"{text}  {row['verdict']}{stored}")


def write_json(path: Path | None, report: dict[str, Any]) -> None:
    if path is None:
        return
    path.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"wrote {path}")
