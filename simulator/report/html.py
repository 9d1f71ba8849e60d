"""One self-contained HTML page to share a run (or a comparison of runs).

``clustersim run SCENARIO.yaml --report report.html`` and ``clustersim compare ... --report
report.html`` write it.  The page needs no network and no other file: the charts are PNGs
inlined as ``data:`` URIs, the styles are in the page.  It holds the scenario as given, the
summary (step time, MFU, tokens/s, memory verdict, what-ifs), the step-time breakdown (a chart
and, beside it, a table of each category's time and share), the
Gantt chart of the reported step, memory per pipeline stage and link utilisation per tier;
a comparison adds the table across runs and the charts on one time axis.  ``clustersim goodput
... --report report.html`` writes the time-to-train page (:func:`goodput_report`): the run
model, the distribution of time to train and where the wall time went, or a sweep's table and
chart.  Its footer says
which clustersim wrote it: the version, the git commit of the code (``+modified`` when the
checkout had uncommitted changes) and the date, in UTC (``SOURCE_DATE_EPOCH``, when set,
fixes the date, so that a page can be rebuilt byte for byte).
"""

from __future__ import annotations

import base64
import html
import io
import os
import subprocess
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import yaml

__all__ = ["run_report", "compare_report", "provenance", "goodput_section", "goodput_report"]

_CODE_ROOT = Path(__file__).resolve().parents[2]

_STYLE = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 24px auto; max-width: 1500px;
       color: #222; padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; }
