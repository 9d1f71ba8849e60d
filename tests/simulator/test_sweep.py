"""Sweeps: expansion, the SQLite store, resuming, local processes vs Dask, a killed run."""

import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from simulator.cli import main
from simulator.explore.sweep import (LocalExecutor, Store, config_hash, expand, load_sweep, run_points, simulate_point)
from topologies import ConfigError

ROOT = Path(__file__).resolve().parents[2]
BASE = {"model": "tiny-dense", "cluster": {"preset": "dgx-h100", "num_nodes": 1},
        "parallel": {"tp": 2, "pp": 2, "dp": 2, "global_batch_size": 8, "seq_len": 512}, "num_steps": 1}


def test_grid_is_the_cartesian_product_in_order():
    pts = expand({"base": BASE, "grid": {"parallel.global_batch_size": [8, 16],
                                         "parallel.schedule": ["1f1b", "gpipe", "zb_h1"]}})
    assert len(pts) == 6
    assert [(p["parallel"]["global_batch_size"], p["parallel"]["schedule"]) for p in pts][:3] == \
        [(8, "1f1b"), (8, "gpipe"), (8, "zb_h1")]
    assert BASE["parallel"].get("schedule") is None            # the base is not modified
    # a preset name becomes a mapping when a field under it is swept
    pts = expand({"base": BASE, "points": [{"model.num_layers": 8}]})
    assert pts[0]["model"] == {"preset": "tiny-dense", "num_layers": 8}


@pytest.mark.parametrize("spec, field", [({"grid": {"a": [1]}}, "sweep.base"),
                                         ({"base": BASE}, "sweep"),
                                         ({"base": BASE, "grid": {"parallel.pp": 2}}, "sweep.grid.parallel.pp"),
                                         ({"base": BASE, "points": [1, 2]}, "sweep.points"),
                                         ({"base": "nope.yaml", "points": []}, "sweep.base"),
                                         ({"base": BASE, "grid": {"x": [1]}, "color": 1}, "sweep.color")])
