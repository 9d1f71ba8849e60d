"""Gantt / breakdown plots and trace / table export, on synthetic 1F1B timelines built here."""

import gzip
import json
import struct
import time

import numpy as np
import pandas as pd
import pytest

from simulator import report
from simulator.report import trace
from simulator.report.trace import TIMELINE_COLUMNS

MS = 1e-3


def synthetic_timeline(pp=4, ranks_per_stage=1, num_microbatches=8, layers_per_stage=2, gpus_per_node=8,
                       num_steps=1):
    """A 1F1B pipeline step with TP collectives, PP send/recv, DP gradient reduction and step end.

    Stage s runs layers [s*L, (s+1)*L); ranks are stage-major (rank = s*ranks_per_stage + j,
    pp outermost); every rank of a stage runs the same ops (shifted by 1 µs per rank so rows
    differ). Forward: attn, blocking TP reduce-scatter, mlp, TP all-gather per layer; backward:
    recompute_attn (R), attn_bwd / mlp_bwd (B), wgrad (W) with TP collectives; the last
    micro-batch's backward issues one DP reduce-scatter per layer; the step ends with a DP
    grad-norm all-reduce, the optimizer and a DP parameter all-gather.
    """
    M, L = num_microbatches, layers_per_stage
    rows = []

    def op(s, stream, kind, name, layer, m, phase, axis, t0, dur, flops=0.0, size=0.0):
        rows.append((s, stream, kind, name, layer, m, phase, axis, t0, t0 + dur, flops, size))
        return t0 + dur

    def forward(s, m, t):
        if s > 0:
            op(s, "pp", "recv", "recv_act", -1, m, "F", "pp", t - 0.2 * MS, 0.2 * MS, size=16e6)
        if s == 0:
            t = op(s, "compute", "compute", "embedding", -1, m, "F", "", t, 0.2 * MS, 1e9)
        for l in range(L):
            layer = s * L + l
            t = op(s, "compute", "compute", "attn", layer, m, "F", "", t, 1.0 * MS, 4e11)
            t = op(s, "tp", "collective", "sp_rs", layer, m, "F", "tp", t, 0.15 * MS, size=8e6)
            t = op(s, "compute", "compute", "mlp", layer, m, "F", "", t, 1.4 * MS, 6e11)
            t = op(s, "tp", "collective", "sp_ag", layer, m, "F", "tp", t, 0.15 * MS, size=8e6)
        if s == pp - 1:
            t = op(s, "compute", "compute", "output_loss", -1, m, "F", "", t, 0.6 * MS, 2e11)
        else:
            t = op(s, "pp", "send", "send_act", -1, m, "F", "pp", t, 0.2 * MS, size=16e6)
        return t

    def backward(s, m, t, dp_free):
        if s < pp - 1:
            op(s, "pp", "recv", "recv_grad", -1, m, "B", "pp", t - 0.2 * MS, 0.2 * MS, size=16e6)
        for l in reversed(range(L)):
            layer = s * L + l
            t = op(s, "compute", "compute", "recompute_attn", layer, m, "R", "", t, 0.5 * MS, 2e11)
            t = op(s, "compute", "compute", "mlp_bwd", layer, m, "B", "", t, 1.4 * MS, 6e11)
            t = op(s, "tp", "collective", "sp_rs_bwd", layer, m, "B", "tp", t, 0.15 * MS, size=8e6)
            t = op(s, "compute", "compute", "attn_bwd", layer, m, "B", "", t, 1.0 * MS, 4e11)
            t = op(s, "compute", "compute", "wgrad", layer, m, "W", "", t, 1.2 * MS, 5e11)
            if m == M - 1:                       # gradient reduction overlaps the last backward
                dp_free = op(s, "dp", "collective", "grad_dense", layer, -1, "B", "dp", max(t, dp_free),
                             2.0 * MS, size=2e8)
        if s > 0:
            t = op(s, "pp", "send", "send_grad", -1, m, "B", "pp", t, 0.2 * MS, size=16e6)
        return t, dp_free

    # 1F1B action lists and a dependency-driven fix point for the start times
    actions = []
    for s in range(pp):
        w = min(pp - s - 1, M)
        a = [("F", m) for m in range(w)]
        for i in range(M - w):
            a += [("F", w + i), ("B", i)]
        a += [("B", m) for m in range(M - w, M)]
        actions.append(a)
    t_step = 0.0
    step_of_row = []
    for step in range(num_steps):
        done = {}
        free = [t_step] * pp
        dp_free = [t_step] * pp
        pos = [0] * pp
        while any(pos[s] < len(actions[s]) for s in range(pp)):
            for s in range(pp):
                if pos[s] == len(actions[s]):
                    continue
                k, m = actions[s][pos[s]]
                dep = (s - 1, "F", m) if k == "F" else ((s + 1, "B", m) if s < pp - 1 else (s, "F", m))
                if dep[0] >= 0 and dep not in done and not (k == "F" and s == 0):
                    continue
                ready = done.get(dep, t_step) + (0.2 * MS if dep[0] != s and dep in done else 0.0)
                t = max(free[s], ready)
                if k == "F":
                    free[s] = forward(s, m, t)
                else:
                    free[s], dp_free[s] = backward(s, m, t, dp_free[s])
                done[(s, k, m)] = free[s]
                pos[s] += 1
        end = max(max(free), max(dp_free))
        for s in range(pp):
            t = op(s, "dp", "collective", "grad_norm", -1, -1, "S", "dp", end, 0.1 * MS, size=4.0)
            t = op(s, "compute", "compute", "optimizer", -1, -1, "S", "", t, 1.5 * MS, 1e9)
            op(s, "dp", "collective", "param_gather", -1, -1, "S", "dp", t, 1.5 * MS, size=1e9)
        step_of_row += [step] * (len(rows) - len(step_of_row))
        t_step = end + 3.2 * MS

    base = pd.DataFrame(rows, columns=["stage", "stream", "kind", "name", "layer", "microbatch", "phase", "axis",
                                       "start_s", "end_s", "flops", "size_bytes"])
    base["step"] = step_of_row
    parts = []
    for j in range(ranks_per_stage):
        d = base.copy()
        d["rank"] = d["stage"] * ranks_per_stage + j
        d["start_s"] += j * 1e-6
        d["end_s"] += j * 1e-6
        parts.append(d)
    df = pd.concat(parts, ignore_index=True)
    df["node"] = df["rank"] // gpus_per_node
    df["chunk"] = 0
    cols = list(TIMELINE_COLUMNS) + (["step"] if num_steps > 1 else [])
    df = df.sort_values(["rank", "start_s"], kind="stable").reset_index(drop=True)
    return df[cols + ["stage"]].drop(columns="stage")


