"""Notebooks run top to bottom in a real Jupyter kernel, and show their pictures.

Each notebook is executed with nbclient (the kernel is this interpreter's ipykernel), from the
repository root.  Cells tagged ``image`` must leave an ``image/png`` output: a chart that only
prints ``<Figure size ...>`` fails.  The notebooks assert their own numbers (e.g. the tail-at-
scale table grows with the expected maximum).
"""

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _image_cells(nb) -> list[int]:
    return [i for i, c in enumerate(nb.cells) if "image" in c.get("metadata", {}).get("tags", [])]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_and_shows_its_pictures(path):
    nb = nbformat.read(path, as_version=4)
    wanted = _image_cells(nb)
    assert wanted, f"{path.name}: no cell is tagged 'image'"
    nbclient.NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    for i in wanted:
        kinds = {k for out in nb.cells[i].outputs for k in out.get("data", {})}
        assert "image/png" in kinds, f"{path.name} cell {i}: no image/png output (got {sorted(kinds) or 'nothing'})"


def test_the_notebooks_extra_installs_jupyter_and_the_test_extra_does_not():
    """``pip install -e '.[notebooks]'`` brings Jupyter Notebook and a kernel; the test extra
    stays without Jupyter (the suite runs the notebooks through nbclient)."""
    import re
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def names(reqs):
        return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in reqs}
    assert {"notebook", "ipykernel"} <= names(extras["notebooks"])
    assert not {"notebook", "jupyter", "jupyterlab"} & names(extras["test"])
    assert "pip install -e '.[notebooks]'" in (ROOT / "README.md").read_text()
    assert "pip install -e '.[notebooks]'" in (ROOT / "notebooks" / "README.md").read_text()
