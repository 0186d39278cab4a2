"""What every run folder's summary.json holds, whatever trained it (PPO runs and sweeps, PBT,
the language-model commands): ``write_summary`` builds the part they all share around each
kind's own keys and writes it.

Every summary.json has, in this order: the kind's ``head`` (what ran: the env id, the runs),
how long the run is (``steps`` of a language-model run, ``num_updates`` of an env run), its
final means under the kind's names, the kind's ``extras``, the step or update this call
resumed from (``resumed_from_step`` / ``resumed_from_update``, null for a fresh run) and how
many it trained (``timed_steps`` / ``timed_updates``), its seconds (``wall_s``, compilation
included, where compiling is not timed apart; else ``compile_seconds`` and ``run_seconds``),
``finished_utc`` and the ``versions``. It is an output: nothing reads it back.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from ppojax.runs import folder

# What a run counts its length in, and the key summary.json gives that length: the names
# summary.json had before they shared a builder, which tests, benchmarks and readers use.
LENGTH_KEYS = {"step": "steps", "update": "num_updates"}


def write_summary(
    run_dir: Path,
    unit: str,
    length: int,
    start: int,
    finals: dict[str, Any],
    seconds: dict[str, float],
    *,
    head: dict[str, Any] | None = None,
    extras: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``run_dir``'s summary.json for a run of ``length`` steps or updates (``unit``:
    "step" or "update") that this call trained from ``start`` (0: a fresh run), with the
    final means ``finals`` and ``seconds`` (rounded to ms) under the kind's names, and
    return it."""
    if unit not in LENGTH_KEYS:
        raise ValueError(f"write_summary: unit must be one of {sorted(LENGTH_KEYS)}, got {unit!r}")
    summary = {
        **(head or {}),
        LENGTH_KEYS[unit]: length,
        **finals,
        **(extras or {}),
        f"resumed_from_{unit}": start or None,
        f"timed_{unit}s": length - start,
        **{name: round(value, 3) for name, value in seconds.items()},
        "finished_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": folder.versions(),
    }
    folder.write_json(Path(run_dir) / folder.SUMMARY_FILE, summary)
    return summary
