"""The notebooks run top to bottom (at small settings, PPOJAX_SMALL=1) in a fresh kernel, and
are committed with the outputs of their committed code (notebooks/execute.py)."""

import importlib.util
import json
from pathlib import Path

import pytest

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NAMES = ["quickstart.ipynb", "sweeps.ipynb", "rlhf.ipynb"]


def load_execute():
    spec = importlib.util.spec_from_file_location("execute", NOTEBOOKS / "execute.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.heavy
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_top_to_bottom(name, tmp_path, monkeypatch):
    monkeypatch.setenv("PPOJAX_SMALL", "1")
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    )
    client.execute()
    outputs = [output for cell in notebook.cells for output in cell.get("outputs", [])]
    assert not [output for output in outputs if output.get("output_type") == "error"]
    assert any(output.get("output_type") == "display_data" for output in outputs)


@pytest.mark.parametrize("name", NAMES)
def test_committed_outputs_come_from_the_committed_code(name):
    """The stamp notebooks/execute.py leaves is the hash of today's code cells, from a run at
    full size; every code cell ran, none failed, and a plot is among the outputs."""
    notebook = json.loads((NOTEBOOKS / name).read_text())
    assert "colab.research.google.com/github/" in "".join(notebook["cells"][0]["source"])
    stamp = notebook["metadata"].get("ppojax")
    assert stamp is not None, f"run python notebooks/execute.py notebooks/{name}"
    assert stamp["code_sha256"] == load_execute().code_hash(notebook), (
        f"{name}'s code changed since its outputs were made: "
        f"run python notebooks/execute.py notebooks/{name}"
    )
    assert stamp["small"] is False
    code = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]
    assert all(cell["execution_count"] is not None for cell in code)
    outputs = [output for cell in code for output in cell["outputs"]]
    assert not [output for output in outputs if output["output_type"] == "error"]
    assert any("image/png" in output.get("data", {}) for output in outputs)


def test_the_stamp_changes_with_any_code_cell():
    execute = load_execute()
    notebook = {"cells": [{"cell_type": "code", "source": ["x = 1\n", "y = 2"]}]}
    edited = {"cells": [{"cell_type": "code", "source": "x = 1\ny = 3"}]}
    markdown = {"cells": [*notebook["cells"], {"cell_type": "markdown", "source": "text"}]}
    assert execute.code_hash(notebook) != execute.code_hash(edited)
    assert execute.code_hash(notebook) == execute.code_hash(markdown)
    assert execute.code_hash(notebook) == execute.code_hash(
        {"cells": [{"cell_type": "code", "source": "x = 1\ny = 2"}]}
    )


@pytest.mark.parametrize("name", NAMES)
def test_no_cell_stores_a_progress_bar_refresh_per_output(name):
    """A training cell keeps a line or two, not one output per refresh of a progress bar
    (which GitHub shows as dozens of blocks above the plots)."""
    notebook = json.loads((NOTEBOOKS / name).read_text())
    code = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]
    assert max(len(cell["outputs"]) for cell in code) <= 4
    streams = [
        output
        for cell in code
        for output in cell["outputs"]
        if output["output_type"] == "stream" and output["name"] == "stderr"
    ]
    assert not any("/s]" in "".join(output["text"]) for output in streams)
