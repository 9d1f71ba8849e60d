"""The console script: real output, exit codes, one-line errors."""

import json
import re
import subprocess
import sys

import pytest

from simulator.cli import main


def test_demo_prints_real_numbers(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "32 x H100-SXM" in out and "nvls/Simple" in out and "contention:" in out


def test_collectives_json(capsys):
    assert main(["collectives", "dgx-a100", "--sizes", "1MiB,1GiB", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["kind"] for r in rows} == {"all_reduce", "all_gather", "all_to_all"}
    big = next(r for r in rows if r["kind"] == "all_reduce" and r["size_bytes"] == 2**30)
    assert 200 < big["busbw_GBps"] < 300          # A100 NVLink ring: ~231 GB/s (calibrated)


def test_bad_input_exits_2_with_one_line():
    p = subprocess.run([sys.executable, "-m", "simulator.cli", "topo", "dgx-h100", "--set", "nic_bandwidth=-1"],
                       capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "cluster.nic_bandwidth" in p.stderr
    assert "Traceback" not in p.stderr


def test_topo_route(capsys):
    assert main(["topo", "dgx-h100", "--set", "num_nodes=2", "--route", "0", "9"]) == 0
    assert "nic0.1 -> leaf0.1" in capsys.readouterr().out


def test_schedule_prints_every_schedule(capsys):
    for name, vpp in (("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("zb_h1", 1), ("dualpipe", 1)):
        assert main(["schedule", "--schedule", name, "--pp", "4", "--microbatches", "8", "--vpp", str(vpp)]) == 0
        out = capsys.readouterr().out
        assert "stage3" in out and "bubble" in out
    assert main(["schedule", "--pp", "4", "--microbatches", "8", "--costs", "1,1,0"]) == 0
    assert "bubble 27.3%" in capsys.readouterr().out         # (p-1)/(m+p-1) = 3/11 for 1F1B


def test_schedule_bad_input_exit_2(capsys):
    assert main(["schedule", "--schedule", "zb_h1", "--pp", "4", "--microbatches", "2"]) == 2
    assert "schedule.num_microbatches" in capsys.readouterr().err


def test_memory_prints_per_stage_breakdown_and_verdict(capsys):
    from pathlib import Path
    cfg = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "llama3-70b-64xh100.yaml"
    assert main(["memory", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert out.count("pipeline stage") >= 4 and "activations" in out and "fits" in out
    assert main(["memory", "no/such.yaml"]) == 2


def test_run_hostile_or_malformed_yaml_exits_2_and_executes_nothing(tmp_path, capsys):
    marker = tmp_path / "pwned"
    hostile = tmp_path / "hostile.yaml"
    hostile.write_text(f'model: !!python/object/apply:os.system ["touch {marker}"]\n')
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    for path in (hostile, bad):
        assert main(["run", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
    assert not marker.exists()


def test_run_json_and_outputs(tmp_path, capsys):
    cfg = tmp_path / "s.yaml"
    cfg.write_text("model: tiny-dense\ncluster: {preset: dgx-h100, num_nodes: 1}\n"
                   "parallel: {tp: 2, pp: 2, dp: 2, global_batch_size: 8, seq_len: 512}\n")
    assert main(["run", str(cfg), "--json", "--out", str(tmp_path / "out")]) == 0
    m = json.loads(capsys.readouterr().out)
    for key in ("step_time_s", "mfu", "mfu_bf16_peak", "hfu", "tflops_per_gpu", "tokens_per_s", "bubble_fraction",
                "exposed_comm_s", "breakdown_s", "peak_memory_bytes", "num_gpus", "wall_time_s", "num_events"):
        assert key in m
    for f in ("metrics.json", "timeline.csv", "gantt.png", "trace.json"):
        assert (tmp_path / "out" / f).stat().st_size > 0
    assert main(["presets"]) == 0
    assert "llama3-70b" in capsys.readouterr().out


def test_run_no_fold_and_per_rank(tmp_path, capsys):
    """--no-fold gives the folded step time (folding is exact); --per-rank expands the
    timeline to every rank (8 ranks, 4 cells here)."""
    cfg = tmp_path / "s.yaml"
    cfg.write_text("model: tiny-dense\ncluster: {preset: dgx-h100, num_nodes: 1}\n"
                   "parallel: {tp: 2, pp: 2, dp: 2, global_batch_size: 8, seq_len: 512}\nnum_steps: 1\n")
    assert main(["run", str(cfg), "--json"]) == 0
    folded = json.loads(capsys.readouterr().out)
    assert main(["run", str(cfg), "--json", "--no-fold", "--per-rank", "--out", str(tmp_path / "o")]) == 0
    unfolded = json.loads(capsys.readouterr().out)
    assert unfolded["step_time_s"] == folded["step_time_s"]
    assert folded["fold"]["rank_cells"] < unfolded["fold"]["rank_cells"] == 8
    import pandas as pd
    ranks = pd.read_csv(tmp_path / "o" / "timeline_ranks.csv")
    assert sorted(ranks["rank"].unique()) == list(range(8))


def test_run_per_kernel_writes_the_kernels_of_each_kind_of_layer(tmp_path, capsys):
    cfg = tmp_path / "s.yaml"
    cfg.write_text("model: tiny-moe\ncluster: {preset: dgx-h100, num_nodes: 1}\n"
                   "parallel: {tp: 2, pp: 1, dp: 4, ep: 4, etp: 1, sequence_parallel: true, global_batch_size: 8, "
                   "seq_len: 512}\nnum_steps: 1\n")
    assert main(["run", str(cfg), "--per-kernel"]) == 2             # refused before any work: no --out
    assert "--per-kernel" in capsys.readouterr().err
    assert main(["run", str(cfg), "--per-kernel", "--out", str(tmp_path / "o")]) == 0
    import pandas as pd
    k = pd.read_csv(tmp_path / "o" / "kernels.csv")
    assert {"F:attn", "F:pre", "F:mlp", "F:post", "B:mlp", "W:mlp"} <= set(k["segment"])
    assert {"router", "expert_fc1", "core_attn"} <= set(k["kernel"])


def test_validate_command_reports_every_row(tmp_path, capsys):
    from pathlib import Path
    runs = Path(__file__).resolve().parents[1] / "experiments" / "reference" / "published_runs_h100.csv"
    out = tmp_path / "pred.csv"
    assert main(["validate", str(runs), "--max-gpus", "1", "--out", str(out)]) == 0
    import csv
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 34 and all(r["status"].startswith("unsupported: over --max-gpus") for r in rows)


OOM = {"model": "llama3-70b", "cluster": {"preset": "dgx-h100", "num_nodes": 1},
       "parallel": {"tp": 8, "pp": 1, "dp": 1, "micro_batch_size": 1, "global_batch_size": 2, "seq_len": 4096,
                    "recompute": "none"}}


def test_run_says_whether_memory_fits_and_strict_exits_3(tmp_path, capsys):
    import yaml
    bad = tmp_path / "oom.yaml"
    bad.write_text(yaml.safe_dump(OOM))
    assert main(["run", str(bad), "--quiet"]) == 0                   # still reports its step time
    cap = capsys.readouterr()
    assert "DOES NOT FIT: pipeline stage 0" in cap.out and "GB over HBM" in cap.out
    assert "warning: the memory model says this layout does not fit" in cap.err
    assert main(["run", str(bad), "--quiet", "--strict"]) == 3
    assert "--strict: exit 3" in capsys.readouterr().err
    assert main(["run", str(bad), "--quiet", "--json"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["memory_fits"] is False and m["memory_margin_bytes"] < 0
    # 70B over 8 GPUs needs 173 GB per GPU at tp 8: the margin is the shortfall
    assert m["memory_margin_bytes"] == pytest.approx(80 * 2**30 - m["peak_memory_bytes"], rel=0.05)
    ok = tmp_path / "ok.yaml"
    ok.write_text(yaml.safe_dump({**OOM, "model": "llama3-8b"}))
    assert main(["run", str(ok), "--quiet", "--strict"]) == 0
    cap = capsys.readouterr()
    assert "fits (" in cap.out and "GB to spare on" in cap.out and "warning" not in cap.err


def test_a_layout_that_does_not_fit_says_so_first_and_its_step_is_hypothetical(tmp_path, capsys):
    """The verdict comes before any step figure, every step figure says it is hypothetical
    (naming the stage, what it needs and the usable HBM), and --json and the HTML report
    carry the same verdict; a layout that fits shows none of it."""
    import yaml
    bad = tmp_path / "oom.yaml"
    bad.write_text(yaml.safe_dump(OOM))
    page = tmp_path / "r.html"
    assert main(["run", str(bad), "--quiet", "--report", str(page)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("DOES NOT FIT: pipeline stage 0 (ranks 0-7) needs ") and "hypothetical" in out[0]
    need, hbm = (float(x) for x in re.findall(r"([\d.]+) GB", out[0])[:2])
    assert need > hbm == pytest.approx(80 * 2**30 / 1e9, abs=0.05)
    step = next(line for line in out if line.lstrip().startswith("step time"))
    assert f"(hypothetical: pipeline stage 0 (ranks 0-7) needs {need:.1f} GB of {hbm:.1f} GB)" in step
    for label in ("MFU", "TFLOP/s per GPU", "tokens/s"):
        assert next(line for line in out if line.lstrip().startswith(label)).endswith("(hypothetical)"), label
    text = page.read_text()
    assert "DOES NOT FIT" in text and text.index("DOES NOT FIT") < text.index("<h2>Summary</h2>")
    assert "s (hypothetical)</td>" in text
    assert main(["run", str(bad), "--quiet", "--json"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["fits"] is False and m["hypothetical"] is True and m["shortfall"].startswith("pipeline stage 0")
    ok = tmp_path / "ok.yaml"
    ok.write_text(yaml.safe_dump({**OOM, "model": "llama3-8b"}))
    assert main(["run", str(ok), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "hypothetical" not in out and not out.startswith("DOES NOT FIT")
    assert main(["run", str(ok), "--quiet", "--json"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["fits"] is True and "hypothetical" not in m


def test_a_closed_pipe_ends_quietly():
    # `clustersim collectives --json | head`: the reader is gone before the writer writes
    sizes = ",".join(str(2 ** i) for i in range(10, 40))
    p = subprocess.Popen([sys.executable, "-m", "simulator.cli", "collectives", "dgx-h100", "--json", "--sizes", sizes],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read().decode()
    rc = p.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert rc in (0, 141)


def test_bad_yaml_names_line_and_column(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: tiny-dense\ncluster: {preset: dgx-h100\nparallel: [\n")
    assert main(["run", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "not valid YAML" in err and "line 3, column 9" in err and len(err.strip().splitlines()) == 1


def test_an_unknown_key_suggests_the_nearest(tmp_path, capsys):
    bad = tmp_path / "typo.yaml"
    bad.write_text("model: tiny-dense\ncluster: dgx-h100\nparalel: {tp: 2}\n")
    assert main(["run", str(bad)]) == 2
    assert "did you mean 'parallel'?" in capsys.readouterr().err


def test_a_preset_takes_the_users_size_in_either_form():
    from topologies import build_cluster
    assert build_cluster({"preset": "dgx-h100", "num_gpus": 16}).num_gpus == 16
    assert build_cluster({"preset": "dgx-h100", "num_nodes": 3}).num_gpus == 24
    from topologies import ConfigError
    with pytest.raises(ConfigError, match="not both"):
        build_cluster({"preset": "dgx-h100", "num_gpus": 16, "num_nodes": 2})


def test_run_set_overrides_dotted_keys(tmp_path, capsys):
    sc = tmp_path / "s.yaml"
    sc.write_text("model: tiny-dense\ncluster: dgx-h100\nparallel: {tp: 2, pp: 2, dp: -1, global_batch_size: 8}\n"
                  "num_steps: 1\n")
    assert main(["run", str(sc), "--json", "--quiet", "--set", "parallel.pp=1", "--set", "parallel.tp=4",
                 "--set", "cluster.num_nodes=2"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["num_gpus"] == 16                      # the preset name became {preset: dgx-h100, num_nodes: 2}
    assert main(["run", str(sc), "--quiet", "--set", "parallel.pp=1", "--set", "parallel.tp=4"]) == 0
    assert "tp=4 cp=1 dp=2 pp=1" in capsys.readouterr().out
    assert main(["run", str(sc), "--set", "parallel"]) == 2
    assert "--set = 'parallel': expected dotted.key=value" in capsys.readouterr().err


def test_compare_runs_a_scenario_against_its_set_variant(tmp_path, capsys):
    sc = tmp_path / "base.yaml"
    sc.write_text("model: tiny-dense\ncluster: dgx-h100\nparallel: {tp: 2, pp: 2, dp: -1, global_batch_size: 8}\n"
                  "num_steps: 1\nhost: none\n")
    out = tmp_path / "cmp"
    assert main(["compare", str(sc), "--set", "parallel.pp=1", "--set", "parallel.tp=4", "--out", str(out),
                 "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "[2] base + parallel.pp=1, parallel.tp=4" in text and "TP4 PP1 DP2" in text
    assert "vs_first" in text and "the critical path" in text
    for f in ("compare.csv", "critical_path.csv", "breakdown.png", "gantt.png", "metrics_1.json", "metrics_2.json"):
        assert (out / f).stat().st_size > 0, f
    import pandas as pd
    table = pd.read_csv(out / "compare.csv")
    assert table["vs_first"].iloc[0] == 1.0
    m1, m2 = (json.loads((out / f"metrics_{i}.json").read_text()) for i in (1, 2))
    assert table["step_s"].tolist() == [m1["step_time_s"], m2["step_time_s"]]
    assert table["vs_first"].iloc[1] == pytest.approx(m2["step_time_s"] / m1["step_time_s"])
    # the critical path's rows add up to each run's step (busy per op + idle per reason)
    crit = pd.read_csv(out / "critical_path.csv", index_col=0)
    assert crit["base"].sum() == pytest.approx(m1["step_time_s"], rel=1e-9)
    # one scenario without --set has nothing to compare
    assert main(["compare", str(sc)]) == 2
    assert "needs two scenarios" in capsys.readouterr().err


def test_compare_json_lists_every_run(tmp_path, capsys):
    a = tmp_path / "a.yaml"
    a.write_text("model: tiny-dense\ncluster: dgx-h100\nparallel: {tp: 2, dp: -1, global_batch_size: 8}\nnum_steps: 1\n")
    b = tmp_path / "b.yaml"
    b.write_text("model: tiny-dense\ncluster: dgx-h100\nparallel: {tp: 8, dp: -1, global_batch_size: 8}\nnum_steps: 1\n")
    assert main(["compare", str(a), str(b), "--json", "--quiet"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [r["scenario"] for r in d["runs"]] == ["a", "b"] and "critical_path_s" in d


def test_a_whatif_run_says_what_it_perturbed_and_who_finished_last(tmp_path, capsys):
    sc = tmp_path / "w.yaml"
    sc.write_text("model: tiny-dense\ncluster: dgx-h100\nparallel: {tp: 2, pp: 2, dp: -1, global_batch_size: 8}\n"
                  "num_steps: 1\nhost: none\nwhatif: {slow_gpus: {5: 1.5}}\n")
    assert main(["run", str(sc), "--json", "--quiet"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["layout"] == "TP2 PP2 DP2 1f1b, bf16"
    # GPU 5 holds rank 5: stage 1 (ranks 4-7), TP pair [4, 5], DP pair [5, 7]
    assert m["whatif"] == ["GPU 5 computes 1.5x slower: rank 5, pipeline stage 1, TP group [4, 5], DP group [5, 7]"]
    assert m["last_ranks"] == "rank 5 (pipeline stage 1)"       # the slow GPU's cell finishes last
    assert main(["run", str(sc), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "what-if          GPU 5 computes 1.5x slower" in text and "finishes last: rank 5 (pipeline stage 1)" in text


def test_per_rank_output_can_be_limited_to_ranks_or_stages(tmp_path, capsys):
    import pandas as pd
    sc = tmp_path / "s.yaml"
    sc.write_text("model: tiny-dense\ncluster: {preset: dgx-h100, num_nodes: 2}\n"
                  "parallel: {tp: 2, pp: 2, dp: -1, global_batch_size: 8}\nnum_steps: 1\n")
    out = tmp_path / "o"
    assert main(["run", str(sc), "--quiet", "--stages", "1", "--ranks", "0-1", "--out", str(out)]) == 0
    ranks = set(pd.read_csv(out / "timeline_ranks.csv")["rank"])
    assert ranks == {0, 1} | set(range(8, 16))             # stage 1 is ranks 8-15 (tp-cp-ep-dp-pp order)
    capsys.readouterr()
    assert main(["run", str(sc), "--quiet", "--ranks", "0-99"]) == 2
    assert "--ranks = '0-99': '0-99' is outside 0-15" in capsys.readouterr().err
    assert main(["run", str(sc), "--quiet", "--stages", "x"]) == 2


def test_collectives_that_do_not_match_up_are_one_line_and_exit_1(tmp_path, capsys, monkeypatch):
    """The collective engine's consistency errors end a run as any run that cannot finish
    does: one line on stderr and exit status 1, not a traceback."""
    import simulator.engine
    from simulator.collectives import CollectiveError

    def broken(*_a, **_k):
        raise CollectiveError("group 0 call 13: all_gather issued after the call completed with all 4 members")

    monkeypatch.setattr(simulator.engine, "run", broken)
    path = tmp_path / "s.yaml"
    path.write_text("model: tiny-dense\ncluster: dgx-h100\nparallel: {tp: 8}\n")
    assert main(["run", str(path), "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["clustersim: simulation failed: group 0 call 13: all_gather issued after the call completed "
                   "with all 4 members"]


# -- errors before work, never a traceback (issue 34) ----------------------------------------------
SMALL = ("model: tiny-dense\ncluster: {preset: dgx-h100, num_nodes: 1}\n"
         "parallel: {tp: 2, pp: 2, dp: 2, global_batch_size: 8, seq_len: 512}\nnum_steps: 1\n")


def _one_line_error(capsys, *parts) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("clustersim: error: ") and "Traceback" not in err, err
    for p in parts:
        assert p in err, err
    return err


@pytest.fixture
def no_simulation(monkeypatch):
    """The engine's run fails the test if reached: the refusal has to come before any work
    (sweep, search and validate would refuse these files with other messages)."""
    import simulator.engine

    def reached(*_a, **_k):
        raise AssertionError("simulated before the output paths were checked")

    monkeypatch.setattr(simulator.engine, "run", reached)


def test_output_paths_are_checked_before_simulating(tmp_path, capsys, no_simulation):
    sc = tmp_path / "s.yaml"
    sc.write_text(SMALL)
    a_file = tmp_path / "taken"
    a_file.write_text("x")
    cases = [
        (["run", str(sc), "--out", str(a_file)], "--out", "exists and is not a folder"),
        (["run", str(sc), "--gantt", str(tmp_path / "missing" / "g.png")], "--gantt", "does not exist"),
        (["run", str(sc), "--report", str(tmp_path / "missing" / "r.html")], "--report", "does not exist"),
        (["run", str(sc), "--trace", "/dev/null/x"], "--trace", "'/dev/null' is not a folder"),
        (["run", str(sc), "--out", "/dev/null/x"], "--out", "'/dev/null' is not a folder"),
        (["run", str(sc), "--report", str(tmp_path)], "--report", "is a folder; give a file name"),
        (["compare", str(sc), str(sc), "--out", str(a_file)], "--out", "exists and is not a folder"),
        (["compare", str(sc), "--set", "num_steps=2", "--report", "/dev/null/r.html"], "--report", "/dev/null"),
        (["sweep", str(sc), "--out", "/dev/null/x.csv"], "--out", "'/dev/null' is not a folder"),
        (["sweep", str(sc), "--db", "/dev/null/x.sqlite"], "--db", "'/dev/null' is not a folder"),
        (["search", str(sc), "--plot", "/dev/null/x.png"], "--plot", "'/dev/null' is not a folder"),
        (["search", str(sc), "--out", str(a_file / "x.csv")], "--out", "is not a folder"),
        (["validate", str(sc), "--out", "/dev/null/p.csv"], "--out", "'/dev/null' is not a folder"),
    ]
    for argv, flag, rule in cases:
        assert main(argv) == 2, argv
        _one_line_error(capsys, f"{flag} = ", rule)


def test_missing_output_folders_are_made_where_the_command_makes_them(tmp_path):
    from simulator.cli import check_outputs, parser
    deep = tmp_path / "a" / "b"
    check_outputs(parser().parse_args(["run", "s.yaml", "--out", str(deep)]))      # run --out makes it
    check_outputs(parser().parse_args(["search", "s.yaml", "--out", str(deep / "c.csv")]))
    check_outputs(parser().parse_args(["run", "s.yaml", "--gantt", str(tmp_path / "g.png")]))


def test_unusable_inputs_are_one_line_and_exit_2(tmp_path, capsys):
    sc = tmp_path / "s.yaml"
    sc.write_text(SMALL)
    binary = tmp_path / "blob.yaml"
    binary.write_bytes(bytes(range(256)))
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    dup = tmp_path / "dup.yaml"
    dup.write_text(SMALL + "parallel: {tp: 8}\n")
    gbs0 = tmp_path / "gbs0.yaml"
    gbs0.write_text(SMALL.replace("global_batch_size: 8", "global_batch_size: 0"))
    cases = [
        (["run", str(binary)], "scenario = ", "a binary file"),
        (["memory", str(binary)], "scenario = ", "a binary file"),
        (["run", str(tmp_path)], "scenario = ", "is a folder, not a file"),
        (["run", str(empty)], "scenario = ", "the file is empty"),
        (["memory", str(empty)], "scenario = ", "the file is empty"),
        (["run", str(dup)], "scenario = ", "duplicate key 'parallel' at line 5, column 1 (first at line 3"),
        (["run", str(gbs0)], "parallel.global_batch_size = 0", "must be an integer >= 1"),
        (["run", str(sc), "--set", "parallel={tp: 8"], "--set = 'parallel={tp: 8'", "not valid YAML"),
        (["run", str(sc), "--set", "parallel={tp: 8, tp: 2}"], "--set = ", "duplicate key 'tp'"),
        (["compare", str(sc), "--set", "parallel.pp=[1"], "--set = ", "not valid YAML"),
        (["topo", "dgx-h100", "--set", "num_nodes=[2"], "--set = ", "not valid YAML"),
        (["topo", str(dup)], "cluster = ", "duplicate key"),
        (["sweep", str(empty)], "sweep = ", "the file is empty"),
        (["search", str(binary)], "search = ", "a binary file"),
        (["run", str(sc), "--model-config", str(binary)], "--model-config = ", "a binary file"),
        (["run", str(sc), "--model-config", str(tmp_path / "no.txt")], "--model-config = ", "file not found"),
    ]
    for argv, *parts in cases:
        assert main(argv) == 2, argv
        _one_line_error(capsys, *parts)


def test_model_config_is_told_apart_by_extension_then_content(tmp_path, capsys, monkeypatch):
    """.json / a folder: a Hugging Face config; .yaml: a model mapping (not Megatron
    arguments, as it was read before); other text: JSON or --flags, else refused."""
    import simulator.engine
    from simulator.cli import _model_config
    sc = tmp_path / "s.yaml"
    sc.write_text(SMALL)
    mapping = tmp_path / "m.yaml"
    mapping.write_text("preset: tiny-dense\nnum_layers: 2\n")
    assert _model_config(str(mapping)) == {"preset": "tiny-dense", "num_layers": 2}
    wrapped = tmp_path / "scenario_like.yml"
    wrapped.write_text("model: tiny-moe\ncluster: dgx-h100\n")
    assert _model_config(str(wrapped)) == {"preset": "tiny-moe"}
    args = tmp_path / "args.txt"
    args.write_text("--num-layers 2 --hidden-size 256\n")
    assert _model_config(str(args)) == {"megatron_args": "--num-layers 2 --hidden-size 256\n"}
    hf = tmp_path / "config"
    hf.write_text('{"model_type": "llama"}')
    assert _model_config(str(hf)) == {"hf_config": str(hf)}
    prose = tmp_path / "notes.txt"
    prose.write_text("a model with two layers\n")
    seen = {}
    monkeypatch.setattr(simulator.engine, "run", lambda spec, **_k: seen.setdefault("spec", spec) and 1 / 0)
    assert main(["run", str(sc), "--model-config", str(prose)]) == 2
    _one_line_error(capsys, "--model-config = ", "holds no JSON and no --flags")
    with pytest.raises(ZeroDivisionError):
        main(["run", str(sc), "--model-config", str(mapping)])
    assert seen["spec"]["model"] == {"preset": "tiny-dense", "num_layers": 2}


def test_schedule_zb_v_defaults_to_its_two_chunks(capsys):
    """A V schedule holds two model chunks per stage by definition: without --vpp it gets
    them (it was refused for vpp = 1); another explicit --vpp is still refused, naming it."""
    assert main(["schedule", "--schedule", "zb_v", "--pp", "4", "--microbatches", "8"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("zb_v: pp=4, micro-batches=8, vpp=2\n") and "bubble" in out
    assert main(["schedule", "--schedule", "zb_v", "--pp", "4", "--microbatches", "8", "--vpp", "2"]) == 0
    assert capsys.readouterr().out == out
    for vpp in ("1", "3"):
        assert main(["schedule", "--schedule", "zb_v", "--pp", "4", "--microbatches", "8", "--vpp", vpp]) == 2
        _one_line_error(capsys, f"schedule.vpp = {vpp}", "exactly 2 model chunks per stage")
    # DualPipe's two chunks are its own bidirectional placement: vpp stays 1
    assert main(["schedule", "--schedule", "dualpipe", "--pp", "4", "--microbatches", "8"]) == 0
    assert capsys.readouterr().out.startswith("dualpipe: pp=4, micro-batches=8, vpp=1\n")


def test_memory_takes_set_model_config_and_strict_and_says_its_verdict_first(tmp_path, capsys):
    import yaml
    sc = tmp_path / "oom.yaml"
    sc.write_text(yaml.safe_dump(OOM))
    assert main(["memory", str(sc)]) == 0                       # the verdict, without --strict: still 0
    out = capsys.readouterr().out
    assert out.startswith("DOES NOT FIT: the pipeline stage exceeds 85.9 GB of HBM; worst: pipeline stage 0 "
                          "(ranks 0-7) needs ")
    assert main(["memory", str(sc), "--strict"]) == 3
    assert "--strict" in capsys.readouterr().err
    assert main(["memory", str(sc), "--strict", "--json"]) == 3
    assert json.loads(capsys.readouterr().out)[0]["total_bytes"] > 80 * 2**30
    # --set: a smaller model fits
    assert main(["memory", str(sc), "--set", "model=llama3-8b", "--strict"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("FITS: the pipeline stage fits in 85.9 GB of HBM; tightest: pipeline stage 0 (ranks 0-7), ")
    assert "llama3-8b on 8 x H100-SXM" in out
    model = tmp_path / "small.yaml"
    model.write_text("preset: llama3-8b\nnum_layers: 8\n")
    assert main(["memory", str(sc), "--model-config", str(model), "--set", "parallel.pp=2",
                 "--set", "parallel.tp=4", "--strict"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("FITS: all 2 pipeline stages fit") and "tp=4 cp=1 dp=1 pp=2" in out
    assert main(["memory", str(sc), "--set", "parallel={tp: 8"]) == 2
    _one_line_error(capsys, "--set = ")


def test_compare_prints_plain_decimals_and_mfu_in_percent(tmp_path, capsys):
    """No '7.715e+04' or '1.5e-05' in the printed tables: seconds in plain decimals, MFU in %,
    tokens/s with separators; compare.csv keeps the raw numbers."""
    import re

    import pandas as pd
    sc = tmp_path / "s.yaml"
    sc.write_text(SMALL)
    out = tmp_path / "cmp"
    assert main(["compare", str(sc), "--set", "parallel.pp=1", "--set", "parallel.dp=4", "--quiet",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert not re.search(r"\d[eE][+-]?\d", text), text
    raw = pd.read_csv(out / "compare.csv")
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines() if line and not line.startswith("[")}
    assert rows["mfu"] == [f"{v:.1%}" for v in raw["mfu"]]
    assert rows["tokens_per_s"] == [f"{v:,.0f}" for v in raw["tokens_per_s"]]
    assert rows["vs_first"][0] == "1.000" and rows["fits"] == ["yes", "yes"]
    assert [float(v) for v in rows["step_s"]] == pytest.approx(list(raw["step_s"]), rel=1e-3)


def test_plain_numbers_never_use_an_exponent():
    from simulator.report.compare import plain_number, shown_table
    import pandas as pd
    assert [plain_number(v) for v in (1.878e-05, 1234567.0, 0.5, -0.000123)] == \
        ["0.00001878", "1235000", "0.5", "-0.000123"]
    t = shown_table(pd.DataFrame({"a": [0.4261, 1.5e-5]}, index=["mfu", "bubble_s"]), ["[1]"])
    assert list(t["[1]"]) == ["42.6%", "0.000015"]


def _fabric(nodes, hosts_per_leaf, par, whatif=None, over=1):
    d = {"model": {"preset": "tiny-dense", "num_layers": 2},
         "cluster": {"preset": "dgx-h100", "num_nodes": nodes, "hosts_per_leaf": hosts_per_leaf,
                     "oversubscription": over},
         "parallel": {**par, "global_batch_size": 8, "seq_len": 512}, "num_steps": 1}
    return {**d, "whatif": whatif} if whatif else d


_SPINE = {"failed_links": [["leaf0.0", "spine0.0"]]}
_NIC = {"degraded_nics": [{"nic": "nic0.0", "bandwidth_factor": 0.5}]}


@pytest.mark.parametrize("scenario, warning", [
    # every host under one leaf per rail: no byte reaches a spine
    (_fabric(4, 4, {"tp": 8, "dp": 4}, over=2), "cluster.oversubscription = 2 changes only the leaf <-> spine links"),
    (_fabric(4, 2, {"tp": 8, "dp": 4}, over=2), None),
    (_fabric(4, 4, {"tp": 8, "dp": 4}, _SPINE), "whatif.failed_links[0] (leaf0.0 -- spine0.0) is on none of this "
                                                "job's paths"),
    (_fabric(4, 2, {"tp": 8, "dp": 4}, _SPINE), None),
    # one host: nothing leaves it through a NIC
    (_fabric(1, 1, {"tp": 8, "dp": 1}, _NIC), "whatif.degraded_nics[0] (nic0.0) carries none of this job's traffic"),
    (_fabric(2, 2, {"tp": 8, "dp": 2}, _NIC), None),
], ids=["oversubscription-one-leaf", "oversubscription-two-leaves", "failed-link-off-path", "failed-link-on-path",
        "nic-one-host", "nic-two-hosts"])
def test_run_warns_when_a_setting_touches_no_link_the_job_uses(tmp_path, capsys, scenario, warning):
    """One line on stderr, exit 0, the result printed as usual; nothing when the job's
    traffic does cross the links the setting changes."""
    import yaml
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario))
    assert main(["run", str(path), "--quiet", "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["step_time_s"] > 0
    lines = [line for line in cap.err.splitlines() if line.startswith("warning:")]
    if warning is None:
        assert lines == []
    else:
        assert len(lines) == 1 and warning in lines[0], cap.err


def test_run_trace_gz_is_gzip_and_a_large_plain_trace_is_announced(tmp_path, capsys, monkeypatch):
    """``--trace NAME.json.gz`` writes gzip (Perfetto opens it directly); a plain-JSON trace
    estimated above LARGE_TRACE_BYTES is announced on stderr with its size and the .gz form."""
    import gzip

    from simulator.report import trace
    cfg = tmp_path / "s.yaml"
    cfg.write_text("model: tiny-dense\ncluster: {preset: dgx-h100, num_nodes: 1}\n"
                   "parallel: {tp: 2, pp: 2, dp: 2, global_batch_size: 8, seq_len: 512}\nnum_steps: 1\n")
    gz = tmp_path / "t.json.gz"
    assert main(["run", str(cfg), "--per-rank", "--quiet", "--trace", str(gz)]) == 0
    assert "the trace" not in capsys.readouterr().err
    with gzip.open(gz, "rt") as f:
        events = json.load(f)["traceEvents"]
    assert {e["args"]["rank"] for e in events if e["ph"] == "X"} == set(range(8))
    monkeypatch.setattr(trace, "LARGE_TRACE_BYTES", 1000)
    plain = tmp_path / "t.json"
    assert main(["run", str(cfg), "--per-rank", "--quiet", "--trace", str(plain)]) == 0
    err = capsys.readouterr().err
    assert f"the trace {plain} will be about " in err and "KiB of JSON" in err
    assert "--trace t.json.gz" in err and "gzip" in err
    assert plain.stat().st_size > 0 and not plain.read_bytes().startswith(b"\x1f\x8b")


def test_schedule_printout_explains_its_notation(capsys):
    """Under the table a short legend: the action form with an example from the table, the
    kinds the schedule uses (BW fused; B and W split), chunks, DualPipe's & and the idle dot."""
    assert main(["schedule", "--schedule", "1f1b", "--pp", "2", "--microbatches", "2"]) == 0
    out = capsys.readouterr().out
    table, legend = out.split("notation: ")
    assert "0BW0" in table
    assert legend.startswith("{stage}{kind}{micro-batch}, e.g. 0F0 = stage 0, forward of micro-batch 0\n")
    assert "  BW full backward" in legend and "  .  idle slot" in legend
    assert "  B  " not in legend and "@c" not in legend and "&" not in legend
    assert main(["schedule", "--schedule", "zb_h1", "--pp", "2", "--microbatches", "3"]) == 0
    legend = capsys.readouterr().out.split("notation: ")[1]
    assert "  B  backward for the input gradient only" in legend and "  W  backward for the weight gradient" in legend
    assert "  BW " not in legend
    assert main(["schedule", "--schedule", "dualpipe", "--pp", "4", "--microbatches", "8"]) == 0
    out = capsys.readouterr().out
    assert "0F0@c0" in out.split("notation: ")[0]
    legend = out.split("notation: ")[1]
    assert legend.startswith("{stage}{kind}{micro-batch}@c{chunk}, e.g. 0F0@c0 = stage 0, forward of micro-batch 0 "
                             "on the stage's model chunk 0")
    assert "  @cN the stage's model chunk N (each stage holds 2 chunks" in legend and "  X&Y two actions" in legend
    assert main(["schedule", "--schedule", "interleaved_1f1b", "--pp", "2", "--microbatches", "4", "--vpp", "2",
                 "--list"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].startswith("stage 0: 0F0@c0 0F1@c0 0F0@c1")     # chunks written as in the table
    assert "notation: " in out and "idle slot" not in out                     # no slots in the list view


def test_validate_runs_a_shipped_reference_set_without_a_csv(tmp_path, capsys):
    """``--set NAME`` names a shipped set of measured runs, ``--limit N`` takes its first N rows;
    an unknown name, no table at all, or both a CSV and a set are one line naming the valid sets."""
    import csv
    out = tmp_path / "pred.csv"
    assert main(["validate", "--set", "h100", "--limit", "2", "--max-gpus", "1", "--out", str(out), "--quiet"]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [r["id"] for r in rows] == ["362", "363"]             # the first two rows of the table
    assert main(["validate", "--set", "vtrain_single", "--limit", "2", "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 2 and all(r["status"] == "ok" for r in rows)
    assert "vtrain_single            2    2      100%" in stdout
    for argv, words in ((["--set", "h200"], "--set = 'h200': not a shipped reference set; valid sets: h100, "
                                            "blackwell, vtrain, vtrain_single"),
                        ([], "runs = None: give a CSV of measured runs, or --set NAME"),
                        (["x.csv", "--set", "h100"], "--set = 'h100': names a table of runs, and x.csv is one too"),
                        (["--set", "h100", "--limit", "0"], "--limit = 0: must be a positive number of rows")):
        assert main(["validate", *argv]) == 2
        _one_line_error(capsys, words)


def test_a_zb_v_scenario_without_vpp_gets_its_two_chunks(tmp_path, capsys):
    """`parallel: {schedule: zb_v}` without vpp was refused; a V schedule has two chunks by
    definition, so it now runs as with `vpp: 2` (same step time), as `clustersim schedule
    --schedule zb_v` already did. Another explicit vpp is still refused, naming the rule."""
    from simulator.scenario import load_scenario
    base = ("model: {preset: tiny-dense, num_layers: 12}\ncluster: {preset: dgx-h100, num_nodes: 1}\n"
            "parallel: {tp: 1, pp: 2, dp: 4, global_batch_size: 16, seq_len: 512, schedule: zb_v%s}\nnum_steps: 1\n")
    implicit, explicit = tmp_path / "implicit.yaml", tmp_path / "explicit.yaml"
    implicit.write_text(base % "")
    explicit.write_text(base % ", vpp: 2")
    assert load_scenario(str(implicit)).parallel.vpp == 2
    assert main(["run", str(implicit), "--json", "--quiet"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert main(["run", str(explicit), "--json", "--quiet"]) == 0
    assert got["step_time_s"] == json.loads(capsys.readouterr().out)["step_time_s"]
    assert load_scenario({"model": "tiny-dense", "cluster": {"preset": "dgx-h100", "num_nodes": 1},
                          "parallel": {"tp": 2, "pp": 2, "dp": 2, "global_batch_size": 8,
                                       "schedule": "dualpipe"}}).parallel.vpp == 1
    for vpp in (1, 3):
        bad = tmp_path / f"vpp{vpp}.yaml"
        bad.write_text(base % f", vpp: {vpp}")
        assert main(["run", str(bad)]) == 2
        _one_line_error(capsys, f"parallel.vpp = {vpp}", "exactly 2 model chunks per stage",
                        "leave vpp out (it defaults to 2 for zb_v)")


def test_a_hugging_face_config_with_a_key_twice_exits_2_naming_it(tmp_path, capsys):
    """Through --model-config and through the scenario's model.hf_config: one line, exit 2."""
    cfg = tmp_path / "config.json"
    cfg.write_text('{\n "model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 4,\n'
                   ' "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 4096,\n'
                   ' "vocab_size": 32000,\n "num_hidden_layers": 8\n}\n')
    sc = tmp_path / "s.yaml"
    sc.write_text(f"model: {{hf_config: {cfg}}}\ncluster: {{preset: dgx-h100, num_nodes: 1}}\n"
                  "parallel: {tp: 1, pp: 1, dp: 8, global_batch_size: 8}\n")
    for argv in (["run", str(sc)], ["run", str(sc), "--model-config", str(cfg)], ["memory", str(sc)]):
        assert main(argv) == 2
        _one_line_error(capsys, "hf_config = ", "key 'num_hidden_layers' is given twice in one JSON object "
                                                "(again on line 5)")


def test_a_stopped_job_says_when_and_how_far_it_got(tmp_path, capsys):
    """A NIC failure the job does not survive: one line, exit 1, naming the NIC, the instant
    and how many steps had completed (the failure is at t = 0, so none)."""
    import yaml
    cfg = tmp_path / "stop.yaml"
    cfg.write_text(yaml.safe_dump({
        "model": {"preset": "tiny-dense", "num_layers": 4}, "cluster": {"preset": "dgx-h100", "num_nodes": 4},
        "parallel": {"tp": 8, "pp": 2, "dp": 2, "global_batch_size": 8, "seq_len": 1024}, "num_steps": 2,
        "whatif": {"failed_nics": [{"nic": "nic1.0", "at_s": 0.0}]}}))
    assert main(["run", str(cfg), "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "NIC nic1.0" in err[0] and err[0].endswith("(0 of 2 steps had completed)")


def test_an_output_folder_where_writes_fail_is_refused_before_work(capsys):
    """Permission bits can say yes where a write fails (root under /proc): the CLI tries a
    temporary file there first and refuses in one line, before any simulation."""
    import os
    if not os.path.isdir("/proc"):
        pytest.skip("no /proc")
    assert main(["run", "experiments/configs/llama3-70b-64xh100.yaml", "--quiet", "--out", "/proc/clustersim-x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out" in err[0] and "cannot write in '/proc'" in err[0]
