"""Measured kernel tables (workloads/costs/kernel_tables.py): interpolation, fallback to the
roofline outside a table, provenance per op and the measured share of a run."""

import copy
import csv
import math

import pytest

from topologies import ConfigError
from workloads.blocks.kernels import AttentionShape, ComputeOp
from workloads.costs.compute import RooflineComputeModel
from workloads.costs.kernel_tables import (KERNEL_TABLE_DIR, AttentionTables, KernelTable, attention_table_flops,
                                           default_attention_tables)

UNSUSTAINED = {"gemm": 1.0, "attention": 1.0}     # the benchmark's own clock


def _shape(seq, d_qk=128, d_v=128, mask="causal", window=None, q_len=None, backend="te_fused", heads=64):
    return AttentionShape(2, heads, 8, q_len or seq, seq, d_qk, d_v, mask, window, 1, backend)


def _op(shape, phase="F"):
    fwd = 2.0 * shape.batch * shape.heads * (shape.d_qk + shape.d_v) * shape.q_len * shape.kv_len / 2
    return ComputeOp("core_attn", phase, "attention", fwd * (1 if phase == "F" else 2.5), shape.q_len, shape.kv_len,
                     shape.d_qk, 1e6, 1, 0, attention=shape)


def _csv_rate(gpu, dtype, seq, phase, d_qk=128, d_v=128, window=""):
    with (KERNEL_TABLE_DIR / "cudnn_sdpa.csv").open() as f:
        for r in csv.DictReader(f):
            if (r["gpu"], r["kernel"], r["dtype"], r["mask"], r["d_qk"], r["d_v"], r["window"], r["seq_len"],
                    r["phase"]) == (gpu, "cudnn", dtype, "causal", str(d_qk), str(d_v), window, str(seq), phase) \
                    and r["cudnn"] == "92200":
                return float(r["tflops"])
    raise AssertionError("no such row")


def test_a_table_point_is_reproduced_exactly():
    m = RooflineComputeModel("GB200", sustained=UNSUSTAINED)
    for phase in "FB":
        shape = _shape(8192)
        cost = m.op_cost(_op(shape, phase))
        assert cost.source == "measured" and cost.table == "cudnn on GB200"
        rate = _csv_rate("GB200", "bf16", 8192, phase)
        assert cost.compute_s == pytest.approx(attention_table_flops(shape, phase) / (rate * 1e12), rel=1e-12)
        assert cost.memory_s == 0.0


def test_interpolation_is_linear_in_log_sequence_between_points():
    t = KernelTable("attention", "k", "G", "bf16", ("causal", None, 128, 128), "F", (2048, 8192), (100.0, 300.0),
                    ("a", "b"))
    assert t.rate_at(2048) == 100.0 and t.rate_at(8192) == 300.0
    assert t.rate_at(4096) == pytest.approx(200.0)
    assert t.rate_at(1024) is None and t.rate_at(16384) is None


def test_the_roofline_times_what_lies_outside_a_table():
    tabled = RooflineComputeModel("GB200")
    bare = RooflineComputeModel("GB200", kernel_tables=False)
    for shape in (_shape(1024),                          # below the measured range (2k-32k)
                  _shape(65536),                         # above it
                  _shape(8192, q_len=2048),              # a context-parallel share: queries != keys
                  _shape(8192, d_qk=96, d_v=96),         # head dims no table holds
                  _shape(8192, backend="flash")):        # a backend without measured tables
        op = _op(shape)
        assert tabled.op_source(op) == "model"
        assert tabled.op_time_s(op) == bare.op_time_s(op)


def test_ampere_runs_transformer_engine_attention_from_the_model():
    op = _op(_shape(8192))
    assert RooflineComputeModel("A100").op_source(op) == "model"


def test_substituted_gpus_say_how():
    m = RooflineComputeModel("B200", sustained=UNSUSTAINED)
    mla = _shape(8192, d_qk=192, d_v=128, heads=128)       # measured on GB200 only
    cost = m.op_cost(_op(mla))
    assert cost.source == "measured" and "GB200 x dense-peak ratio 0.900" in cost.table
    rate = _csv_rate("GB200", "bf16", 8192, "F", 192, 128)
    assert cost.compute_s == pytest.approx(attention_table_flops(mla, "F") / (rate * 0.9e12), rel=1e-12)
    assert RooflineComputeModel("B200").op_cost(_op(_shape(8192))).table == "cudnn on B200"
    assert "same die" in RooflineComputeModel("H100").op_cost(_op(_shape(8192))).table