def png_size(path):
    """(width, height) from a PNG's IHDR chunk."""
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


@pytest.fixture(scope="module")
def tl4():
    return synthetic_timeline(pp=4, num_microbatches=8)


@pytest.fixture(scope="module")
def tl64():
    """64 ranks (4 stages x 16), about 20k ops."""
    return synthetic_timeline(pp=4, ranks_per_stage=16, num_microbatches=15, layers_per_stage=2)


def test_synthetic_timeline_shape(tl4, tl64):
    assert list(tl4.columns) == list(TIMELINE_COLUMNS)
    assert (tl4["end_s"] >= tl4["start_s"]).all()
    assert set(tl4["phase"]) == {"F", "B", "W", "R", "S"}
    assert set(tl4["stream"]) == {"compute", "tp", "pp", "dp"}
    assert tl64["rank"].nunique() == 64 and len(tl64) >= 20_000
    # compute ops never overlap on one rank's compute stream
    c = tl4[tl4["stream"] == "compute"].sort_values(["rank", "start_s"])
    for _, g in c.groupby("rank"):
        assert (g["start_s"].to_numpy()[1:] >= g["end_s"].to_numpy()[:-1] - 1e-12).all()


# ---- gantt -------------------------------------------------------------------------------------

def _labels(fig, which="labels:compute"):
    """Strings drawn inside bars (one glyph PathCollection per kind of label)."""
    out = []
    for c in fig.axes[0].collections:
        if c.get_gid() == which:
            out += list(c.label_texts)
    return out


