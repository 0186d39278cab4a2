"""The notebooks run top to bottom (at small settings, PPOJAX_SMALL=1) in a fresh kernel."""

import json
from pathlib import Path

import pytest

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


@pytest.mark.parametrize("name", ["quickstart.ipynb", "sweeps.ipynb", "rlhf.ipynb"])
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


@pytest.mark.parametrize("name", ["quickstart.ipynb", "sweeps.ipynb", "rlhf.ipynb"])
def test_notebook_opens_with_a_colab_badge_and_is_saved_without_outputs(name):
    notebook = json.loads((NOTEBOOKS / name).read_text())
    assert "colab.research.google.com/github/" in "".join(notebook["cells"][0]["source"])
    assert all(not cell.get("outputs") for cell in notebook["cells"])
