"""Runs a script of benchmarks/ as its docs do, ``python benchmarks/NAME.py ARGS`` from the
repository root, in a process of its own: tests read what it prints and writes and import
none of it."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_benchmark(
    name: str, *args: str, before: str = "", check: bool = True
) -> subprocess.CompletedProcess:
    """The finished run of ``benchmarks/{name}.py`` with ``args`` (its output captured as
    text). ``before``: Python run first in that process, to set up what a test needs (the
    script then runs as ``__main__`` with benchmarks/ first on the path, as Python runs it)."""
    script = f"benchmarks/{name}.py"
    command = [sys.executable, script, *args]
    if before:
        launch = (
            "import runpy, sys\n"
            f"sys.argv = {[script, *args]!r}\n"
            "sys.path.insert(0, 'benchmarks')\n"
            f"runpy.run_path({script!r}, run_name='__main__')\n"
        )
        command = [sys.executable, "-c", before + "\n" + launch]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise AssertionError(f"{script} exited with {done.returncode}:\n{done.stderr[-3000:]}")
    return done
