"""Progress lines and the wall-time profile: they report on a run without changing it."""

from __future__ import annotations

import copy

from simulator import run
from simulator.cli import main
from tests.golden.cases import cases, ops_digest

SC, _ = cases()["interleaved-pp4"]


def test_progress_reports_on_stderr_and_changes_nothing(capsys):
    quiet = run(copy.deepcopy(SC))
    loud = run(copy.deepcopy(SC), progress=1e-9)          # report from the first chunk of events
    err = capsys.readouterr().err
    assert "clustersim:" in err and "simulated t =" in err and " of 2 (" in err and "cells still in it" in err
    assert ops_digest(loud) == ops_digest(quiet)
    assert loud.metrics["step_time_s"] == quiet.metrics["step_time_s"]


def test_profile_accounts_for_the_wall_time():
    res = run(copy.deepcopy(SC))
    p = res.profile
    assert set(p) == {"load", "program", "fold", "event_loop", "solver", "timeline_metrics", "solves",
                      "solve_cache_hits"}
    assert all(v >= 0 for v in p.values())
    assert 0 <= p["solver"] <= p["event_loop"]
    assert 0 <= p["solve_cache_hits"] <= p["solves"] == res.metrics["num_solves"]
    parts = sum(p[k] for k in ("load", "program", "fold", "event_loop", "timeline_metrics"))
    assert parts <= res.wall_time_s and parts > 0.5 * res.wall_time_s


def test_cli_profile_goes_to_stderr_and_json_stays_clean(tmp_path, capsys):
    import json

    import yaml
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(SC))
    assert main(["run", str(path), "--json", "--profile", "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["step_time_s"] > 0
    assert "event loop" in err and "of which max-min solves" in err and "from the cache)" in err


class _Terminal:
    """A stderr that says it is a terminal."""

    def __init__(self):
        import io
        self.buf = io.StringIO()

    def write(self, s):
        return self.buf.write(s)

    def flush(self):
        pass

    def isatty(self):
        return True


def test_progress_lines_use_carriage_returns_only_on_a_terminal(capsys, monkeypatch):
    """Off a terminal (a log, a pipe, CI) every report is a whole line, without \\r; on a
    terminal it is redrawn in place as before."""
    import sys
    run(copy.deepcopy(SC), progress=1e-9)
    err = capsys.readouterr().err
    assert "\r" not in err and err.endswith("\n") and err.startswith("clustersim: ")
    assert all(line.startswith("clustersim: ") for line in err.splitlines())
    tty = _Terminal()
    monkeypatch.setattr(sys, "stderr", tty)
    run(copy.deepcopy(SC), progress=1e-9)
    assert tty.buf.getvalue().startswith("\rclustersim: ")


def test_sweep_and_search_progress_is_a_line_per_tenth_off_a_terminal(tmp_path, capsys):
    import io

    from simulator.explore.sweep import LocalExecutor, Store, expand, run_points
    from simulator.report.progress import LineProgress, progress_bar, progress_iter

    base = {"model": "tiny-dense", "cluster": {"preset": "dgx-h100", "num_nodes": 1},
            "parallel": {"tp": 2, "pp": 2, "dp": -1, "global_batch_size": 8}, "num_steps": 1}
    pts = expand({"base": base, "grid": {"parallel.pp": [2, 3]}})
    run_points(pts, Store(tmp_path / "s.sqlite"), LocalExecutor(1), progress=True, desc="simulate")
    err = capsys.readouterr().err
    assert "\r" not in err
    assert err.splitlines() == [line for line in err.splitlines() if line.startswith("simulate: ")]
    assert err.splitlines()[-1].startswith("simulate: 2/2 pt (100%)") and "failed 1" in err
    out = io.StringIO()
    assert list(progress_iter(list(range(1000)), "screen", "cand", stream=out)) == list(range(1000))
    assert out.getvalue().count("\n") == 10 and "\r" not in out.getvalue()
    assert isinstance(progress_bar(5, "x", "pt", stream=io.StringIO()), LineProgress)
    assert not isinstance(progress_bar(5, "x", "pt", stream=_Terminal()), LineProgress)     # tqdm
