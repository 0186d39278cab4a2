"""Execute notebooks top to bottom and save them with their outputs and a stamp of their code.

    python notebooks/execute.py notebooks/quickstart.ipynb [more.ipynb ...] [--small]

Each notebook runs in a fresh kernel in a temporary folder (its run folders do not land in the
repository). The saved notebook's metadata gets ``ppojax``: the SHA-256 of its code cells
(``code_hash``), whether it ran at the small settings (PPOJAX_SMALL=1), how long it took and
when. ``tests/test_notebooks.py`` checks that the stamp matches the code cells, so committed
outputs always come from the committed code: edit a code cell and run this script again.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

STAMP = "ppojax"


def code_hash(notebook: Any) -> str:
    """SHA-256 of the sources of the notebook's code cells, in order (``notebook`` as read
    by nbformat or as plain JSON)."""
    sources = []
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            source = cell["source"]
            sources.append(source if isinstance(source, str) else "".join(source))
    return hashlib.sha256(json.dumps(sources).encode()).hexdigest()


def execute(path: Path, small: bool, timeout: int) -> float:
    """Run ``path`` in a fresh kernel, save it with outputs and the stamp; the seconds taken."""
    import nbclient
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    if small:
        os.environ["PPOJAX_SMALL"] = "1"
    else:
        os.environ.pop("PPOJAX_SMALL", None)
    begin = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        resources = {"metadata": {"path": folder}}
        client = nbclient.NotebookClient(
            notebook, timeout=timeout, kernel_name="python3", resources=resources
        )
        client.execute()
    seconds = time.perf_counter() - begin
    notebook.metadata[STAMP] = {
        "code_sha256": code_hash(notebook),
        "small": small,
        "seconds": round(seconds, 1),
        "executed_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    nbformat.write(notebook, path)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--small", action="store_true", help="run with PPOJAX_SMALL=1")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell (1800)")
    args = parser.parse_args(argv)
    for path in args.notebooks:
        seconds = execute(path, args.small, args.timeout)
        print(f"{path}: executed in {seconds:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
