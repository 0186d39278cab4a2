"""What a compiled GPU program runs: its kernel launches and the bytes they move, read from
the optimized HLO text (``jax.stages.Compiled.as_text()``, e.g. from
``ppojax.runtime.deviceless.compile_for``).

The model, deliberately plain:

- a launch is an instruction of the entry computation or of a while loop's body or condition
  that does work: each fusion, custom call, copy, sort, collective; not parameters, constants,
  tuples, get-tuple-element or bitcasts (no kernel), nor while, call and conditional (control
  flow: their computations are counted instead; a conditional by its largest branch);
- its bytes are its operands' and its result's sizes, every time: no credit for the caches
  (a TPU's DMA, an async copy or slice, is one launch at its ``-done``: its destination
  written and as many bytes read).
  A fusion that slices a buffer (``dynamic-slice``) counts the slices, and one that updates a
  buffer in place (``dynamic-update-slice``, as a scan stores its step) counts the update,
  not the buffer: that is what the GPU touches. A custom call's result aliased to an operand
  (``output_to_operand_aliasing``: a kernel updating a buffer in place) is not counted
  written whole: the operand is counted, and what it writes there is slices its other
  operands bring (the decode kernel's KV cache, the token's keys written in);
- a loop's body and condition are counted once per trip, multiplied by the trip count XLA
  records (``known_trip_count``); a loop without one is counted for one trip and says so.
  A TPU program records none: ``count(hlo, trips_from_condition=True)`` reads each from the
  loop's condition (``condition_trips``).

``count(hlo)`` gives the tree of loops; ``ppo_phases`` names the loops of a PPO program;
``kernel_count`` and ``program_size`` are the smaller readings the CPU benchmarks take (a
loop's kernels once, not per trip; a program's fusions and lines).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from ppojax.runtime.hlo_text import (
    Instruction,
    attribute,
    computations,
    condition_trips,
    operand_names,
    shape_bytes,
)

# instructions that launch no kernel of their own
NO_LAUNCH = frozenset(
    {
        "parameter",
        "constant",
        "get-tuple-element",
        "tuple",
        "bitcast",
        "after-all",
        "add-dependency",
        "opt-barrier",
        "domain",
        # a TPU's DMA (an async copy or slice) is counted at its -done (ASYNC_DMA)
        "copy-start",
        "slice-start",
    }
)
# a TPU's DMAs into and out of its on-chip memory: a -start (whose result is a tuple of the
# source, the destination and a context) and its -done (the destination)
ASYNC_DMA = frozenset({"copy-done", "slice-done"})
CONTROL_FLOW = frozenset({"while", "call", "conditional"})
# an output_to_operand_aliasing entry, {{1}: (3, {}), ...}: the aliased result element
ALIASED = re.compile(r"\{(\d+)\}: \(\d+,")
ARRAY_SHAPE = re.compile(r"[a-z]+\d*(?:e\d+m\d+\w*)?\[[\d,]*\]")
TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


@dataclasses.dataclass(frozen=True)
class Launch:
    """One kernel launch: its instruction's name and opcode, and the bytes it reads and
    writes (operands + result)."""

    name: str
    opcode: str
    bytes: int


@dataclasses.dataclass
class Block:
    """The entry computation or one while loop: its own launches per trip (body and
    condition) and its loops, in schedule order. ``trips`` is None where XLA knows no trip
    count (then counted as one trip)."""

    name: str
    trips: int | None
    launches: list[Launch]
    loops: list[Block]

    def launches_per_trip(self) -> int:
        """Launches of one trip, nested loops included (each times its trips)."""
        return len(self.launches) + sum(loop.total_launches() for loop in self.loops)

    def bytes_per_trip(self) -> int:
        return sum(launch.bytes for launch in self.launches) + sum(
            loop.total_bytes() for loop in self.loops
        )

    def total_launches(self) -> int:
        return (self.trips or 1) * self.launches_per_trip()

    def total_bytes(self) -> int:
        return (self.trips or 1) * self.bytes_per_trip()

    def collective_bytes(self) -> int:
        """Bytes the collectives of every trip read and write (all-gathers, reduce-scatters,
        all-reduces, all-to-alls, permutes; an async one counted at its start), nested loops
        times their trips: what crosses the interconnect rather than stays in HBM."""
        own = sum(launch.bytes for launch in self.launches if is_collective(launch.opcode))
        nested = sum(loop.collective_bytes() for loop in self.loops)
        return (self.trips or 1) * (own + nested)

    def walk(self) -> list[Block]:
        """This block and every loop inside it, outermost first, in schedule order."""
        return [self] + [inner for loop in self.loops for inner in loop.walk()]

    def by_opcode(self) -> dict[str, int]:
        """Launches of one trip by opcode, nested loops times their trips."""
        counts: dict[str, int] = {}
        for launch in self.launches:
            counts[launch.opcode] = counts.get(launch.opcode, 0) + 1
        for loop in self.loops:
            for opcode, number in loop.by_opcode().items():
                counts[opcode] = counts.get(opcode, 0) + (loop.trips or 1) * number
        return dict(sorted(counts.items()))


COLLECTIVES = frozenset(
    {"all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute"}
)


def is_collective(opcode: str) -> bool:
    """A collective's launch; an async pair counts at its ``-start`` (its ``-done`` waits)."""
    return opcode.removesuffix("-start") in COLLECTIVES


