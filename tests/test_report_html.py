"""The shareable HTML report: one self-contained page, rendered by a real headless browser.

The page must need no network and no other file (charts inlined as data URIs). When Chromium
is installed the page is rendered and the screenshot must show the Gantt chart's colours;
under CI (``CLUSTERSIM_REQUIRE_BROWSER=1``, set by ``.ci/run`` once it has a browser) a
missing browser fails the test instead of skipping it.
"""

import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from simulator.cli import main

SCENARIO = ("model: tiny-dense\ncluster: dgx-h100\nparallel: {tp: 2, pp: 2, dp: -1, global_batch_size: 8}\n"
            "num_steps: 1\nhost: none\nwhatif: {slow_gpus: {5: 1.5}}\n")
FORWARD_BLUE = (0x3A, 0x6F, 0xB0)           # simulator.report.style.PHASE_COLORS["F"]


def _browser() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    if os.environ.get("CLUSTERSIM_REQUIRE_BROWSER") == "1":
        pytest.fail("no Chromium found, and CLUSTERSIM_REQUIRE_BROWSER=1 (CI): install it (.ci/run does)")
    pytest.skip("no Chromium to render the report")


def _self_contained(text: str) -> None:
    assert text.startswith("<!DOCTYPE html>")
    refs = re.findall(r'(?:src|href)="([^"]+)"', text)
    assert refs and all(r.startswith("data:image/png;base64,") for r in refs), refs[:3]
    assert "http://" not in text and "https://" not in text


def _screenshot(browser: str, page, png) -> np.ndarray:
    from matplotlib.image import imread
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1400,2400", f"--screenshot={png}", page.as_uri()],
                   check=True, capture_output=True, timeout=120)
    return (imread(png)[:, :, :3] * 255).round().astype(int)


def _blue_pixels(img: np.ndarray) -> int:
    return int((np.abs(img - np.array(FORWARD_BLUE)).max(axis=2) <= 6).sum())


def test_run_report_is_one_page_a_browser_renders_with_its_charts(tmp_path, capsys):
    sc = tmp_path / "s.yaml"
    sc.write_text(SCENARIO)
    page = tmp_path / "report.html"
    assert main(["run", str(sc), "--quiet", "--report", str(page)]) == 0
    text = page.read_text()
    _self_contained(text)
    for words in ("What-if", "GPU 5 computes 1.5x slower", "Summary", "Where the step goes",
                  "Gantt chart of the reported step", "Memory per pipeline stage", "Link utilisation", "Scenario",
                  "TP2 PP2 DP2 1f1b"):
        assert words in text, words
    assert text.count("data:image/png;base64,") == 2          # the breakdown and the Gantt chart
    img = _screenshot(_browser(), page, tmp_path / "shot.png")
    assert _blue_pixels(img) > 2000, "the rendered page shows no chart"


def test_compare_report_holds_every_run(tmp_path, capsys):
    sc = tmp_path / "s.yaml"
    sc.write_text(SCENARIO)
    page = tmp_path / "compare.html"
    assert main(["compare", str(sc), "--set", "parallel.pp=1", "--quiet", "--report", str(page)]) == 0
    text = page.read_text()
    _self_contained(text)
    assert "s + parallel.pp=1" in text and "On the critical path" in text and "vs first" in text
    assert text.count("data:image/png;base64,") == 2          # breakdown bars and the aligned Gantt charts
    img = _screenshot(_browser(), page, tmp_path / "shot.png")
    assert _blue_pixels(img) > 2000


def test_the_page_says_which_clustersim_wrote_it_and_when(tmp_path, monkeypatch, capsys):
    """Version, commit and date in the footer; SOURCE_DATE_EPOCH fixes the date."""
    from importlib import metadata

    from simulator.report.html import provenance
    sc = tmp_path / "s.yaml"
    sc.write_text(SCENARIO)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1767225600")          # 2026-01-01 00:00 UTC
    p = provenance()
    assert p["version"] == metadata.version("clustersim") and p["date"] == "2026-01-01 00:00 UTC"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    head = subprocess.run(["git", "-C", root, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        assert p["commit"].split("+")[0] == head.stdout.strip()
    for argv in (["run", str(sc), "--quiet", "--report", str(tmp_path / "r.html")],
                 ["compare", str(sc), "--set", "parallel.pp=1", "--quiet", "--report", str(tmp_path / "c.html")]):
        assert main(argv) == 0
        page = (tmp_path / argv[-1].rsplit("/", 1)[-1]).read_text()
        commit = f"commit {p['commit']}" if p["commit"] else "not from a git checkout"
        assert f"Written by clustersim {p['version']} ({commit}) on 2026-01-01 00:00 UTC." in page


def _breakdown_rows(text: str) -> list[list[str]]:
    """The cells of the table that follows the first chart under "Where the step(s) go"."""
    section = text.split("Where the step")[1].split("<h2>")[0]
    table = section.split("<table>")[1].split("</table>")[0]
    return [re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row) for row in table.split("</tr>") if "<t" in row]


def test_the_breakdown_is_also_a_table_beside_its_chart(tmp_path, capsys):
    """Each category with its time and share of the step, in the metrics' order, then the
    step: the numbers the chart draws, readable and copyable (no browser needed)."""
    import json

    from simulator.report.charts import fmt_duration
    sc = tmp_path / "s.yaml"
    sc.write_text(SCENARIO)
    page = tmp_path / "report.html"
    assert main(["run", str(sc), "--quiet", "--json", "--report", str(page)]) == 0
    bd = json.loads(capsys.readouterr().out)["breakdown_s"]
    text = page.read_text()
    section = text.split("Where the step goes")[1].split("<h2>")[0]
    assert '<div class="side"><img' in section and section.index("<img") < section.index("<table>")
    rows = _breakdown_rows(text)
    assert rows[0] == ["category", "time", "share of the step"]
    total = sum(bd.values())
    assert rows[1:-1] == [[k.replace("_", " "), fmt_duration(v), f"{v / total:.1%}"] for k, v in bd.items()]
    assert rows[-1] == ["<b>step</b>", f"<b>{fmt_duration(total)}</b>", "<b>100.0%</b>"]
    assert any(float(r[2].rstrip("%")) > 10 for r in rows[1:-1])          # real shares, not zeros
    page = tmp_path / "compare.html"
    assert main(["compare", str(sc), "--set", "parallel.pp=1", "--quiet", "--report", str(page)]) == 0
    rows = _breakdown_rows(page.read_text())
    assert rows[0] == ["category", "[1]", "[2]"] and rows[1][0] == "compute" and rows[-1][0] == "<b>step</b>"
