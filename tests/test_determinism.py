"""A scenario's result is a function of the scenario alone: the same JSON in another process,
under another hash seed, and through the Dask sweep path.  The scenario draws on every
source of randomness the simulator has (MoE routing samples, jitter, ECMP hashing)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from simulator.cli import main

ROOT = Path(__file__).resolve().parents[1]
RANDOM = {"model": "tiny-moe", "cluster": {"preset": "dgx-h100", "num_nodes": 2, "routing": "ecmp_hash", "seed": 5,
                                           "oversubscription": 2.0},
          "parallel": {"tp": 2, "pp": 2, "dp": 4, "ep": 4, "etp": 1, "global_batch_size": 16, "seq_len": 512},
          "moe_routing": "zipf(1.2)", "seed": 11, "num_steps": 2, "host": "none",   # (a tiny model is host-bound)
          "whatif": {"jitter": [{"scope": "op", "dist": "lognormal(0, 0.2)"},
                                {"scope": "host_step", "dist": "bernoulli_stall(0.5, 1 ms)"}]}}
def _metrics(text: str) -> dict:
    """The metrics less what may differ between two runs of one scenario: how long the
    simulation and its folding took."""
    m = json.loads(text)
    m.pop("wall_time_s")
    m["fold"].pop("wall_s")
    return m


def _here(path, capsys) -> dict:
    assert main(["run", str(path), "--json", "--quiet"]) == 0
    return _metrics(capsys.readouterr().out)


def test_the_same_json_in_a_new_process_under_another_hash_seed(tmp_path, capsys):
    path = tmp_path / "random.yaml"
    path.write_text(yaml.safe_dump(RANDOM))
    here = _here(path, capsys)
    for hash_seed in ("0", "98765"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, "-m", "simulator.cli", "run", str(path), "--json", "--quiet"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert _metrics(out.stdout) == here, f"PYTHONHASHSEED={hash_seed} changed the result"
    # and the randomness is real: another scenario seed gives another answer
    path.write_text(yaml.safe_dump({**RANDOM, "seed": 12}))
    assert _here(path, capsys)["step_time_s"] != here["step_time_s"]


@pytest.mark.slow
def test_the_same_metrics_through_the_dask_sweep_path(tmp_path):
    from simulator.explore.sweep import DaskExecutor, LocalExecutor, simulate_point
    pts = [RANDOM, {**RANDOM, "seed": 12}]
    local = [simulate_point(p)["metrics"] for p in pts]
    with LocalExecutor(2) as ex:
        procs = dict(ex.imap(simulate_point, pts))
    with DaskExecutor("local", workers=2) as ex:
        dask = dict(ex.imap(simulate_point, pts))
    assert [procs[i]["metrics"] for i in range(2)] == local == [dask[i]["metrics"] for i in range(2)]
