"""The test suite's slowest tests: pytest's ``--durations=0`` report turned into a table.

    python benchmarks/test_durations.py                    # runs the suite as CI's 3.11 leg does
    python benchmarks/test_durations.py --from durations.txt --pytest-command "CMD"

Without ``--from`` the script runs ``python -m pytest -q -n 2 --dist worksteal --durations=0``
as CI's 3.11 leg does (JAX_PLATFORMS=cpu, the deviceless tests required; arguments after
``--`` replace everything after ``-q``) and keeps its output; with ``--from``
it reads a report already written by the command given as ``--pytest-command``. Each test's
seconds are its setup, call and teardown together (a session or module fixture is paid by the
first test that needs it). Writes ``results/test_durations.json`` (date, machine, versions,
the exact pytest command, the suite's outcome and wall time, the ``--top`` slowest tests) and
the same table as ``results/test_durations.md``.

Measure on a quiet machine: under another load every test slows, but not by the same factor,
so on a shared machine read the table as an order and as shares of the total, not as seconds.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

# the record's machine and versions ask JAX for its devices: the CPU's, not a plugin's failed start
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import common  # noqa: E402

DEFAULT_ARGS = ["-n", "2", "--dist", "worksteal", "--durations=0"]
# as CI's 3.11 leg: the GPU and TPU programs compiled without a device cannot skip
REQUIRE = ("PPOJAX_REQUIRE_GPU_AOT", "PPOJAX_REQUIRE_TPU_AOT")
LINE = re.compile(r"^\s*(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S.*?)\s*$")
SUMMARY = re.compile(r"^=*\s*(.*?) in (\d+(?:\.\d+)?)s\b")


def parse(text: str) -> tuple[dict[str, dict[str, float]], dict[str, object]]:
    """(test id -> {phase: seconds}, the summary line's counts and seconds) of a report."""
    tests: dict[str, dict[str, float]] = defaultdict(dict)
    summary: dict[str, object] = {}
    for line in text.splitlines():
        found = LINE.match(line)
        if found:
            seconds, phase, test = found.groups()
            tests[test][phase] = tests[test].get(phase, 0.0) + float(seconds)
            continue
        found = SUMMARY.match(line.strip())
        if found and re.search(r"\d+ (passed|failed|error)", found.group(1)):
            counts = {
                name: int(count)
                for count, name in re.findall(r"(\d+) (\w+)", found.group(1).replace(",", ""))
            }
            summary = {"counts": counts, "wall_s": float(found.group(2))}
    if not tests:
        raise SystemExit("no durations in the report: was pytest run with --durations=0?")
    return dict(tests), summary


def rows(tests: dict[str, dict[str, float]], top: int) -> list[dict[str, object]]:
    """The ``top`` slowest tests, slowest first, with their share of all tests' seconds."""
    total = sum(sum(phases.values()) for phases in tests.values())
    ranked = sorted(tests.items(), key=lambda item: -sum(item[1].values()))[:top]
    return [
        {
            "rank": rank,
            "test": test,
            "seconds": round(sum(phases.values()), 2),
            "share": round(sum(phases.values()) / total, 4),
            **{phase: round(phases.get(phase, 0.0), 2) for phase in ("setup", "call", "teardown")},
        }
        for rank, (test, phases) in enumerate(ranked, start=1)
    ]


def table(document: dict[str, object]) -> str:
    summary = document["summary"]
    outcome = ", ".join(f"{n} {name}" for name, n in summary.get("counts", {}).items())
    head = [
        f"# The {len(document['slowest'])} slowest tests",
        "",
        f"`{document['pytest_command']}` on {document['date']}: "
        + (
            f"{outcome} in {summary['wall_s']} s"
            if summary
            else f"a partial report (no summary line), {document['tests']} tests"
        ),
        f"({document['machine']['cpu']}, {document['machine']['cores']} cores, Python "
        f"{document['machine']['python']}, jax {document['machine']['jax']}; the tests' seconds "
        f"summed over both workers: {document['test_seconds']} s). Written by "
        f"`{document['command']}`.",
        "",
    ]
    body = common.markdown_table(
        ["#", "test", "s", "share", "setup", "call"],
        [
            [r["rank"], f"`{r['test']}`", r["seconds"], f"{100 * r['share']:.1f}%", r["setup"],
             r["call"]]
            for r in document["slowest"]
        ],
    )  # fmt: skip
    return "\n".join(head) + "\n" + body + "\n"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", type=Path, help="a --durations=0 report")
    parser.add_argument("--pytest-command", help="the command that wrote --from's report")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--out", type=Path, default=common.RESULTS / "test_durations.json")
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments")
    args = parser.parse_args(argv)
    if args.source is not None:
        if not args.pytest_command:
            parser.error("--from needs --pytest-command: the command that wrote the report")
        text, command, load = args.source.read_text(), args.pytest_command, None
    else:
        pytest_args = args.pytest_args or DEFAULT_ARGS
        run = [sys.executable, "-m", "pytest", "-q", *pytest_args]
        variables = {name: "1" for name in REQUIRE}
        command = " ".join(f"{k}={v}" for k, v in {"JAX_PLATFORMS": "cpu", **variables}.items())
        command += " " + shlex.join(["python", "-m", "pytest", "-q", *pytest_args])
        begin, load = time.time(), os.getloadavg()[0]
        env = {**os.environ, **variables}
        done = subprocess.run(run, cwd=common.ROOT, capture_output=True, text=True, env=env)
        text = done.stdout + done.stderr
        print(f"pytest exit {done.returncode} after {time.time() - begin:.0f} s")
    tests, summary = parse(text)
    document = {
        **common.record(__file__, argv),
        "pytest_command": command,
        "load_average_1min_at_start": load,
        "summary": summary,
        "tests": len(tests),
        "test_seconds": round(sum(sum(p.values()) for p in tests.values()), 1),
        "slowest": rows(tests, args.top),
    }
    common.write_json(args.out, document)
    args.out.with_suffix(".md").write_text(table(document))
    print(table(document))


if __name__ == "__main__":
    main(sys.argv[1:])
