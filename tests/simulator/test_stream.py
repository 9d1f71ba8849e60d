"""A streamed timeline (simulator.engine.stream): per-rank summaries of every rank, full rows
only for the ranks asked for, and the same metrics, bit for bit, as from the full timeline."""

from __future__ import annotations

import copy
import json

import pytest

from simulator import run
from simulator.cli import main
from tests.golden.cases import DIGESTS, cases, metrics_digest
from topologies import ConfigError

JITTER = {"model": "tiny-dense", "cluster": {"preset": "dgx-h100", "num_nodes": 4}, "num_steps": 2,
          "parallel": {"tp": 2, "pp": 2, "dp": -1, "global_batch_size": 64, "seq_len": 1024},
          "whatif": {"jitter": {"scope": "gpu_step", "dist": "lognormal(0, 0.05)"}}}
EFFORT = {"wall_time_s", "fold"}


def _metrics(res) -> dict:
    m = {k: v for k, v in res.metrics.items() if k not in EFFORT}
    return {**m, "fold": {k: v for k, v in res.metrics["fold"].items() if k != "wall_s"}}


def test_streamed_jitter_run_equals_the_full_one_bit_for_bit():
    """Per-GPU jitter, every rank its own cell: the streamed run's metrics, per-rank
    summaries and the kept ranks' rows are those of the full run exactly."""
    full = run(copy.deepcopy(JITTER), timeline="full")
    kept = [5, 17]
    st = run(copy.deepcopy(JITTER), timeline="stream", timeline_ranks=kept)
    assert full.stream is None and st.stream is not None
    assert full.folding.num_cells == 32
    assert _metrics(st) == _metrics(full)
    assert st.stream.n_rows == len(full.timeline)
    a, b = full.rank_summary(), st.rank_summary()
    assert a.equals(b) and len(a) == 32
    # every rank's breakdown sums to the step time
    t0, t1 = full.step_bounds[-1]
    parts = a.drop(columns=["rank", "stage", "cell", "end_s"]).sum(axis=1)
    assert (abs(parts - (t1 - t0)) < 1e-9).all()
    # the kept ranks' rows, and no others
    assert set(st.timeline["cell"]) == {st.folding.cells.index((r,)) for r in kept}
    assert st.rank_timeline(kept).reset_index(drop=True).equals(full.rank_timeline(kept).reset_index(drop=True))


STORED = json.loads(DIGESTS.read_text())
SAMPLE = ["1f1b", "interleaved", "zb-h1", "dualpipe-moe", "zero3", "cp2", "ep4-zipf", "host-eager", "recompute-full",
          "tp-comm-overlap", "jitter-step", "slow-gpu", "unfolded-jitter", "unfolded-interleaved-zero3", "one-step",
          "free-comm"]


@pytest.mark.parametrize("name", SAMPLE)
def test_streamed_metrics_equal_the_stored_golden_digest(name):
    """Every schedule and overlap path of the sample, streamed with no rows kept: the metrics
    digest is the stored one of the full run."""
    sc, kw = cases()[name]
    res = run(copy.deepcopy(sc), **kw, timeline="stream")
    assert res.stream is not None and res.timeline.empty
    assert metrics_digest(res) == STORED[name]["metrics"]


def test_auto_streams_only_when_the_full_timeline_would_not_fit(monkeypatch):
    from simulator.engine.simulate import ROW_BYTES, STREAM_ROW_BYTES
    assert STREAM_ROW_BYTES < ROW_BYTES
    assert run(copy.deepcopy(JITTER)).stream is None            # fits: full, as before
    # a budget the full timeline (~19k rows x ROW_BYTES) overruns but the streamed one fits
    rows = 18944
    gb = (300 * 2**20 + rows * (ROW_BYTES + STREAM_ROW_BYTES) / 2) / 2**30
    monkeypatch.setenv("CLUSTERSIM_MEMORY_BUDGET_GB", f"{gb:.6f}")
    res = run(copy.deepcopy(JITTER))
    assert res.stream is not None and res.timeline.empty
    with pytest.raises(ConfigError, match="memory budget"):
        run(copy.deepcopy(JITTER), timeline="full")
    # even the summaries do not fit: refused before simulating, saying so
    monkeypatch.setenv("CLUSTERSIM_MEMORY_BUDGET_GB", "0.29")
    with pytest.raises(ConfigError, match="streamed"):
        run(copy.deepcopy(JITTER))


