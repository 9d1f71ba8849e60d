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