def test_gantt_4_ranks_png(tl4, tmp_path):
    p = tmp_path / "g4.png"
    fig = report.gantt(tl4, p)
    assert p.stat().st_size > 20_000
    w, h = png_size(p)
    assert w == 1500 and 300 <= h <= 1200
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0 · host 0", "rank 1 · host 0", "rank 2 · host 0", "rank 3 · host 0"]
    assert "ms" in ax.get_xlabel()
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    for want in ("forward (F)", "backward, input grad (B)", "weight grad (W)", "recompute (R)",
                 "optimizer / step end (S)", "TP comm", "PP send/recv", "DP comm"):
        assert want in legend
    assert "CP comm" not in legend                  # only axes that occur
    # micro-batch numbers drawn inside wide bars, at most one per forward / backward pass
    texts = _labels(fig)
    assert {str(m) for m in range(8)} <= set(texts) <= {str(m) for m in range(8)} | {"optimizer"}
    assert 20 <= len(texts) <= 4 * 8 * 2 + 4
    assert _labels(fig, "labels:lanes") == ["tp", "pp", "dp"] * 4


def test_gantt_64_ranks_fast_and_capped(tl64, tmp_path):
    p = tmp_path / "g64.png"
    t = time.thread_time()              # CPU time: other processes on a loaded machine don't count
    fig = report.gantt(tl64, p)
    elapsed = time.thread_time() - t
    assert elapsed < 4.0, f"gantt of {len(tl64)} ops took {elapsed:.2f} s"
    w, h = png_size(p)
    assert w == 1500 and 2000 <= h <= 3400          # grows with rows, capped
    assert len(fig.axes[0].get_yticklabels()) == 64
    assert len(_labels(fig)) > 500                  # still legible: micro-batch numbers drawn


def test_gantt_subsets_rows(tl64, tmp_path):
    fig = report.gantt(tl64, tmp_path / "sub.png", max_rows=8)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert len(labels) == 8 and labels[0].startswith("rank 0 ") and labels[-1].startswith("rank 63 ")
    assert "showing 8 of 64 ranks" in fig.texts[0].get_text()
    _, h = png_size(tmp_path / "sub.png")
    assert h < 1800

    fig = report.gantt(tl64, ranks=[5, 3, 40])
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["rank 3 · host 0", "rank 5 · host 0", "rank 40 · host 5"]
    with pytest.raises(ValueError, match=r"ranks \[99\]"):
        report.gantt(tl64, ranks=[1, 99])