def test_bad_timeline_options_are_refused():
    with pytest.raises(ConfigError, match="timeline"):
        run(copy.deepcopy(JITTER), timeline="some")
    with pytest.raises(ConfigError, match="timeline_ranks"):
        run(copy.deepcopy(JITTER), timeline="stream", timeline_ranks=[32])


def test_cli_streams_keeps_the_stages_asked_for_and_writes_the_summaries(tmp_path, capsys):
    import pandas as pd
    import yaml
    p = tmp_path / "jitter.yaml"
    p.write_text(yaml.safe_dump(JITTER))
    outs = {}
    for mode in ("full", "stream"):
        out = tmp_path / mode
        assert main(["run", str(p), "--timeline", mode, "--stages", "1", "--out", str(out), "--json"]) == 0
        outs[mode] = out
    err = capsys.readouterr().err
    assert "timeline streamed" in err and "16 ranks" in err
    for f in ("rank_summary.csv", "timeline_ranks.csv"):
        assert (outs["full"] / f).read_text() == (outs["stream"] / f).read_text()
    assert pd.read_csv(outs["stream"] / "timeline_ranks.csv")["rank"].nunique() == 16
    assert len(pd.read_csv(outs["stream"] / "rank_summary.csv")) == 32


def test_the_invariants_refuse_a_streamed_run():
    from simulator.engine.invariants import check_invariants
    res = run(copy.deepcopy(JITTER), timeline="stream")
    with pytest.raises(ConfigError, match="timeline"):
        check_invariants(res)


@pytest.mark.parametrize("name", ["1f1b", "interleaved", "dualpipe-moe", "ep4-zipf", "host-eager", "slow-gpu",
                                  "unfolded-jitter", "one-step", "free-comm"])
def test_metrics_from_the_recorded_rows_equal_those_from_the_frame(name):
    """A run computes its metrics from the recorder's rows without building the timeline's
    frame (built when first asked for); from the frame they are the same bit for bit."""
    from simulator.engine import metrics

    sc, kw = cases()[name]
    res = run(copy.deepcopy(sc), **kw, timeline="full")
    n_rows = len(res.timeline_rows())               # the run did not build the frame
    t0, t1 = res.step_bounds[-1]
    from_rows, summary = metrics._last_step(res, t0, t1), metrics.summarize(res)
    assert len(res.timeline) == n_rows
    assert res.timeline_rows() is None              # built: the metrics now read the frame
    assert metrics._last_step(res, t0, t1) == from_rows
    assert metrics.summarize(res) == summary


@pytest.mark.parametrize("name", ["1f1b", "dualpipe-moe", "ep4-zipf", "unfolded-jitter", "free-comm"])
def test_the_timeline_frame_equals_the_one_from_plain_lists(name):
    """The frame's numeric columns go to pandas as int64 / float64 arrays; the frame is the
    one pandas infers from the plain lists, dtypes and values exactly."""
    import pandas as pd

    from simulator.engine.simulate import _numeric_column
    from workloads.ops import Op

    sc, kw = cases()[name]
    res = run(copy.deepcopy(sc), **kw, timeline="full")
    rows = res.timeline_rows()
    ops, rank, node, stream, axis, start, end, step, cell = zip(*rows)
    f = dict(zip(Op._fields, zip(*ops)))
    plain = pd.DataFrame({"rank": list(rank), "node": list(node), "stream": list(stream), "kind": list(f["kind"]),
                          "name": list(f["name"]), "layer": list(f["layer"]), "microbatch": list(f["microbatch"]),
                          "chunk": list(f["chunk"]), "phase": list(f["phase"]), "axis": list(axis),
                          "start_s": list(start), "end_s": list(end), "flops": list(f["flops"]),
                          "size_bytes": list(f["size_bytes"]), "step": list(step), "cell": list(cell)})
    pd.testing.assert_frame_equal(res.timeline, plain, check_exact=True)
    # values pandas would not read as int64 / float64 stay a list for it to decide
    for values in ((True, 1), (1, None), (2**70, 1), ("a", 1.0)):
        assert isinstance(_numeric_column(values), list)
    assert _numeric_column((0, 1.5)).dtype == "float64" and _numeric_column((3, 4)).dtype == "int64"
