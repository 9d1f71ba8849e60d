"""experiments/validation_residuals.py: grouping and the attribution's least squares."""

import csv

import pytest

from simulator.validation import OUTPUT_COLUMNS
from tests.experiment_scripts import load_experiment


def _module():
    return load_experiment("validation_residuals")


def _write(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(OUTPUT_COLUMNS), restval="")
        w.writeheader()
        w.writerows(rows)
    return path


def _row(i, tp, compute, dp, measured, status="ok"):
    pred = compute + dp
    return {"id": i, "model": "m", "parallel": f"tp{tp} pp1 dp8 cp1 mbs1 gbs8", "measured_step_s": measured,
            "predicted_step_s": pred, "error_pct": (pred - measured) / measured * 100, "status": status,
            "compute_s": compute, "recompute_s": 0, "bubble_s": 0, "host_issue_s": 0, "exposed_tp_s": 0,
            "exposed_cp_s": 0, "exposed_ep_s": 0, "exposed_pp_s": 0, "exposed_dp_s": dp}


def test_attribution_recovers_the_factors_that_made_the_measurements(tmp_path, capsys):
    # measured = 1.1 x compute + 2 x dp on TP 1 rows and 1.1 x compute + 1 x dp on TP 8 rows
    rows = []
    for i, (c, d) in enumerate([(10, 1), (8, 2), (12, 0.5), (9, 3)]):
        rows.append(_row(f"a{i}", 1, c, d, 1.1 * c + 2 * d))
        rows.append(_row(f"b{i}", 8, c, d, 1.1 * c + 1 * d))
    rows.append(_row("x", 1, 5, 5, 1.0, status="unsupported: whatever"))     # not ok: ignored
    path = _write(tmp_path / "pred.csv", rows)
    mod = _module()
    df = mod.load(path)
    assert len(df) == 8 and set(df["tp"]) == {1, 8}
    k, before, after = mod.attribution(df, ("dp_comm", "tp"))
    assert k["compute"] == pytest.approx(1.1, abs=1e-3)
    assert k["dp_comm[tp=1]"] == pytest.approx(2.0, abs=1e-3) and k["dp_comm[tp=8]"] == pytest.approx(1.0, abs=1e-3)
    assert before > 5 and after == pytest.approx(0.0, abs=1e-6)
    table = mod.group_table(df, ["tp"])
    assert list(table["rows"]) == [4, 4] and (table["median_err"] < 0).all()
    assert mod.main([str(path), "--by", "tp", "--split", "dp_comm:tp"]) == 0
    assert "a diagnostic, not a calibration" in capsys.readouterr().out


def test_bad_arguments_exit_with_a_message(tmp_path):
    mod = _module()
    path = _write(tmp_path / "pred.csv", [_row("a", 1, 1, 1, 2)])
    for argv, text in (([str(tmp_path / "missing.csv")], "no such file"),
                       ([str(path), "--by", "nope"], "unknown column"),
                       ([str(path), "--split", "dp:tp"], "PART:COLUMN")):
        with pytest.raises(SystemExit, match=text):
            mod.main(argv)
