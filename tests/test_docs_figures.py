"""The figures README.md and docs/ quote are what the code prints (experiments/docs_figures.py).

Each marked figure is regenerated from its command (a simulation of a few seconds, or the
committed prediction tables for the accuracy figures) and compared with the page to the
printed digit. When this fails, run ``python experiments/docs_figures.py --write`` and read
the diff: a changed figure may need its sentence changed too.
"""

from __future__ import annotations

import csv
import re

import pytest

from tests.experiment_scripts import load_experiment


@pytest.fixture(scope="module")
def figures():
    return load_experiment("docs_figures")


def test_every_page_quotes_the_figures_the_code_gives(figures):
    diffs = figures.check()
    assert not diffs, "figures in the docs differ from what the code gives " \
                      "(python experiments/docs_figures.py --write):\n" + "\n".join(diffs)


def test_markers_are_balanced_and_name_known_figures(figures):
    used = set()
    for page in figures.PAGES:
        # markers quoted in inline code (a backtick just before them) are examples, not figures
        text = re.sub(r"`<!--[^`]*`", "", (figures.ROOT / page).read_text())
        assert text.count("<!--fig:") == text.count("<!--/fig-->"), f"{page}: unbalanced inline figure markers"
        assert text.count("<!--figblock:") == text.count("<!--/figblock-->"), f"{page}: unbalanced block markers"
        assert len(figures.BLOCK.findall(text)) == text.count("<!--figblock:"), \
            f"{page}: a block marker not on a line of its own"
        for _, name, _ in figures.marked(text):
            prod, _, key = name.partition(".")
            assert prod in figures._PRODUCERS and key, f"{page}: figure {name!r} has no producer"
            used.add(prod)
    # every producer is quoted somewhere (a producer nobody quotes is dead weight)
    assert used == set(figures._PRODUCERS), f"producers quoted nowhere: {set(figures._PRODUCERS) - used}"


def test_the_check_catches_a_stale_figure(figures, monkeypatch):
    """The comparison can fail: a page quoting another value for a figure is reported."""
    page = figures.ROOT / "README.md"
    text = page.read_text()
    stale = re.sub(r"(<!--fig:presets\.models-->)\d+(<!--/fig-->)", r"\g<1>999\2", text)
    assert stale != text
    assert figures.render(stale) == figures.render(text) == text


def test_the_readme_and_accuracy_page_agree(figures):
    """README's accuracy table and docs/accuracy.md's come from the same prediction tables."""
    readme = (figures.ROOT / "README.md").read_text()
    acc = (figures.ROOT / "docs" / "accuracy.md").read_text()
    h100 = figures.value("accuracy.h100_median")
    assert f"| {h100} % |" in readme and f"| {h100} % |" in acc


def test_imported_predictions_drop_the_wall_clock(figures, tmp_path, monkeypatch):
    src = tmp_path / "out"
    src.mkdir()
    with open(src / "predictions_x.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["id", "predicted_step_s", "wall_s"])
        w.writeheader()
        w.writerow({"id": "a", "predicted_step_s": "1.5", "wall_s": "3.2"})
    monkeypatch.setattr(figures, "PREDICTIONS", tmp_path / "pred")
    (dest,) = figures.import_predictions(src)
    assert dest.read_text() == "id,predicted_step_s\na,1.5\n"


def test_committed_predictions_cover_every_reference_set(figures):
    validate_all = load_experiment("validate_all")
    for name, path in validate_all.SETS.items():
        rows = figures.predictions(name)
        with open(path, newline="") as f:
            measured = sum(1 for _ in csv.DictReader(f))
        assert len(rows) == measured, f"predictions_{name}.csv has {len(rows)} rows, the set {measured}"
        assert "wall_s" not in rows[0]