def test_bad_sweeps_name_the_field(spec, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        expand(spec)


def test_config_hash_is_canonical():
    a = {"x": 1, "y": {"b": 2, "a": 1}}
    b = {"y": {"a": 1, "b": 2}, "x": 1}
    assert config_hash(a) == config_hash(b) != config_hash({**a, "x": 2})


def test_points_are_stored_once_and_rerun_skips_them(tmp_path):
    pts = expand({"base": BASE, "grid": {"parallel.schedule": ["1f1b", "gpipe"], "parallel.pp": [2, 3]}})
    store = Store(tmp_path / "s.sqlite")
    counts = run_points(pts, store, LocalExecutor(1), progress=False)
    assert counts == {"total": 4, "skipped": 0, "ok": 2, "failed": 2}       # pp=3 does not divide 8 GPUs
    rows = store.rows()
    assert len(rows) == 4 and {r["status"] for r in rows} == {"ok", "invalid"}
    bad = [r for r in rows if r["status"] == "invalid"]
    assert all("pp" in r["error"] for r in bad)
    ok = [r for r in rows if r["status"] == "ok"]
    assert all(r["metrics"]["step_time_s"] > 0 and r["versions"]["clustersim"] for r in ok)
    # the simulator is deterministic: a stored point equals a fresh run
    fresh = simulate_point(ok[0]["config"])
    assert fresh["metrics"] == ok[0]["metrics"]
    again = run_points(pts, store, LocalExecutor(1), progress=False)
    assert again == {"total": 4, "skipped": 4, "ok": 0, "failed": 0}
    retry = run_points(pts, store, LocalExecutor(1), progress=False, retry_failed=True)
    assert retry["skipped"] == 2 and retry["failed"] == 2
    assert len(Store(tmp_path / "s.sqlite").rows()) == 4


def test_cli_sweep_writes_csv(tmp_path, capsys):
    sweep = tmp_path / "sw.yaml"
    sweep.write_text(yaml.safe_dump({"base": BASE, "grid": {"parallel.global_batch_size": [8, 16]}}))
    out = tmp_path / "out.csv"
    rc = main(["sweep", str(sweep), "--db", str(tmp_path / "sw.sqlite"), "--out", str(out), "--workers", "1",
               "--no-progress"])
    assert rc == 0
    import pandas as pd
    df = pd.read_csv(out)
    assert len(df) == 2 and set(df["parallel.global_batch_size"]) == {8, 16} and df["step_time_s"].gt(0).all()
    assert "2 points" in capsys.readouterr().out


def test_cli_sweep_bad_file_is_one_line(tmp_path, capsys):
    sweep = tmp_path / "sw.yaml"
    sweep.write_text(yaml.safe_dump({"base": BASE}))
    assert main(["sweep", str(sweep), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "grid" in err[0]


def _rows(db):
    con = sqlite3.connect(db, timeout=10)     # wait out the writer's lock rather than read "no rows"
    try:
        return con.execute("SELECT hash, status FROM points").fetchall()
    except sqlite3.OperationalError:          # the client has not created the table yet
        return []
    finally:
        con.close()


@pytest.mark.slow
def test_a_sweep_on_dask_gives_the_local_results(tmp_path):
    from simulator.explore.sweep import DaskExecutor
    pts = expand({"base": BASE, "grid": {"parallel.schedule": ["1f1b", "gpipe", "zb_h1"],
                                         "parallel.global_batch_size": [8, 16]}})
    local, dask = Store(tmp_path / "local.sqlite"), Store(tmp_path / "dask.sqlite")
    run_points(pts, local, LocalExecutor(2), progress=False)
    with DaskExecutor("local", workers=2) as ex:
        run_points(pts, dask, ex, progress=False)
    a = {r["hash"]: r["metrics"] for r in local.rows()}
    b = {r["hash"]: r["metrics"] for r in dask.rows()}
    assert len(a) == 6 and a == b


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_a_killed_sweep_resumes_without_duplicates_or_gaps(tmp_path, sig):
    n = 10
    sweep = tmp_path / "sw.yaml"
    sweep.write_text(yaml.safe_dump({"base": {**BASE, "num_steps": 2},
                                     "grid": {"parallel.global_batch_size": [8 * (i + 1) for i in range(n)]}}))
    db = tmp_path / "sw.sqlite"
    cmd = [sys.executable, "-m", "simulator.cli", "sweep", str(sweep), "--db", str(db), "--workers", "1",
           "--no-progress"]
    # SIGINT as a terminal's Ctrl-C delivers it: a test run started in the background of a
    # non-interactive shell inherits SIGINT ignored, and Python then never raises
    # KeyboardInterrupt, so the child gets the default disposition back
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while time.time() < deadline:
        if db.exists() and 2 <= len(_rows(db)) < n:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the sweep finished before the test could interrupt it"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    first = len(_rows(db))
    assert 2 <= first < n, "the sweep was not stopped midway"
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and b"resume" in err
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = _rows(db)
    hashes = [h for h, _ in rows]
    assert len(hashes) == len(set(hashes)) == n and {s for _, s in rows} == {"ok"}
    assert f"{first} already finished" in done.stdout
    expected = {config_hash(c) for c in load_sweep(sweep)}
    assert set(hashes) == expected


def test_rows_from_other_code_are_run_again(tmp_path):
    import json as _json
    import sqlite3 as _sqlite3
    pts = expand({"base": BASE, "grid": {"parallel.schedule": ["1f1b", "gpipe"]}})
    store = Store(tmp_path / "s.sqlite")
    run_points(pts, store, LocalExecutor(1), progress=False)
    con = _sqlite3.connect(tmp_path / "s.sqlite")
    h, ver = con.execute("SELECT hash, versions FROM points").fetchone()
    ver = _json.loads(ver)
    ver["clustersim_code"] = "older"
    con.execute("UPDATE points SET versions = ? WHERE hash = ?", (_json.dumps(ver), h))
    con.commit()
    con.close()
    again = run_points(pts, Store(tmp_path / "s.sqlite"), LocalExecutor(1), progress=False)
    assert again == {"total": 2, "skipped": 1, "ok": 1, "failed": 0}
    assert len(Store(tmp_path / "s.sqlite").rows()) == 2


def test_cli_sweep_says_why_points_failed_and_exits_the_same_on_resume(tmp_path, capsys):
    sweep = tmp_path / "sw.yaml"
    sweep.write_text(yaml.safe_dump({"base": BASE, "grid": {"parallel.schedule": ["1f1b", "interleaved_1f1b"]}}))
    argv = ["sweep", str(sweep), "--db", str(tmp_path / "sw.sqlite"), "--workers", "1", "--no-progress"]
    assert main(argv) == 1
    first = capsys.readouterr().err
    assert "1 of 2 points did not run" in first
    assert "parallel.schedule=interleaved_1f1b" in first and "needs vpp >= 2" in first
    assert main(argv) == 1                      # resumed: nothing ran, the recorded failure still counts
    again = capsys.readouterr().err
    assert "needs vpp >= 2" in again and "--retry-failed" in again


SLOW_POINT = {"model": "llama3-70b", "cluster": {"preset": "dgx-h100", "num_nodes": 8}, "num_steps": 2,
              "parallel": {"tp": 8, "pp": 4, "dp": 2, "global_batch_size": 64, "seq_len": 8192}}   # ~3 s


def test_a_point_past_the_time_limit_is_recorded_as_timeout(tmp_path):
    """The per-point limit stops a long run and records it as ``timeout`` with the limit; the
    other points of the sweep run, and a resume skips the timed-out point unless asked."""
    store = Store(tmp_path / "s.sqlite")
    pts = [BASE, SLOW_POINT]
    t0 = time.perf_counter()
    counts = run_points(pts, store, LocalExecutor(1), progress=False, timeout_s=0.3)
    assert time.perf_counter() - t0 < 2.5
    assert counts == {"total": 2, "skipped": 0, "ok": 1, "failed": 1}
    rows = {r["config"]["model"]: r for r in store.rows()}
    assert rows["tiny-dense"]["status"] == "ok"
    slow = rows["llama3-70b"]
    assert slow["status"] == "timeout" and "0.3 s" in slow["error"] and slow["wall_s"] < 1.5
    assert run_points(pts, store, LocalExecutor(1), progress=False, timeout_s=0.3)["skipped"] == 2
    # a limit the point fits in: with --retry-failed it runs again and finishes
    again = run_points(pts, store, LocalExecutor(1), progress=False, retry_failed=True, timeout_s=60)
    assert again["ok"] == 1 and {r["status"] for r in store.rows()} == {"ok"}


def test_the_time_limit_holds_in_a_worker_thread_and_leaves_nothing_behind():
    """Dask runs tasks in worker threads, where SIGALRM cannot reach: the limit must work there
    too, and a point that finishes in time must not get a late timeout afterwards."""
    import threading
    out = {}
    th = threading.Thread(target=lambda: out.update(slow=simulate_point(SLOW_POINT, timeout_s=0.3),
                                                    fast=simulate_point(BASE, timeout_s=30)))
    th.start()
    th.join(60)
    assert out["slow"]["status"] == "timeout" and out["fast"]["status"] == "ok"
    for _ in range(3):                      # no stray PointTimeout lands in this thread later
        assert simulate_point(BASE, timeout_s=5)["status"] == "ok"
    time.sleep(0.1)


def test_the_time_limit_holds_when_the_asynchronous_exception_is_lost(monkeypatch):
    """The asynchronous exception lands at whatever bytecode runs next; if that is a callback
    whose errors Python drops (a gc callback: CI lost one in hypothesis's), it is gone.  The
    event loop's own check must then stop the run: here the exception is never delivered."""
    from simulator.engine import limits
    monkeypatch.setattr(limits, "_raise_async", lambda tid: None)
    # CPU time, not wall time: on a loaded machine the 0.3 s limit is wall time, so the run
    # uses less CPU before it, and 1.5 s of CPU still says it stopped long before finishing.
    t0 = time.thread_time()
    res = simulate_point(SLOW_POINT, timeout_s=0.3)
    assert res["status"] == "timeout" and time.thread_time() - t0 < 1.5
    assert not limits.armed()                   # nothing left armed on this thread
    assert simulate_point(BASE, timeout_s=5)["status"] == "ok"


def test_a_limit_that_fired_inside_a_gc_callback_still_stops_the_run():
    """The CI failure itself: a gc callback on the path of the asynchronous exception (one that
    runs often, as the simulator makes garbage quickly) swallows it; the run still stops."""
    import gc
    def swallow(phase, info):
        try:
            sum(range(200))
        except BaseException:
            pass
    gc.callbacks.append(swallow)
    try:
        assert simulate_point(SLOW_POINT, timeout_s=0.3)["status"] == "timeout"
    finally:
        gc.callbacks.remove(swallow)


def test_a_lost_limit_exception_is_not_reported_as_unraisable_but_other_errors_are():
    """A limit exception that lands where Python drops errors (a gc callback, a ``__del__``) is
    expected and must not reach ``sys.unraisablehook`` (pytest made a warning of it in CI);
    any other dropped error still does, and the hook is the caller's again afterwards."""
    import sys
    from simulator.engine import limits
    seen = []

    class Raises:
        def __init__(self, exc):
            self.exc = exc

        def __del__(self):
            raise self.exc

    before = sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        with limits.time_limit(60):
            Raises(limits.TimeLimitExceeded())      # dropped at once (refcount 0): lost quietly
            Raises(ValueError("kept"))
        assert [type(u.exc_value) for u in seen] == [ValueError]
        assert sys.unraisablehook == seen.append
    finally:
        sys.unraisablehook = before


def test_cli_sweep_point_timeout(tmp_path, capsys):
    sweep = tmp_path / "sw.yaml"
    sweep.write_text(yaml.safe_dump({"base": SLOW_POINT, "points": [{"parallel.global_batch_size": 64}]}))
    argv = ["sweep", str(sweep), "--db", str(tmp_path / "sw.sqlite"), "--workers", "1", "--no-progress",
            "--point-timeout", "0.3"]
    assert main(argv) == 1
    assert "[timeout]" in capsys.readouterr().err
    assert main(argv[:-1] + ["0"]) == 2         # a limit must be positive
    assert "--point-timeout" in capsys.readouterr().err


def _die_once(config, marker):
    """A point function whose first call on the marked point kills its Dask worker process."""
    import os
    if config["parallel"]["global_batch_size"] == 16 and not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(1)
    return simulate_point(config)


@pytest.mark.slow
def test_a_dask_worker_lost_mid_sweep_loses_no_point(tmp_path):
    """Dask reschedules the tasks of a worker that dies on another worker (the scheduler's
    allowed failures), and the client writes every result as it arrives: no point is lost
    and none is written twice."""
    import functools

    from simulator.explore.sweep import DaskExecutor
    pts = expand({"base": BASE, "grid": {"parallel.global_batch_size": [8, 16, 24, 32]}})
    store = Store(tmp_path / "d.sqlite")
    with DaskExecutor("local", workers=2) as ex:
        counts = run_points(pts, store, ex, progress=False,
                            fn=functools.partial(_die_once, marker=str(tmp_path / "died")))
    assert (tmp_path / "died").exists()
    assert counts == {"total": 4, "skipped": 0, "ok": 4, "failed": 0}
    rows = store.rows()
    assert len(rows) == 4 and {r["status"] for r in rows} == {"ok"}


def _comment(path: Path) -> str:
    """The leading comment of a YAML file, as one line of text."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# "))
    return " ".join(lines)


@pytest.mark.parametrize("path", sorted((ROOT / "experiments" / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_example_comments_state_the_micro_batches_their_scenarios_run(path):
    """A config whose comment says "N micro-batches ... per replica" runs N (every point of a
    sweep): the schedules sweep once said 16 where its base runs 64 / (DP 2 x 1) = 32."""
    from simulator.scenario import load_scenario
    claims = [int(n.replace(",", "")) for n in
              re.findall(r"([\d,]+) micro-batches[^.;]*?per replica", _comment(path))]
    if not claims:
        pytest.skip("no micro-batch count in its comment")
    data = yaml.safe_load(path.read_text())
    configs = load_sweep(path) if "base" in data else [str(path)]
    for cfg in configs:
        assert load_scenario(cfg).parallel.num_microbatches == claims[0], path.name


def test_the_oversubscription_example_spans_leaves_and_the_ratio_shows():
    """experiments/configs/sweep-llama3-70b-fabric.yaml: its job crosses the spines, so the
    step grows with the oversubscription ratio (its base, all 8 hosts under one leaf per
    rail, gave the same step at 1, 2 and 4), and ``run`` has nothing to warn about."""
    from simulator.engine import run
    from simulator.engine.untouched import untouched_settings
    configs = [c for c in load_sweep(ROOT / "experiments" / "configs" / "sweep-llama3-70b-fabric.yaml")
               if c["parallel"]["global_batch_size"] == 64]
    assert [c["cluster"]["oversubscription"] for c in configs] == [1, 2, 4]
    results = [run(c, progress=False) for c in configs]
    steps = [r.metrics["step_time_s"] for r in results]
    assert steps[0] < steps[1] < steps[2], steps
    assert all(untouched_settings(r) == [] for r in results)
    one_leaf = {**configs[2], "cluster": {**configs[2]["cluster"], "hosts_per_leaf": 32}}
    res = run(one_leaf, progress=False)
    assert res.metrics["step_time_s"] == run({**one_leaf, "cluster": {**one_leaf["cluster"], "oversubscription": 1}},
                                             progress=False).metrics["step_time_s"]
    assert [s.split(" changes")[0] for s in untouched_settings(res)] == ["cluster.oversubscription = 4"]