def test_gantt_by_stage(tl64):
    # inferred from layers, from a mapping, and from a 'stage' column: same 4 rows
    fig = report.gantt(tl64, by="stage")
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["stage 0 · rank 0 · host 0", "stage 1 · rank 16 · host 2", "stage 2 · rank 32 · host 4",
                      "stage 3 · rank 48 · host 6"]
    assert "inferred" in fig.texts[0].get_text()
    fig = report.gantt(tl64, by="stage", stage_of={r: r // 16 for r in range(64)}, ranks=range(4, 64))
    assert next(t.get_text() for t in fig.axes[0].get_yticklabels()) == "stage 0 · rank 4 · host 0"
    fig = report.gantt(tl64.assign(stage=tl64["rank"] // 16), by="stage", stage_of=None)
    assert len(fig.axes[0].get_yticklabels()) == 4
    with pytest.raises(ValueError, match="stage_of has no stage for rank"):
        report.gantt(tl64, by="stage", stage_of={0: 0})
    with pytest.raises(ValueError, match="by must be"):
        report.gantt(tl64, by="node")


def test_gantt_step_and_chunks(tmp_path):
    tl = synthetic_timeline(pp=2, num_microbatches=4, num_steps=2)
    assert set(tl["step"]) == {0, 1}
    fig_all = report.gantt(tl)
    fig_last = report.gantt(tl, step=-1)
    assert "step 1" in fig_last.texts[0].get_text()
    assert fig_last.axes[0].get_xlim()[1] < 0.6 * fig_all.axes[0].get_xlim()[1]
    assert "from t =" in fig_last.axes[0].get_xlabel()
    with pytest.raises(ValueError, match="steps present"):
        report.gantt(tl, step=5)
    with pytest.raises(ValueError, match="no 'step' column"):
        report.gantt(tl.drop(columns="step"), step=0)
    # virtual-pipeline chunks: legend explains the lighter shade
    tl2 = tl.assign(chunk=np.where(tl["microbatch"] % 2 == 1, 1, 0))
    fig = report.gantt(tl2, tmp_path / "chunks.png")
    assert any("later model chunk" in t.get_text() for t in fig.legends[0].get_texts())


def test_gantt_rejects_bad_input(tl4):
    with pytest.raises(ValueError, match="missing column"):
        report.gantt(tl4.drop(columns="phase"))
    with pytest.raises(ValueError, match="empty"):
        report.gantt(tl4.iloc[:0])


def test_gantt_long_run_in_seconds():
    tl = synthetic_timeline(pp=2, num_microbatches=2)
    tl = tl.assign(start_s=tl["start_s"] * 2000, end_s=tl["end_s"] * 2000)
    fig = report.gantt(tl)
    assert fig.axes[0].get_xlabel().startswith("time (s)")


def test_breakdown_bar(tmp_path):
    bd = {"compute": 0.61, "recompute": 0.12, "bubble": 0.09, "exposed_tp": 0.05, "exposed_cp": 0.0,
          "exposed_ep": 0.01, "exposed_pp": 0.03, "exposed_dp": 0.02}
    p = tmp_path / "bd.png"
    fig = report.breakdown_bar(bd, p)
    assert p.stat().st_size > 10_000
    w, h = png_size(p)
    assert w == 1000 and 300 <= h <= 700
    assert "930 ms" in fig.texts[0].get_text()
    texts = [t.get_text() for t in fig.axes[1].texts]
    assert any("610 ms" in t and "65.6%" in t for t in texts)
    assert report.breakdown_bar({**bd, "total": 0.93}).texts[0].get_text() == fig.texts[0].get_text()
    with pytest.raises(ValueError, match="negative"):
        report.breakdown_bar({"compute": 1.0, "bubble": -0.5})
    with pytest.raises(ValueError, match="empty"):
        report.breakdown_bar({})


def test_report_does_not_import_matplotlib_at_import_time():
    import subprocess
    import sys
    code = "import sys, simulator.report; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---- chrome trace ------------------------------------------------------------------------------

def test_chrome_trace(tl64, tmp_path):
    p = tmp_path / "trace.json"
    t = trace.to_chrome_trace(tl64, p, metadata={"step_time_s": np.float64(0.25), "ranks": np.arange(3),
                                                 "mfu": float("nan")})
    with open(p) as f:
        loaded = json.load(f)
    assert loaded == t
    assert loaded["displayTimeUnit"] == "ms"
    assert loaded["otherData"]["step_time_s"] == 0.25 and loaded["otherData"]["ranks"] == [0, 1, 2]
    assert loaded["otherData"]["mfu"] is None
    events = loaded["traceEvents"]
    x = [e for e in events if e["ph"] == "X"]
    assert len(x) == len(tl64)
    assert all(e["dur"] >= 0 for e in x)
    assert all(isinstance(e["ts"], float) and isinstance(e["pid"], int) for e in x)

    meta = [e for e in events if e["ph"] == "M"]
    pname = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    tname = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    tsort = {(e["pid"], e["tid"]): e["args"]["sort_index"] for e in meta if e["name"] == "thread_sort_index"}
    assert pname == {n: f"host {n}" for n in range(8)}
    # one named thread per (rank, stream), pid = node
    pairs = tl64[["rank", "stream", "node"]].drop_duplicates()
    assert len(tname) == len(pairs)
    thread_of = {}
    for e in x:
        r = e["args"]["rank"]
        assert e["pid"] == r // 8
        thread_of.setdefault(tname[(e["pid"], e["tid"])], set()).add((r, e["pid"]))
    for r, s, n in pairs.itertuples(index=False):
        assert thread_of[f"rank {r} {s}"] == {(r, n)}
    # tid = rank * 10 + fixed stream index (compute 0, tp 1, cp 2, ep 3, pp 4, dp 5)
    for (_, tid), name in tname.items():
        assert name == f"rank {tid // 10} {trace.STREAM_ORDER[tid % 10]}"
    # threads sort in rank order, compute first
    by_sort = [tname[k] for k in sorted(tsort, key=tsort.get)]
    assert by_sort[:3] == ["rank 0 compute", "rank 0 tp", "rank 0 pp"]
    assert [int(n.split()[1]) for n in by_sort] == sorted(int(n.split()[1]) for n in by_sort)

    # values: microseconds, categories, args
    e0 = x[0]
    row = tl64.iloc[0]
    assert e0["ts"] == pytest.approx(row["start_s"] * 1e6, abs=1e-3)
    assert e0["dur"] == pytest.approx((row["end_s"] - row["start_s"]) * 1e6, abs=2e-3)
    assert set(e0["args"]) == {"rank", "layer", "microbatch", "chunk", "phase", "axis", "flops", "size_bytes"}
    cats = {e["cat"] for e in x}
    assert {"compute", "collective,tp", "collective,dp", "send,pp", "recv,pp"} == cats


def test_chrome_trace_gzip_step_and_nan(tmp_path):
    tl = synthetic_timeline(pp=2, num_microbatches=2, num_steps=2)
    tl.loc[0, "flops"] = np.nan
    tl.loc[1, "end_s"] = tl.loc[1, "start_s"] - 1e-9         # clock noise: never a negative duration
    p = trace.write_chrome(tl, tmp_path / "t.json.gz")
    with gzip.open(p, "rt") as f:
        loaded = json.load(f)
    x = [e for e in loaded["traceEvents"] if e["ph"] == "X"]
    assert x[0]["args"]["flops"] is None and x[1]["dur"] == 0.0
    assert {e["args"]["step"] for e in x} == {0, 1}
    with pytest.raises(ValueError, match="missing column"):
        trace.to_chrome_trace(tl.drop(columns="node"))


def test_estimate_trace_bytes_is_exact_when_small_and_close_at_scale(tl4, tl64):
    """The estimate converts a sample of rows and scales by the row count: exact up to the
    sample size, within a few percent on 64 ranks (about 20k rows) and cheap to compute."""
    small = tl4.iloc[:200]
    exact = len(json.dumps(trace.to_chrome_trace(small), separators=(",", ":")).encode())
    assert trace.estimate_trace_bytes(small) == exact
    full = len(json.dumps(trace.to_chrome_trace(tl64), separators=(",", ":")).encode())
    t0 = time.perf_counter()
    est = trace.estimate_trace_bytes(tl64)
    assert time.perf_counter() - t0 < 1.0
    assert abs(est - full) / full < 0.05
    assert trace.estimate_trace_bytes(tl64.iloc[:0]) > 0          # an empty trace is still a JSON object


# ---- tables ------------------------------------------------------------------------------------

def test_timeline_csv_round_trip(tl4, tmp_path):
    p = trace.write_timeline(tl4, tmp_path / "timeline.csv")
    back = pd.read_csv(p)
    assert list(back.columns) == list(tl4.columns)
    back["axis"] = back["axis"].fillna("")                 # plain read_csv reads '' as NaN
    pd.testing.assert_frame_equal(back, tl4, check_exact=False, rtol=1e-12)
    back2 = trace.read_timeline(p)                         # read_timeline keeps '' as ''
    pd.testing.assert_frame_equal(back2, tl4, check_exact=False, rtol=1e-12)
    assert (back2["axis"] == "").sum() == (tl4["axis"] == "").sum()


def test_timeline_parquet(tl4, tmp_path):
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pyarrow"):
            trace.write_timeline(tl4, tmp_path / "timeline.parquet")
        return
    p = trace.write_timeline(tl4, tmp_path / "timeline.parquet")
    pd.testing.assert_frame_equal(trace.read_timeline(p), tl4)


def test_comm_labels_never_overlap_in_a_lane():
    import numpy as np
    from simulator.report.gantt_chart import _no_overlap
    # two bars in flight together in lane 0 (a send and a receive) would print one name over
    # the other: only the first is kept; another lane is independent
    lane = np.array([0, 0, 0, 1])
    center = np.array([100.0, 110.0, 300.0, 110.0])
    width = np.array([40.0, 40.0, 40.0, 40.0])
    assert _no_overlap(lane, center, width).tolist() == [True, False, True, True]


# ---- units by magnitude, labels never clipped ---------------------------------------------------

def test_time_unit_and_durations_follow_the_magnitude():
    from simulator.report.charts import fmt_duration
    from simulator.report.style import time_unit
    assert [time_unit(x)[0] for x in (5e-4, 2e-3, 0.93, 1.0, 8.74, 300.0)] == ["µs", "ms", "ms", "s", "s", "s"]
    assert [fmt_duration(x) for x in (6.0012, 0.151, 0.00772, 4.15e-5, 0.0)] == \
        ["6.00 s", "151 ms", "7.72 ms", "41.5 µs", "0 s"]


def test_breakdown_of_a_seconds_long_step_reads_in_seconds():
    """An 8.74 s step: the axis and title in seconds, each category in its own magnitude; no
    "8.74e+03 ms" anywhere."""
    bd = {"compute": 6.0, "recompute": 0.151, "bubble": 0.751, "exposed_tp": 1.8, "exposed_dp": 0.00415,
          "host_issue": 0.03}
    fig = report.breakdown_bar(bd)
    texts = [fig.texts[0].get_text(), *(t.get_text() for t in fig.axes[1].texts)]
    assert texts[0] == "Step-time breakdown: 8.74 s" and fig.axes[1].get_xlabel() == "time (s)"
    assert any(t.startswith("6.00 s") for t in texts) and any(t.startswith("4.15 ms") for t in texts)
    assert not any("e+" in t for t in texts)


def _labels_inside(fig) -> bool:
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return all(t.get_window_extent(renderer).x0 >= 0 for t in fig.axes[0].get_yticklabels())


def test_long_row_labels_widen_the_chart_instead_of_being_clipped():
    """'stage 7 · rank 112 · host 14' was cut to 'tage 7 ...' at the figure's edge: the chart
    now grows on the left, keeping its plot width (so its time scale)."""
    tl = synthetic_timeline(pp=8, ranks_per_stage=16, num_microbatches=8, layers_per_stage=1)
    fig = report.gantt(tl, by="stage", stage_of=lambda r: r // 16, max_rows=16, dpi=80)
    assert fig.axes[0].get_yticklabels()[-1].get_text() == "stage 7 · rank 112 · host 14"
    assert _labels_inside(fig) and fig.get_figwidth() > 15.0
    ax = fig.axes[0]
    assert ax.get_position().width * fig.get_figwidth() == pytest.approx(15.0 - 2.3 - 0.3)
    short = report.gantt(synthetic_timeline(pp=2, num_microbatches=2), dpi=80)
    assert short.get_figwidth() == 15.0 and _labels_inside(short)


def test_compare_charts_keep_long_names_and_align_their_time_axes(tmp_path):
    """The compare breakdown keeps a long run name inside the figure; aligned Gantt charts of
    a narrow and a widened chart start their time axes at the same pixel."""
    from types import SimpleNamespace

    import matplotlib.image as mpimg

    from simulator.report import compare

    def result(tl, pp, rps):
        step = float(tl["end_s"].max())
        return SimpleNamespace(timeline=tl.assign(step=0),
                               metrics={"step_time_s": step, "mfu": 0.4, "breakdown_s": {"compute": step}},
                               program=SimpleNamespace(grid=SimpleNamespace(stage_of=lambda r: r // rps)),
                               scenario=SimpleNamespace(parallel=SimpleNamespace(tp=1, pp=pp, dp=rps, cp=1, ep=1,
                                                                                 vpp=1, schedule="1f1b")))
    runs = [result(synthetic_timeline(pp=2, num_microbatches=2), 2, 1),
            result(synthetic_timeline(pp=8, ranks_per_stage=16, num_microbatches=8, layers_per_stage=1), 8, 16)]
    monkey = pytest.MonkeyPatch()
    monkey.setattr(compare, "layout_label", lambda r: f"PP{r.scenario.parallel.pp}")
    try:
        names = ["a", "a very long scenario name + parallel.pp=8, parallel.tp=4, num_steps=1"]
        fig = compare.breakdown_comparison(runs, names)
        assert _labels_inside(fig)
        img = mpimg.imread(compare.aligned_gantts(runs, names, tmp_path / "g.png"))
    finally:
        monkey.undo()
    # the left spine of each chart: the first column, scanning from the left, dark on many rows
    dark = (img[..., :3].mean(axis=2) < 0.3)
    half = img.shape[0] // 2
    cols = [int(np.argmax(dark[:half].sum(axis=0) > 50)), int(np.argmax(dark[half:].sum(axis=0) > 50))]
    assert cols[0] == cols[1] > 0