class Counter:
    """Walks a module's computations from the entry, into loops, calls and conditionals.
    ``trips_from_condition``: a loop XLA gives no trip count takes its condition's
    (``condition_trips``)."""

    def __init__(self, hlo: str, trips_from_condition: bool = False) -> None:
        self.computations, self.entry = computations(hlo)
        self.trips_from_condition = trips_from_condition

    def block(self, name: str, computation: str, trips: int | None) -> Block:
        block = Block(name, trips, [], [])
        self.add(block, computation)
        return block

    def add(self, block: Block, computation: str) -> None:
        """The launches and loops of ``computation`` into ``block``."""
        shapes = {inst.name: inst.shape for inst in self.computations[computation]}
        for inst in self.computations[computation]:
            if inst.opcode == "while":
                known = TRIPS.search(inst.rest)
                trips = int(known.group(1)) if known else None
                if trips is None and self.trips_from_condition:
                    trips = condition_trips(self.computations, computation, inst)
                loop = Block(inst.name, trips, [], [])
                for part in attribute(inst.rest, "body") + attribute(inst.rest, "condition"):
                    self.add(loop, part)
                block.loops.append(loop)
            elif inst.opcode == "call":
                for part in attribute(inst.rest, "to_apply"):
                    self.add(block, part)
            elif inst.opcode == "conditional":
                self.add_largest_branch(block, inst.rest)
            elif inst.opcode not in NO_LAUNCH:
                block.launches.append(Launch(inst.name, inst.opcode, self.bytes_of(inst, shapes)))

    def bytes_of(self, inst: Instruction, shapes: dict[str, str]) -> int:
        """Operand and result bytes of a launch; of a fusion, what it touches (``touched``); of
        a DMA, its destination written and as many bytes read."""
        if inst.opcode in ASYNC_DMA:
            return 2 * shape_bytes(inst.shape)
        operands = [shape_bytes(shapes.get(name, "")) for name in operand_names(inst.rest)]
        fused = attribute(inst.rest, "calls") if inst.opcode == "fusion" else []
        if fused and fused[0] in self.computations:
            return touched(self.computations[fused[0]], operands, shape_bytes(inst.shape))
        return sum(operands) + written(inst)

    def add_largest_branch(self, block: Block, rest: str) -> None:
        branches = attribute(rest, "branch_computations") or (
            attribute(rest, "true_computation") + attribute(rest, "false_computation")
        )
        counted = [self.block(name, name, 1) for name in branches]
        if counted:
            largest = max(counted, key=Block.launches_per_trip)
            block.launches += largest.launches
            block.loops += largest.loops


def written(inst: Instruction) -> int:
    """Result bytes of a launch, less those of tuple elements aliased to an operand."""
    aliased = {int(i) for i in ALIASED.findall(inst.rest)}
    if not aliased or not inst.shape.startswith("("):
        return shape_bytes(inst.shape)
    parts = ARRAY_SHAPE.findall(inst.shape)
    return sum(shape_bytes(part) for i, part in enumerate(parts) if i not in aliased)