def test_measured_time_is_divided_by_the_sustained_fraction():
    fast = RooflineComputeModel("GB200", sustained=UNSUSTAINED)
    slow = RooflineComputeModel("GB200", sustained={"gemm": 1.0, "attention": 0.8})
    op = _op(_shape(4096))
    assert slow.op_cost(op).compute_s == pytest.approx(fast.op_cost(op).compute_s / 0.8)


def test_window_flops_follow_the_benchmark_count():
    w = _shape(8192, d_qk=64, d_v=64, mask="window", window=128)
    unmasked = 128 * 129 / 2 + (8192 - 128) * 128
    assert attention_table_flops(w, "F") == 2.0 * 2 * 64 * unmasked * 128
    assert attention_table_flops(w, "B") == 2.0 * 2 * 64 * unmasked * 320
    assert attention_table_flops(_shape(8192, mask="full"), "F") == 2.0 * 2 * 64 * 8192 ** 2 * 256


def test_bad_tables_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="ascending"):
        KernelTable("attention", "k", "G", "bf16", (), "F", (8192, 2048), (1.0, 2.0), ("", ""))
    with pytest.raises(ConfigError, match="positive"):
        KernelTable("attention", "k", "G", "bf16", (), "F", (2048,), (math.nan,), ("",))
    bad = tmp_path / "t.csv"
    bad.write_text("gpu,kernel,dtype,mask,d_qk,d_v,window,seq_len,phase,tflops,cudnn,source\n"
                   "GB200,cudnn,bf16,causal,128,128,,many,F,1,92200,x\n")
    with pytest.raises(ConfigError, match="line 2"):
        AttentionTables.from_csv(bad)
    with pytest.raises(ConfigError, match="not found"):
        AttentionTables.from_csv(tmp_path / "none.csv")


def test_the_newest_release_of_a_curve_is_kept():
    t = default_attention_tables().tables[("cudnn", "GB300", "bf16", ("causal", None, 128, 128), "F")]
    assert t.xs[0] == 2048 and all("@3929da2e" in s for s in t.sources)   # cuDNN 9.22, not the 9.13.1 artifact


def _scenario(preset, seq):
    from tests.golden.cases import _small
    sc = _small(tp=1, pp=1, dp=2, preset=preset, gpus_per_host=2, cluster={"nvls": False} if "gb" in preset else {})
    sc = copy.deepcopy(sc)
    sc["parallel"]["seq_len"] = seq
    sc["model"].update(num_attention_heads=16, hidden_size=2048)
    return sc


def test_the_run_reports_its_measured_share():
    from simulator.engine import run
    res = run(_scenario("gb200-nvl72", 4096))
    m = res.metrics
    share = res.program.measured_share()
    assert 0.0 < share < 1.0 and m["measured_compute_share"] == share
    busy = m["breakdown_s"]["compute"] + m["breakdown_s"]["recompute"]
    assert m["measured_step_share"] == pytest.approx(share * busy / m["step_time_s"])
    sources = {r["kernel"]: r["source"] for r in res.program.kernel_table()}
    assert sources["core_attn"] == "measured" and sources["qkv_proj"] == "model"
    a100 = run(_scenario("dgx-a100", 4096)).metrics
    assert "measured_step_share" not in a100 and "measured_compute_share" not in a100


def test_the_validation_summary_prints_the_measured_share_per_set():
    from simulator.validation import OUTPUT_COLUMNS
    from simulator.validation.report import measured_share_lines
    assert "measured_share_pct" in OUTPUT_COLUMNS
    rows = [{"status": "ok", "measured_share_pct": v} for v in (0.0, 2.0, 4.0)] + [{"status": "error: x"}]
    assert measured_share_lines(rows) == ["step time costed from measured kernel tables: median 2.0 %, mean 2.0 %, "
                                          "2/3 rows with any"]
    assert measured_share_lines([{"status": "error: x"}]) == []
