"""The error bar on a prediction (simulator/validation/intervals.py): the order-statistic
interval and its small-sample widening, pooling, the "no comparable measurements" path, the
held-out coverage on the committed prediction tables (70-90 % per stratum of at least 10
rows), and the interval wherever a step time is printed."""

from __future__ import annotations

import csv
import json
import math
import random
import re

import pytest
import yaml

from simulator.cli import main
from simulator.validation.intervals import (MIN_ROWS, Residual, Stratum, coverage_table, interval_for,
                                            mapping_interval, order_interval, residuals, row_interval)

HOPPER_DENSE = Stratum("megatron_core", "hopper", "dense", "several hosts")
TINY = {"model": "tiny-dense", "cluster": {"preset": "dgx-h100", "num_nodes": 1},
        "parallel": {"tp": 2, "pp": 2, "dp": 2, "global_batch_size": 8, "seq_len": 512}, "num_steps": 1}


def _pool(stratum, values, source="s", configs=None):
    return [Residual(v, stratum, source, (configs[i] if configs else i,)) for i, v in enumerate(values)]


# -- the interval ----------------------------------------------------------------------------------------
def test_order_statistics_widen_with_few_rows_and_vanish_below_nine():
    assert order_interval(range(10)) == (0, 9)          # 10 rows: the whole range
    assert order_interval(range(20)) == (1, 18)         # 2nd and 19th of 20
    assert order_interval(range(100)) == (9, 90)        # 10th and 91st of 100
    assert order_interval(range(9)) == (0, 8)
    assert order_interval(range(8)) is None             # too few for an 80 % interval


def test_order_interval_covers_about_80_percent_of_new_draws():
    rng = random.Random(1)
    hits = total = 0
    for _ in range(400):
        sample = [rng.gauss(0, 1) for _ in range(20)]
        lo, hi = order_interval(sample)
        new = [rng.gauss(0, 1) for _ in range(20)]
        hits += sum(lo <= x <= hi for x in new)
        total += len(new)
    assert 0.78 <= hits / total <= 0.86             # (k_hi - k_lo) / (n + 1) = 17 / 21 = 81 %


def test_own_stratum_interval_is_exp_of_the_order_statistics():
    vals = [0.01 * i for i in range(20)]
    iv = interval_for(HOPPER_DENSE, _pool(HOPPER_DENSE, vals))
    assert iv.known and iv.rows == 20 and iv.basis.startswith("its own")
    assert iv.low == pytest.approx(math.exp(0.01)) and iv.high == pytest.approx(math.exp(0.18))
    lo, hi = iv.bounds(10.0)
    assert lo == pytest.approx(10 * math.exp(0.01)) and hi == pytest.approx(10 * math.exp(0.18))
    assert iv.short(10.0).startswith("likely 10.1-12.0 s; 20 comparable measured runs")


def test_a_small_stratum_pools_and_widens_to_its_own_rows():
    big = _pool(HOPPER_DENSE, [0.01 * i for i in range(20)])
    one_host = Stratum("megatron_core", "hopper", "dense", "one host")
    small = _pool(one_host, [0.5, 0.6, 0.7, 0.8], configs=["a", "b", "c", "d"])
    iv = interval_for(one_host, big + small)
    assert iv.basis.startswith("pooled over Megatron, Hopper, dense") and "widened" in iv.basis
    pooled_lo, pooled_hi = order_interval([p.r for p in big + small])
    assert math.log(iv.low) == pytest.approx(pooled_lo) and math.log(iv.high) >= 0.7   # covers its own rows
    assert "pooled" in iv.short(1.0)
    # repeats of one configuration are not 10 configurations: pooled as well
    repeats = _pool(one_host, [0.1] * 12, configs=["x"] * 12)
    assert interval_for(one_host, big + repeats).basis.startswith("pooled")


def test_no_comparable_measurements():
    pool = _pool(HOPPER_DENSE, [0.0] * 20)
    for stratum in (Stratum("megatron_core", "hopper", "moe", "several hosts"),
                    Stratum("llm_foundry", "hopper", "dense", "several hosts"), None):
        iv = interval_for(stratum, pool)
        assert not iv.known and iv.bounds(5.0) is None and iv.short(5.0) == "no comparable measurements"
    assert not interval_for(HOPPER_DENSE, []).known               # no tables at all
    amd = {"model": "tiny-dense", "cluster": {"preset": "mi300x", "num_nodes": 1}}
    assert not mapping_interval(amd).known