def touched(fused: list[Instruction], operands: list[int], result: int) -> int:
    """Bytes a fusion reads and writes, given its fused computation, its operands' sizes and
    its result's: a buffer it only slices (operand 0 of ``dynamic-slice`` alone) counts the
    slices, one it only gathers from (operand 0 of ``gather`` alone) the rows gathered; a
    buffer it updates in place (operand 0 of a ``dynamic-update-slice`` at its root, used
    nowhere else) is not read, and the update is what is written, as a GPU runs them;
    everything else in full. Bitcasts between a parameter and those uses are seen through:
    they are views of the same bytes (XLA bitcasts a loop's KV cache to the layout its
    attention reads, and updates it in place all the same)."""
    root = next((inst for inst in fused if inst.root), None)
    if root is None:
        return sum(operands) + result
    by_name = {inst.name: inst for inst in fused}
    users: dict[str, list[Instruction]] = {}
    for inst in fused:
        for name in operand_names(inst.rest):
            users.setdefault(name, []).append(inst)
    outputs = operand_names(root.rest) if root.opcode == "tuple" else [root.name]
    updated = {
        name: by_name[operand_names(by_name[name].rest)[1]]
        for name in outputs
        if name in by_name and by_name[name].opcode == "dynamic-update-slice"
    }
    in_place = {operand_names(by_name[name].rest)[0] for name in updated}
    total = 0
    for inst in (inst for inst in fused if inst.opcode == "parameter"):
        direct, names = past_bitcasts(inst.name, users)
        if direct and all(
            user.opcode in ("dynamic-slice", "gather") and operand_names(user.rest)[0] in names
            for user in direct
        ):
            total += sum(shape_bytes(user.shape) for user in direct)
        elif not (names & in_place and len(direct) == 1):
            index = int(re.match(r"\s*(\d+)", inst.rest).group(1))
            total += operands[index] if index < len(operands) else 0
    for name in (name for name in outputs if name in by_name):
        total += shape_bytes((updated.get(name) or by_name[name]).shape)
    return total


def past_bitcasts(name: str, users: dict[str, list[Instruction]]) -> tuple[list, set[str]]:
    """The users of ``name`` that are not bitcasts, through any chain of bitcasts, and the
    names the same bytes go by (``name`` and its bitcasts)."""
    names, found, pending = {name}, [], [name]
    while pending:
        for user in users.get(pending.pop(), []):
            if user.opcode == "bitcast":
                names.add(user.name)
                pending.append(user.name)
            else:
                found.append(user)
    return found, names


def count(hlo: str, trips_from_condition: bool = False) -> Block:
    """The launches of a compiled module's text, as a tree: the entry, then its loops (where
    XLA records no trip count, read from the loop's condition with ``trips_from_condition``,
    as a TPU program needs)."""
    counter = Counter(hlo, trips_from_condition)
    return counter.block(counter.entry, counter.entry, 1)


def kernel_count(hlo: str) -> dict[str, int]:
    """Launches by opcode of one trip of every block: the entry and each loop's body and
    condition once (kernels per trip, not per step), neither what runs inside a fusion nor
    computations no one runs."""
    counts: dict[str, int] = {}
    for block in count(hlo).walk():
        for launch in block.launches:
            counts[launch.opcode] = counts.get(launch.opcode, 0) + 1
    return dict(sorted(counts.items()))


def program_size(compiled: Any) -> dict[str, int]:
    """Fusions and lines of a compiled program's text (``jax.stages.Compiled``): what XLA's
    compile time and a small batch's per-step overhead grow with."""
    text = compiled.as_text()
    return {"fusions": len(re.findall(r" fusion\(", text)), "instructions": text.count("\n")}


def summary(block: Block, trips: int | None = None) -> dict[str, Any]:
    """Launches and bytes of ``block``: per trip and, times ``trips`` (default its own), in
    all."""
    trips = block.trips if trips is None else trips
    return {
        "trips": trips,
        "launches_per_trip": block.launches_per_trip(),
        "bytes_per_trip": block.bytes_per_trip(),
        "launches": (trips or 1) * block.launches_per_trip(),
        "bytes": (trips or 1) * block.bytes_per_trip(),
    }


def per_step(rollout: Block, num_steps: int) -> dict[str, Any]:
    """Launches and bytes of one env step: the rollout's over its ``num_steps`` steps (a
    fraction where the rollout runs in chunks, each with its own launches)."""
    launches, moved = rollout.total_launches(), rollout.total_bytes()
    return {
        "launches": launches // num_steps if launches % num_steps == 0 else launches / num_steps,
        "bytes": round(moved / num_steps),
    }