.sub { color: #555; margin-top: 0; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
th, td { border: 1px solid #ddd; padding: 4px 10px; text-align: right; }
th { background: #f4f4f4; } td.l, th.l { text-align: left; }
.bad { color: #b00020; font-weight: 600; } .ok { color: #1b7a2b; }
img { max-width: 100%; border: 1px solid #eee; }
pre { background: #f7f7f7; padding: 10px; font-size: 12px; overflow-x: auto; }
ul.whatif li { margin: 2px 0; }
.side { display: flex; flex-wrap: wrap; align-items: flex-start; gap: 16px; }
.side > img { flex: 1 1 640px; min-width: 0; }
"""


def _png(fig) -> str:
    """A matplotlib figure as an ``<img>`` with the PNG inlined."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=fig.dpi)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img alt="chart" src="data:image/png;base64,{data}">'


def _png_file(path: Path) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<img alt="chart" src="data:image/png;base64,{data}">'


def _table(rows: list[list], header: list[str] | None, left: int = 1) -> str:
    def cell(tag, v, i):
        cls = ' class="l"' if i < left else ""
        return f"<{tag}{cls}>{v}</{tag}>"
    out = ["<table>"]
    if header:
        out.append("<tr>" + "".join(cell("th", html.escape(h), i) for i, h in enumerate(header)) + "</tr>")
    for r in rows:
        out.append("<tr>" + "".join(cell("td", v if isinstance(v, str) and v.startswith("<") else html.escape(str(v)), i)
                                    for i, v in enumerate(r)) + "</tr>")
    return "\n".join(out) + "</table>"


def _fit(m: dict) -> str:
    if "memory_fits" not in m:
        return ""
    gb = m["memory_margin_bytes"] / 1e9
    if m["memory_fits"]:
        return f'<span class="ok">fits</span> ({gb:.1f} GB to spare on {html.escape(m["memory_worst_stage"])})'
    return f'<span class="bad">does not fit</span>: {html.escape(m["memory_worst_stage"])} is {-gb:.1f} GB over'


def _likely(res, iv, brief: bool = False) -> str:
    """The 80 % interval ``iv`` of the measured step, with what it rests on (HTML); ``brief``:
    the range and the number of runs only."""
    if brief:
        return (f"<span>{iv.range_text(res.metrics['step_time_s'])} <small>({iv.rows} runs: "
                f"{html.escape(iv.stratum)}{', pooled' if iv.basis.startswith('pooled') else ''})</small></span>"
                if iv.known else "<span>no comparable measurements</span>")
    if not iv.known:
        return f"<span>no comparable measurements <small>({html.escape(iv.stratum)}: {html.escape(iv.basis)})</small></span>"
    return (f"<span>{iv.range_text(res.metrics['step_time_s'])} <small>({iv.level_text()} from {iv.rows} comparable "
            f"measured runs: {html.escape(iv.stratum)}; set {html.escape(', '.join(iv.sets))}; {html.escape(iv.basis)}. "
            f"{html.escape(iv.sign)}; docs/accuracy.md)</small></span>")


_LIKELY_NOTE = html.escape("likely measured step: the 80 % interval of the measured step from the validation "
                           "residuals of comparable measured runs (same kernel stack, GPU generation, model family and "
                           "scope); error = (predicted - measured) / measured, so a model that predicts too fast puts "
                           "the measured step above the prediction (docs/accuracy.md).")


def _summary_rows(m: dict, res=None, interval=None) -> list[list]:
    # a layout that does not fit: every step figure is what the step would take if it did
    hyp = " (hypothetical)" if m.get("memory_fits") is False else ""
    rows = [["step time", f"{m['step_time_s']:.4f} s{hyp}"]] + ([["likely measured", _likely(res, interval)]] if interval is not None else []) + [
            ["MFU", f"{m['mfu']:.1%} ({m.get('flop_convention', '')} FLOPs){hyp}"],
            ["TFLOP/s per GPU", f"{m['tflops_per_gpu']:.1f}{hyp}"], ["tokens/s", f"{m['tokens_per_s']:,.0f}{hyp}"],
            ["peak memory", f"{m['peak_memory_bytes'] / 1e9:.1f} GB"], ["memory", _fit(m) or "-"],
            ["bubble", f"{m['bubble_fraction']:.1%} of the step"],
            ["finished last", m.get("last_ranks", str(m.get("last_cell")))]]
    if m.get("moe_dropped_fraction") is not None:
        rows.append(["dropped tokens", f"{m['moe_dropped_fraction']:.2%}"])
    return rows


def _memory_section(res) -> str:
    rows = []
    for e in res.memory or []:
        terms = ", ".join(f"{k} {v / 1e9:.1f}" for k, v in e.biggest_terms(3))
        verdict = '<span class="ok">fits</span>' if e.fits() else '<span class="bad">over</span>'
        rows.append([e.where, f"{e.total_bytes / 1e9:.1f}", f"{e.hbm_bytes / 1e9:.1f}", verdict, terms])
    if not rows:
        return "<p>No memory estimate.</p>"
    return _table(rows, ["stage", "total GB", "usable HBM GB", "", "biggest terms (GB)"])


def _breakdown_table(breakdown: dict) -> str:
    """The step-time breakdown as a table: each category's time (in its own unit) and share
    of the step, in the chart's order, then the step (the categories' sum)."""
    from .charts import _breakdown_items, fmt_duration

    items, _ = _breakdown_items(breakdown)
    total = sum(v for _, v in items)
    rows = [[k.replace("_", " "), fmt_duration(v), f"{v / total:.1%}" if total > 0 else "-"] for k, v in items]
    rows.append(["<b>step</b>", f"<b>{fmt_duration(total)}</b>", "<b>100.0%</b>" if total > 0 else "-"])
    return _table(rows, ["category", "time", "share of the step"])


def _breakdown_columns(results: Sequence, cols: list[str]) -> str:
    """The breakdown of several runs as one table: a row per category, a column per run."""
    from .charts import fmt_duration

    cats: list[str] = []
    for r in results:
        cats += [k for k in r.metrics["breakdown_s"] if k not in cats]
    rows = [[k.replace("_", " ")] + [fmt_duration(r.metrics["breakdown_s"].get(k, 0.0)) for r in results] for k in cats]
    rows.append(["<b>step</b>"] + [f"<b>{fmt_duration(r.metrics['step_time_s'])}</b>" for r in results])
    return _table(rows, ["category"] + cols)


def _links_section(m: dict) -> str:
    util = m.get("link_utilization") or {}
    if not util:
        return "<p>No link traffic in the reported step.</p>"
    return _table([[k, f"{v:.1%}"] for k, v in util.items()], ["tier", "utilisation in the step"])


def provenance() -> dict:
    """``version`` (the installed package's), ``commit`` (of the code's git checkout, with
    ``+modified`` for uncommitted changes; None outside a checkout) and ``date`` (now, or
    ``SOURCE_DATE_EPOCH``), as the report's footer gives them."""
    from importlib import metadata
    try:
        version = metadata.version("clustersim")
    except metadata.PackageNotFoundError:
        version = "unknown"
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "")
    when = datetime.fromtimestamp(int(epoch), timezone.utc) if epoch.isdigit() else datetime.now(timezone.utc)
    return {"version": version, "commit": _git_commit(_CODE_ROOT), "date": when.strftime("%Y-%m-%d %H:%M UTC")}


def _git_commit(root: Path) -> str | None:
    """``abc123def456`` or ``abc123def456+modified``; None without git or a checkout."""
    def git(*a):
        return subprocess.run(["git", "-C", str(root), *a], capture_output=True, text=True, timeout=10)
    try:
        head = git("rev-parse", "--short=12", "HEAD")
        if head.returncode:
            return None
        dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+modified" if dirty else "")


def _footer() -> str:
    p = provenance()
    commit = f"commit {p['commit']}" if p["commit"] else "not from a git checkout"
    return f"Written by clustersim {p['version']} ({commit}) on {p['date']}."


def _page(title: str, subtitle: str, body: list[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>\n"
            f"<h1>{html.escape(title)}</h1><p class=\"sub\">{html.escape(subtitle)}</p>\n"
            + "\n".join(body) + f"\n<p class=\"sub\">{html.escape(_footer())}</p></body></html>\n")


def run_report(res, path: str | Path, *, name: str | None = None, interval=None) -> Path:
    """Write the report of one run (:class:`simulator.engine.Result`) to ``path``; ``interval``
    (:class:`simulator.validation.intervals.Interval`): the measured step's, shown in the summary."""
    from .charts import breakdown_bar
    from .gantt_chart import gantt

    sc, m = res.scenario, res.metrics
    name = name or sc.name
    tl = res.timeline
    last = tl[tl["step"] == tl["step"].max()]
    by = "stage" if sc.parallel.pp > 1 else "rank"
    gantt_fig = gantt(last, None, by=by, stage_of=res.program.grid.stage_of, max_rows=16, dpi=80,
                      title=f"{name}: {m.get('layout', '')}, step {m['step_time_s']:.4g} s"
                            + (" (hypothetical: does not fit)" if m.get("memory_fits") is False else ""))
    body = []
    if m.get("memory_fits") is False:
        worst = max(res.memory, key=lambda e: e.total_bytes - e.hbm_bytes)
        body.append(f'<p class="bad">DOES NOT FIT: {html.escape(worst.where)} needs {worst.total_bytes / 1e9:.1f} GB '
                    f'of {worst.hbm_bytes / 1e9:.1f} GB of usable HBM. The step time, MFU and throughput below are '
                    f'hypothetical: what the step would take if it fit.</p>')
    if m.get("whatif"):
        body.append("<h2>What-if</h2><ul class=\"whatif\">"
                    + "".join(f"<li>{html.escape(w)}</li>" for w in m["whatif"]) + "</ul>")
    body += ["<h2>Summary</h2>", _table(_summary_rows(m, res, interval), None),
             "<h2>Where the step goes</h2>",
             f"<p>The compute stream of the cell that finishes last ({html.escape(m.get('last_ranks', ''))}).</p>",
             '<div class="side">' + _png(breakdown_bar(m["breakdown_s"], title=f"{name}: step {m['step_time_s']:.4g} s"))
             + _breakdown_table(m["breakdown_s"]) + "</div>",
             "<h2>Gantt chart of the reported step</h2>", _png(gantt_fig),
             "<h2>Memory per pipeline stage</h2>", _memory_section(res),
             "<h2>Link utilisation</h2>", _links_section(m),
             "<h2>Scenario</h2>", f"<pre>{html.escape(yaml.safe_dump(sc.source, sort_keys=False))}</pre>"]
    out = Path(path)
    out.write_text(_page(f"clustersim: {name}", f"{sc.model.name} on {sc.cluster.num_gpus} x {sc.cluster.gpu.name}, "
                                                  f"{m.get('layout', '')}", body))
    return out


def compare_report(results: Sequence, names: Sequence[str], path: str | Path, intervals: Sequence | None = None) -> Path:
    """Write the report comparing several runs (the first is the reference) to ``path``, with each
    run's interval of the measured step when ``intervals`` are given."""
    import tempfile

    from .compare import aligned_gantts, breakdown_comparison, comparison_table, critical_path_table, shown_table

    table = comparison_table(results, names, intervals)
    crit = critical_path_table(results, names)
    cols = [f"[{i + 1}]" for i in range(len(names))]
    ivs = intervals if intervals is not None else [None] * len(results)
    runs = _table([[c, n, r.metrics.get("layout", ""), f"{r.metrics['step_time_s']:.4f} s",
                    f"{r.metrics['step_time_s'] / results[0].metrics['step_time_s']:.3f}x", f"{r.metrics['mfu']:.1%}",
                    *([_likely(r, iv, brief=True)] if intervals is not None else []), _fit(r.metrics) or "-"]
                   for c, n, r, iv in zip(cols, names, results, ivs)],
                  ["", "scenario", "layout", "step", "vs first", "MFU",
                   *(["likely measured step"] if intervals is not None else []), "memory"], left=3)
    if intervals is not None:
        runs += f"<p><small>{_LIKELY_NOTE}</small></p>"
    shown = shown_table(table.drop(columns=["scenario", "layout"]).T, cols)
    metric_rows = [[k] + list(shown.loc[k]) for k in shown.index]
    crit_shown = shown_table(crit[list(names)], cols)
    crit_rows = [[k] + list(crit_shown.loc[k]) for k in crit_shown.index]
    with tempfile.TemporaryDirectory() as tmp:
        gantt_img = _png_file(aligned_gantts(results, names, Path(tmp) / "g.png"))
    body = ["<h2>Runs</h2>", runs,
            "<h2>Side by side</h2>", _table(metric_rows, [""] + cols),
            "<h2>Where the steps go</h2>",
            '<div class="side">' + _png(breakdown_comparison(results, names)) + _breakdown_columns(results, cols)
            + "</div>",
            "<h2>On the critical path</h2>",
            "<p>Seconds per op and per idle reason on the compute stream of the cell that finishes last; "
            "largest change first. Each column sums to its step time.</p>",
            _table(crit_rows, ["op or idle reason"] + cols),
            "<h2>Gantt charts on one time axis</h2>", gantt_img]
    for c, n, r in zip(cols, names, results):
        if r.metrics.get("whatif"):
            body.append(f"<p>{c} what-if: " + html.escape("; ".join(r.metrics["whatif"])) + "</p>")
    out = Path(path)
    out.write_text(_page("clustersim: comparison", " vs ".join(names), body))
    return out


# -- time to train (clustersim goodput) ----------------------------------------------------------
def goodput_section(run: dict | None = None, sweep: dict | None = None) -> list[str]:
    """The time-to-train section of a page, from what ``clustersim goodput`` computed (this
    module draws nothing of it): ``run`` has ``summary`` (label, text rows), ``image`` (a PNG
    path: the distribution and the time lost by kind), ``lost`` (kind, hours, share rows) and
    ``causes`` (cause, mean rows); ``sweep`` has ``image``, ``header``, ``rows`` and ``keys``
    (the number of leading key columns)."""
    body = []
    if run is not None:
        body += ["<h2>Time to train</h2>", _table(run["summary"], None),
                 '<div class="side">' + _png_file(run["image"]) + _table(run["lost"], ["kind", "mean per run", "share"])
                 + "</div>", "<h2>Interruptions per run by cause</h2>", _table(run["causes"], ["cause", "mean"])]
    if sweep is not None:
        body += ["<h2>Time to train across the sweep</h2>",
                 "<p>Every point on the same simulated step and the same seed (common random numbers).</p>",
                 _png_file(sweep["image"]), _table(sweep["rows"], sweep["header"], left=sweep["keys"])]
    return body


def goodput_report(sc, path: str | Path, *, run: dict | None = None, sweep: dict | None = None) -> Path:
    """Write the time-to-train page of ``clustersim goodput`` for the scenario ``sc`` to
    ``path`` (:func:`goodput_section`, then the scenario)."""
    body = goodput_section(run, sweep)
    body += ["<h2>Scenario</h2>", f"<pre>{html.escape(yaml.safe_dump(sc.source, sort_keys=False))}</pre>"]
    out = Path(path)
    out.write_text(_page(f"clustersim goodput: {sc.name}",
                         f"{sc.model.name} on {sc.cluster.num_gpus:,} x {sc.cluster.gpu.name}, "
                         f"{sc.parallel.describe()}", body))
    return out