def test_an_out_of_fold_prediction_column_is_read_in_place(tmp_path):
    path = tmp_path / "predictions_x.csv"
    cols = ["id", "source", "framework", "model", "gpu", "num_gpus", "precision", "parallel", "measured_step_s",
            "predicted_step_s", "oof_predicted_step_s", "status"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerow(dict(zip(cols, ["1", "x", "NeMo", "Llama 3.1 70B", "H100", "64", "BF16", "tp4", "2.0", "1.0",
                                   "2.0", "ok"])))
    (res,) = residuals([path])
    assert res.r == pytest.approx(0.0) and res.stratum == HOPPER_DENSE


# -- checked on the shared sets ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def coverage():
    return coverage_table()


def test_held_out_coverage_is_70_to_90_percent_in_every_stratum_of_10_rows(coverage):
    checked = [r for r in coverage if r["rows"] >= MIN_ROWS]
    assert len(checked) >= 8
    for r in checked:
        assert r["covered"] is not None and 0.70 <= r["covered"] <= 0.90, (r["stratum"].label(), r["covered"])
    assert {r["fold"] for r in coverage} <= {"leave-one-configuration-out", "leave-one-source-out"}


def test_a_validate_row_interval_leaves_its_configuration_out():
    pool = residuals()
    row = {"source": "dgxc_benchmarking", "framework": "NeMo 24.09", "model": "Llama 3.1 70B",
           "gpu": "H100-SXM-80GB", "num_gpus": "64", "precision": "BF16", "parallel": "tp4 pp4"}
    iv = row_interval(row, pool)
    assert iv.known and iv.fold == "leave-one-configuration-out"
    assert iv.rows == sum(p.stratum == HOPPER_DENSE for p in pool)    # no row shares this configuration


# -- printed wherever a step time is ---------------------------------------------------------------------
def test_run_prints_and_json_carries_the_interval(tmp_path, capsys):
    sc = tmp_path / "tiny.yaml"
    sc.write_text(yaml.safe_dump(TINY))
    page = tmp_path / "r.html"
    assert main(["run", str(sc), "--quiet", "--report", str(page)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.lstrip().startswith("likely measured"))
    assert "comparable measured runs" in line and "Megatron, Hopper, dense, one host" in line and "pooled" in line
    assert "predicts too fast puts the measured step above" in out
    assert "likely measured" in page.read_text()
    assert main(["run", str(sc), "--quiet", "--json"]) == 0
    m = json.loads(capsys.readouterr().out)
    iv = m["step_interval"]
    assert iv["low_s"] < iv["high_s"] and iv["rows"] > 0 and iv["level"] == 0.8


def test_run_says_no_comparable_measurements(tmp_path, capsys):
    sc = tmp_path / "moe.yaml"
    sc.write_text(yaml.safe_dump({**TINY, "model": "tiny-moe"}))
    assert main(["run", str(sc), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "likely measured  no comparable measurements (Megatron, Hopper, moe" in out
    assert main(["run", str(sc), "--quiet", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_interval"]["low_s"] is None


def test_compare_and_sweep_carry_the_interval(tmp_path, capsys):
    sc = tmp_path / "tiny.yaml"
    sc.write_text(yaml.safe_dump(TINY))
    assert main(["compare", str(sc), "--set", "parallel.global_batch_size=16", "--quiet", "--out",
                 str(tmp_path / "cmp")]) == 0
    out = capsys.readouterr().out
    assert "likely_low_s" in out and out.count("predicts too fast") == 1
    with open(tmp_path / "cmp" / "compare.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert all(float(r["likely_low_s"]) < float(r["step_s"]) * 1.5 < float(r["likely_high_s"]) * 1.5 for r in rows)
    sweep = tmp_path / "sw.yaml"
    sweep.write_text(yaml.safe_dump({"base": TINY, "grid": {"cluster.preset": ["dgx-h100", "dgx-a100"]}}))
    assert main(["sweep", str(sweep), "--db", str(tmp_path / "sw.sqlite"), "--out", str(tmp_path / "sw.csv"),
                 "--workers", "1", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "likely_s (Megatron, Ampere, dense, one host)" in out and out.count("predicts too fast") == 1
    with open(tmp_path / "sw.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert all(float(r["likely_low_s"]) < float(r["likely_high_s"]) and int(r["comparable_runs"]) > 0 for r in rows)


def test_search_rows_carry_the_interval():
    import pandas as pd

    from simulator.cli import _add_search_interval, _likely_cell
    from simulator.explore.search import SearchSpec
    spec = SearchSpec.from_dict({"model": "tiny-dense", "cluster": {"preset": "dgx-h100", "num_nodes": 1},
                                 "global_batch_size": 8})
    table = pd.DataFrame({"step_s": [1.0, 2.0]})
    iv = _add_search_interval(table, spec)
    assert iv.known and table["likely_low_s"].tolist() == pytest.approx([iv.low, 2 * iv.low])
    assert _likely_cell(table.iloc[0]).count("-") == 1
    assert _likely_cell({"likely_low_s": float("nan"), "likely_high_s": float("nan")}) == "none"


def test_a_stack_variant_shares_its_frameworks_measured_rows():
    """``llm_foundry_flash`` is llm-foundry with FlashAttention-2: the set holds both kernels'
    runs under one framework cell, so a scenario on either stack gets their interval."""
    from simulator.scenario import load_scenario
    from simulator.validation.intervals import scenario_stratum
    base = {"model": "llama3-8b", "cluster": {"preset": "dgx-h100", "num_nodes": 2}, "num_steps": 1,
            "parallel": {"tp": 1, "pp": 1, "dp": 16, "zero_stage": 3, "global_batch_size": 32, "seq_len": 2048}}
    flash = scenario_stratum(load_scenario({**base, "framework": "llm_foundry_flash"}))
    triton = scenario_stratum(load_scenario({**base, "framework": "llm_foundry"}))
    assert flash == triton and flash.stack == "llm_foundry"
    assert scenario_stratum(load_scenario({**base, "framework": "torchtitan"})).stack == "torchtitan"


def test_the_gantt_title_carries_the_interval(tmp_path, monkeypatch):
    """The chart's title prints the step time, so it prints the interval beside it."""
    import simulator.report as report
    titles = []
    monkeypatch.setattr(report, "gantt", lambda tl, path, title="": titles.append(title))
    sc = tmp_path / "tiny.yaml"
    sc.write_text(yaml.safe_dump(TINY))
    assert main(["run", str(sc), "--quiet", "--gantt", str(tmp_path / "g.png")]) == 0
    assert re.search(r" s \(likely [0-9.]+-[0-9.]+ s\), MFU ", titles[0]), titles
    sc.write_text(yaml.safe_dump({**TINY, "model": "tiny-moe"}))
    assert main(["run", str(sc), "--quiet", "--gantt", str(tmp_path / "g.png")]) == 0
    assert "likely" not in titles[1]
