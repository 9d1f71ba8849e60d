"""The what-if studies (experiments/whatif/*/run.py) run at smoke sizes and write their
CSV, plots and Gantt pair."""

import csv
import importlib.util
from pathlib import Path

import pytest

STUDIES = Path(__file__).resolve().parents[1] / "experiments" / "whatif"
NAMES = ["straggler", "tail_at_scale", "topology", "mesh_order", "failures", "moe_routing"]


def _load(name):
    spec = importlib.util.spec_from_file_location(f"whatif_study_{name}", STUDIES / name / "run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", NAMES)
def test_study_runs_at_smoke_size(name, tmp_path):
    rows = _load(name).main(["--smoke", "--out", str(tmp_path)])
    assert rows
    with open(tmp_path / "results.csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    pngs = {p.name for p in tmp_path.glob("*.png")}
    assert {"gantt_baseline.png", "gantt_whatif.png", f"{name}.png"} <= pngs
    # the smoke runs already show each study's direction
    if name == "straggler":            # a slow GPU never speeds a step up; a DP straggler costs most of it
        assert all(r["ratio"] >= 1 - 1e-12 for r in rows)
        assert next(r for r in rows if r["case"] == "dp_replica" and r["slowdown"] == 1.5)["ratio"] > 1.3
    elif name == "tail_at_scale":      # persistent per-step slowness costs more than per-op noise
        for n in {r["num_gpus"] for r in rows}:
            by = {r["scope"]: r["ratio_mean"] for r in rows if r["num_gpus"] == n}
            assert by["gpu_step"] > by["op"] > 1
    elif name == "topology":           # oversubscription never helps; a bigger NVLink domain helps all-to-all
        over = [r["step_time_s"] for r in rows if r["study"] == "oversubscription"]
        assert over == sorted(over)
        nvl = [r["step_time_s"] for r in rows if r["study"] == "nvlink_domain"]
        assert nvl[-1] < nvl[0]
    elif name == "moe_routing":        # uneven routing never helps, and costs more when EP spreads the hot experts thinner
        assert all(r["ratio"] >= 1 - 1e-12 for r in rows)
        zipf = {r["ep"]: r["ratio"] for r in rows if r["routing"] == "zipf(1.2)"}
        assert zipf[4] > zipf[2] > 1
    elif name == "failures":           # a failed NIC without failover stops the job; pxn completes
        assert any(r["outcome"].startswith("stopped") for r in rows)
        assert rows[-1]["outcome"] == "completed"