def ppo_phases(
    program: Block, updates: int, num_steps: int, epochs: int, minibatches: int
) -> dict[str, Any]:
    """A PPO program's loops by role, and launches and bytes of each:

    - ``update``: the outermost loop of ``updates`` trips that holds loops (one update a trip);
    - ``rollout``: its first loop of ``num_steps`` trips (one env step a trip), or of fewer
      trips holding one that makes up ``num_steps`` (the rollout in chunks), or of a divisor
      of either (env steps unrolled, several a trip);
    - ``gae``: the loops between the rollout and the epochs (GAE's reverse scan, which may be
      unrolled into fewer trips; an associative scan has no loop, and its launches are
      ``rest``'s);
    - ``epochs``: its loop of ``epochs`` trips holding one of ``minibatches`` trips (the
      ``minibatch`` loop, one gradient step a trip), or one loop of ``epochs * minibatches``
      trips (both at once);
    - ``rest``: the update's launches outside those loops.

    Raises ValueError when the program has no such loops."""
    update = next(
        (b for b in program.walk()[1:] if b.trips == updates and b.loops),
        None,
    )
    if update is None:
        raise ValueError(f"no loop of {updates} updates holding loops in the program")
    roles = update_roles(update, num_steps, epochs, minibatches)
    phases = {
        "per_update": summary(update, 1),
        "per_env_step": per_step(roles["rollout"], num_steps),
        "rollout": summary(roles["rollout"]),
        "gae": {
            "loops": [loop.trips for loop in roles["gae"]],
            "launches": sum(loop.total_launches() for loop in roles["gae"]),
            "bytes": sum(loop.total_bytes() for loop in roles["gae"]),
        },
        "per_minibatch_step": summary(roles["minibatch"], 1),
        "epochs": summary(roles["epochs"]),
        "whole_program": summary(program, 1),
    }
    counted = ("rollout", "gae", "epochs")
    phases["rest"] = {
        "launches": phases["per_update"]["launches"]
        - sum(phases[part]["launches"] for part in counted),
        "bytes": phases["per_update"]["bytes"] - sum(phases[part]["bytes"] for part in counted),
    }
    phases["per_update"]["by_opcode"] = update.by_opcode()
    phases["per_minibatch_step"]["by_opcode"] = roles["minibatch"].by_opcode()
    phases["rollout"]["by_opcode"] = {
        opcode: number * (roles["rollout"].trips or 1)
        for opcode, number in roles["rollout"].by_opcode().items()
    }
    return phases


def update_roles(update: Block, num_steps: int, epochs: int, minibatches: int) -> dict[str, Any]:
    loops = update.loops

    def steps_of(loop: Block) -> int:
        """Env steps a loop covers: its trips, or its trips times an inner loop's where XLA
        or the program cut the rollout into chunks; either times the steps a trip runs where
        the program unrolled them (a divisor of num_steps)."""
        inner = [(loop.trips or 1) * (child.trips or 1) for child in loop.loops]
        covered = [trips for trips in [loop.trips, *inner] if trips and num_steps % trips == 0]
        return num_steps if covered else 0

    rollout = next((i for i, loop in enumerate(loops) if steps_of(loop)), None)
    if rollout is None:
        raise ValueError(f"no rollout loop of {num_steps} trips in the update")

    def holds_minibatches(loop: Block) -> Block | None:
        if loop.trips == epochs * minibatches:
            return loop
        if loop.trips == epochs:
            return next((inner for inner in loop.loops if inner.trips == minibatches), None)
        return None

    found = next(
        (
            (i, holds_minibatches(loop))
            for i, loop in enumerate(loops)
            if i > rollout and holds_minibatches(loop)
        ),
        None,
    )
    if found is None:
        raise ValueError(
            f"no loop of {epochs} epochs x {minibatches} minibatches after the rollout"
        )
    index, minibatch = found
    return {
        "rollout": loops[rollout],
        "gae": loops[rollout + 1 : index],
        "epochs": loops[index],
        "minibatch": minibatch,
    }


def tree(block: Block, depth: int = 0) -> str:
    """The loop tree as indented lines: name, trips, launches and bytes per trip."""
    line = (
        f"{'  ' * depth}{block.name}: {block.trips} trips, {block.launches_per_trip()} launches"
        f" and {block.bytes_per_trip()} bytes a trip ({len(block.launches)} of its own)"
    )
    return "\n".join([line] + [tree(loop, depth + 1) for loop in block.loops])
