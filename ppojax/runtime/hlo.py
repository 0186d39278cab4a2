"""What a compiled program holds, read from XLA's text of it (``compiled.as_text()``): the
kernels it launches and its size, the numbers a program's per-step overhead and compile time
grow with.

The text is XLA's HLO module after optimization: named computations, one of them ``ENTRY``;
a ``while`` names its ``body`` and ``condition`` computations, a ``call`` its ``to_apply``,
and a ``fusion`` the computation it runs as one kernel.
"""

from __future__ import annotations

import re
from typing import Any

# instructions that launch no kernel of their own
NO_KERNEL = frozenset(
    {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all"}
)


def computations(hlo: str) -> tuple[dict[str, list[str]], str | None]:
    """The module's computations {name: instruction lines} and the name of its entry."""
    found: dict[str, list[str]] = {}
    name, entry = None, None
    for line in hlo.splitlines():
        header = re.match(r"^(ENTRY )?%?([\w.\-]+) .*\{$", line)
        if header:
            name = header.group(2)
            found[name] = []
            if header.group(1):
                entry = name
        elif name is not None and line.strip() == "}":
            name = None
        elif name is not None:
            found[name].append(line)
    return found, entry


def kernel_count(hlo: str) -> dict[str, int]:
    """Instructions that launch work, by opcode: those of the entry computation and of the
    computations it runs by ``while`` and ``call`` (a loop's body counts once: kernels per
    trip, not per step); not what runs inside a fusion, nor computations no one runs."""
    bodies, entry = computations(hlo)
    counts: dict[str, int] = {}
    pending, seen = [entry], set()
    while pending:
        current = pending.pop()
        if current is None or current in seen or current not in bodies:
            continue
        seen.add(current)
        for line in bodies[current]:
            found = re.search(r"= [^=]*? ([a-z][\w\-]*)\(", line)
            if not found or found.group(1) in NO_KERNEL:
                continue
            opcode = found.group(1)
            counts[opcode] = counts.get(opcode, 0) + 1
            if opcode == "while":
                pending += re.findall(r"(?:body|condition)=%?([\w.\-]+)", line)
            if opcode == "call":
                pending += re.findall(r"to_apply=%?([\w.\-]+)", line)
    return dict(sorted(counts.items()))


def program_size(compiled: Any) -> dict[str, int]:
    """Fusions and lines of a compiled program's text (``jax.stages.Compiled``): what XLA's
    compile time and a small batch's per-step overhead grow with."""
    text = compiled.as_text()
    return {"fusions": len(re.findall(r" fusion\(", text)), "instructions": text.count("\n")}
