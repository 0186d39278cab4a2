"""Reading XLA's optimized HLO text: its computations and their instructions, an
instruction's operands and attributes, the bytes of a shape, and the trips of a counted loop
read from its condition (for a program, such as a TPU's, where XLA records none)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

DTYPE_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}
HEADER = re.compile(r"^(ENTRY )?%?([\w.\-]+) .*\{$")
INSTRUCTION = re.compile(r"^\s*(ROOT )?%?([\w.\-]+) = (.*?) ([a-z][\w\-]*)\((.*)$")
ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\]")


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape such as ``f32[8,16]{1,0}`` or a tuple of them (tokens: 0)."""
    total = 0
    for dtype, dims in ARRAY.findall(shape):
        if dtype not in DTYPE_BYTES:
            continue
        elements = 1
        for dim in filter(None, dims.split(",")):
            elements *= int(dim)
        total += DTYPE_BYTES[dtype] * elements
    return total


def operand_names(text: str) -> list[str]:
    """The operand names of an instruction, from the text after its opcode's "(" up to the
    matching ")": the last word of each top-level, comma-separated item."""
    depth, item, items = 0, [], []
    for char in re.sub(r"/\*.*?\*/", "", text):  # long operand lists carry /*index=5*/
        if char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                break
            depth -= 1
        if char == "," and depth == 0:
            items.append("".join(item))
            item = []
        else:
            item.append(char)
    items.append("".join(item))
    return [entry.split()[-1].lstrip("%") for entry in items if entry.strip()]


@dataclasses.dataclass(frozen=True)
class Instruction:
    root: bool
    name: str
    shape: str
    opcode: str
    rest: str  # the text after "opcode(": operands, then attributes


def computations(hlo: str) -> tuple[dict[str, list[Instruction]], str]:
    """The module's computations, name -> instructions in schedule order, and the entry's
    name."""
    found: dict[str, list[Instruction]] = {}
    name, entry = None, None
    for line in hlo.splitlines():
        header = HEADER.match(line)
        if header and name is None:
            name = header.group(2)
            found[name] = []
            entry = name if header.group(1) else entry
        elif name is not None and line.strip() == "}":
            name = None
        elif name is not None:
            parsed = INSTRUCTION.match(line)
            if parsed:
                root, *rest = parsed.groups()
                found[name].append(Instruction(root is not None, *rest))
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    return found, entry


def attribute(rest: str, key: str) -> list[str]:
    """Computation names given to ``key=`` (``body=%b``, ``branch_computations={%a, %b}``)."""
    found = re.search(rf"\b{key}=(\{{[^}}]*\}}|%?[\w.\-]+)", rest)
    return re.findall(r"[\w.\-]+", found.group(1).replace("%", "")) if found else []


def condition_trips(
    found: dict[str, list[Instruction]], caller: str, loop: Instruction
) -> int | None:
    """Trips of the while ``loop`` (an instruction of ``caller``) read from its condition: the
    condition compares one element of the loop's tuple, less than a constant N (``LT``), and
    the body adds 1 to it; the loop's operand (a tuple in ``caller``) starts it at a constant S
    (through copies and bitcasts): N - S trips. None where the loop is not of that form."""
    condition = attribute(loop.rest, "condition")
    body = attribute(loop.rest, "body")
    if not condition or not body or condition[0] not in found or body[0] not in found:
        return None
    cond = {inst.name: inst for inst in found[condition[0]]}
    root = next((inst for inst in cond.values() if inst.root), None)
    if root is None or root.opcode != "compare" or "direction=LT" not in root.rest:
        return None
    counter, bound = (cond.get(name) for name in operand_names(root.rest)[:2])
    index = tuple_index(counter)
    limit = constant_value(bound, cond)
    if index is None or limit is None or not adds_one(found[body[0]], index):
        return None
    callers = {inst.name: inst for inst in found[caller]}
    init = callers.get(operand_names(loop.rest)[0])
    if init is None or init.opcode != "tuple":
        return None
    elements = operand_names(init.rest)
    start = constant_value(callers.get(elements[index]), callers) if index < len(elements) else None
    return None if start is None else max(limit - start, 0)


def through_copies(inst: Instruction | None, scope: dict[str, Instruction]) -> Any:
    """The instruction ``inst`` copies or bitcasts, through any number of them."""
    while inst is not None and inst.opcode in ("copy", "bitcast"):
        inst = scope.get(operand_names(inst.rest)[0])
    return inst


def tuple_index(inst: Instruction | None) -> int | None:
    """k of ``get-tuple-element(parameter), index=k``; None for anything else."""
    if inst is None or inst.opcode != "get-tuple-element":
        return None
    found = re.search(r"\bindex=(\d+)", inst.rest)
    return int(found.group(1)) if found else None


def constant_value(inst: Instruction | None, scope: dict[str, Instruction]) -> int | None:
    """The integer an instruction holds: a scalar constant, through copies and bitcasts."""
    inst = through_copies(inst, scope)
    if inst is None or inst.opcode != "constant":
        return None
    found = re.match(r"\s*(-?\d+)\)", inst.rest)
    return int(found.group(1)) if found else None


def adds_one(body: list[Instruction], index: int) -> bool:
    """Whether ``body`` returns element ``index`` of its tuple plus the constant 1."""
    scope = {inst.name: inst for inst in body}
    root = next((inst for inst in body if inst.root), None)
    if root is None or root.opcode != "tuple":
        return False
    elements = operand_names(root.rest)
    step = through_copies(scope.get(elements[index]) if index < len(elements) else None, scope)
    if step is None or step.opcode != "add":
        return False
    operands = [scope.get(name) for name in operand_names(step.rest)[:2]]
    ones = [constant_value(operand, scope) == 1 for operand in operands]
    counters = [tuple_index(through_copies(operand, scope)) == index for operand in operands]
    return (ones[0] and counters[1]) or (ones[1] and counters[0])
