"""Scenario loading: the contract's sections, cross-section rules, clear errors."""

from pathlib import Path

import pytest

from simulator.scenario import load_scenario
from topologies import ConfigError

CONFIGS = Path(__file__).resolve().parents[2] / "experiments" / "configs"


SCENARIOS = sorted(p for p in CONFIGS.glob("*.yaml") if not p.stem.startswith(("sweep-", "search-")))
SWEEPS = sorted(CONFIGS.glob("sweep-*.yaml"))
SEARCHES = sorted(CONFIGS.glob("search-*.yaml"))


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_canonical_scenarios_load(path):
    sc = load_scenario(path)
    assert sc.parallel.world_size == sc.cluster.num_gpus


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_example_sweeps_expand_to_valid_points(path, monkeypatch):
    from simulator.explore.sweep import load_sweep
    monkeypatch.chdir(CONFIGS.parents[1])
    points = load_sweep(path)
    assert len(points) >= 4
    for sc in points:                   # every point of an example is valid: none fails on a first run
        load_scenario(sc)


@pytest.mark.parametrize("path", SEARCHES, ids=lambda p: p.stem)
def test_example_searches_parse(path):
    from simulator.explore.search import SearchSpec, candidates
    from simulator.scenario import read_yaml
    spec = SearchSpec.from_dict(read_yaml(path, "search"))
    assert candidates(spec)


@pytest.mark.slow
@pytest.mark.parametrize("path", SWEEPS + SEARCHES, ids=lambda p: p.stem)
def test_example_sweeps_and_searches_run(path, tmp_path, monkeypatch, capsys):
    from simulator.cli import main
    monkeypatch.chdir(CONFIGS.parents[1])
    if path.stem.startswith("sweep-"):
        rc = main(["sweep", str(path), "--workers", "1", "--db", str(tmp_path / "s.sqlite"), "--no-progress"])
        assert rc == 0, capsys.readouterr().err
        assert "0 failed now" in capsys.readouterr().out
    else:
        rc = main(["search", str(path), "--workers", "1", "--top", "3"])
        assert rc == 0
        assert "1 " in capsys.readouterr().out         # a ranked table with a first row


BASE = {"model": "tiny-dense", "cluster": {"preset": "dgx-h100", "num_nodes": 1},
        "parallel": {"tp": 2, "dp": -1, "global_batch_size": 8}}


@pytest.mark.parametrize("patch, field", [
    ({"bogus": 1}, "scenario.bogus"),
    ({"parallel": {"tp": 2, "dp": 2}}, "parallel"),                       # 4 ranks on 8 GPUs
    ({"precision": "nvfp4"}, "precision"),                                 # needs Blackwell
    ({"whatif": {"slow_gpus": {8: 1.5}}}, "whatif.slow_gpus"),            # GPUs 0..7
    ({"overlap": {"tp_comm": "yes"}}, "overlap.tp_comm"),
    ({"grad_reduce_dtype": "fp64"}, "grad_reduce_dtype"),
    ({"overlap": {"everything": True}}, "overlap.everything"),
    ({"num_steps": 0}, "scenario.num_steps"),
    ({"moe_routing": "uniform"}, "scenario.moe_routing"),
    ({"approximations": ["fast"]}, "scenario.approximations"),
    ({"approximations": [{"coupled_all_to_all": True}]}, "scenario.approximations"),
    ({"approximations": 3}, "scenario.approximations"),
])
def test_cross_section_rules(patch, field):
    with pytest.raises(ConfigError) as e:
        load_scenario({**BASE, **patch})
    assert e.value.field == field


def test_dp_rest_is_resolved_against_the_cluster():
    assert load_scenario(BASE).parallel.dp == 4


# -- refusals before the cluster's graph is built -------------------------------------------------
@pytest.fixture
def no_graph(monkeypatch):
    """Building any cluster graph fails the test: the refusal must come first."""
    import topologies.cluster as cl

    def forbidden(spec):
        raise AssertionError(f"built the graph of {spec.num_gpus} GPUs before refusing")
    monkeypatch.setattr(cl, "cluster_table", forbidden)


def test_degrees_that_cannot_match_the_gpus_are_refused_before_the_graph(no_graph):
    # 16,384 DGX hosts = 131,072 GPUs (within the size budget): TP 8 x PP 16 x DP 128 is 16,384
    sc = {"model": "llama3.1-405b", "cluster": {"preset": "h100-16k", "num_nodes": 16384},
          "parallel": {"tp": 8, "pp": 16, "dp": 128, "global_batch_size": 2048}}
    with pytest.raises(ConfigError, match="must equal the number of GPUs, 131072"):
        load_scenario(sc)


def test_a_cluster_over_the_size_budget_is_refused_with_its_estimate(no_graph):
    sc = {"model": "llama3.1-405b", "cluster": {"preset": "h100-16k", "num_nodes": 131072},
          "parallel": {"tp": 8, "pp": 16, "dp": -1, "global_batch_size": 16384}}
    with pytest.raises(ConfigError) as e:
        load_scenario(sc)
    msg = str(e.value)
    assert "1,048,576 GPUs" in msg and "size budget of 131,072 GPUs" in msg
    assert "8.5 M links" in msg and "GB" in msg            # 133,120 links per 16,384 GPUs, scaled


def test_the_cli_refuses_a_huge_cluster_in_one_line(tmp_path, capsys):
    import yaml
    from simulator.cli import main
    p = tmp_path / "huge.yaml"
    p.write_text(yaml.safe_dump({"model": "llama3.1-405b", "cluster": {"preset": "h100-16k", "num_nodes": 131072},
                                 "parallel": {"tp": 8, "pp": 16, "dp": -1, "global_batch_size": 16384}}))
    assert main(["run", str(p), "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "size budget" in err


def test_approximations_are_opt_in_and_echoed(tmp_path, capsys):
    """Exact unless named; a run that used one says so in its metrics and summary."""
    import json

    import yaml

    from simulator import run
    from simulator.cli import main
    moe = {"model": "tiny-moe", "cluster": {"preset": "dgx-h100", "num_nodes": 1}, "moe_routing": "zipf(1.2)",
           "parallel": {"tp": 1, "pp": 1, "ep": 4, "dp": -1, "global_batch_size": 16, "seq_len": 1024}}
    assert load_scenario(moe).approximations == ()
    exact = run(dict(moe))
    assert "approximations" not in exact.metrics
    approx = run({**moe, "approximations": "coupled_all_to_all"})
    assert approx.metrics["approximations"] == ["coupled_all_to_all"]
    assert approx.metrics["num_flows"] < exact.metrics["num_flows"]
    path = tmp_path / "moe.yaml"
    path.write_text(yaml.safe_dump(moe))
    assert main(["run", str(path), "--json", "--quiet", "--approx", "coupled_all_to_all"]) == 0
    assert json.loads(capsys.readouterr().out)["approximations"] == ["coupled_all_to_all"]
    assert main(["run", str(path), "--quiet", "--approx", "coupled_all_to_all"]) == 0
    assert "approximations   coupled_all_to_all" in capsys.readouterr().out
    assert main(["run", str(path), "--quiet", "--approx", "nope"]) == 2


def test_precision_options_override_the_recipe_and_say_what_is_wrong():
    import pytest as _pytest
    from simulator.scenario import load_scenario as _load
    from topologies import ConfigError as _CE
    base = {"model": "tiny-dense", "cluster": {"preset": "dgx-b200", "num_nodes": 1},
            "parallel": {"tp": 1, "pp": 1, "dp": 8, "micro_batch_size": 1, "global_batch_size": 8, "seq_len": 1024},
            "precision": "nvfp4"}
    plain = _load(base)
    assert plain.recipe_or_name == "nvfp4"                     # no options: the name, as before
    sc = _load({**base, "precision_options": {"bf16_first_layers": 1, "bf16_last_layers": 1}})
    r = sc.recipe_or_name
    assert (r.bf16_first_layers, r.bf16_last_layers) == (1, 1)
    assert [r.is_low_precision_layer(i, 4) for i in range(4)] == [False, True, True, False]
    with _pytest.raises(_CE, match="precision_options.bf16_last_layers"):
        _load({**base, "precision_options": {"bf16_last_layers": -1}})
    with _pytest.raises(_CE, match="precision_options"):
        _load({**base, "precision_options": {"fp4_everything": True}})
    with _pytest.raises(_CE, match="fp8_param_gather"):
        _load({**base, "precision": "bf16", "precision_options": {"fp8_param_gather": True}})


def test_accounting_keys_are_chosen_in_the_scenario_and_echoed():
    from simulator import run
    from workloads import FLOP_CONVENTIONS, load_model
    from workloads.costs import model_flops_per_step

    sc = {**BASE, "parallel": {"tp": 2, "pp": 2, "dp": -1, "global_batch_size": 8}, "num_steps": 1}
    base = run(load_scenario(sc)).metrics
    assert (base["flop_convention"], base["memory_accounting"], base["hbm_headroom"]) == \
        ("megatron_core_2025", "megatron", 0.0)
    palm = run(load_scenario({**sc, "flop_convention": "palm_6n"})).metrics
    assert palm["flop_convention"] == "palm_6n" and "palm_6n" in FLOP_CONVENTIONS
    # the same step; MFU scales with the chosen FLOP count
    assert palm["step_time_s"] == base["step_time_s"]
    ratio = model_flops_per_step(load_model("tiny-dense"), 8, None, "palm_6n") / base["model_flops_per_step"]
    assert ratio != 1 and palm["mfu"] == pytest.approx(base["mfu"] * ratio, rel=1e-12)
    # ZeRO's paper counts 2-byte gradients where Megatron keeps fp32 main grads: less memory
    zero = run(load_scenario({**sc, "memory_accounting": "zero_paper"})).metrics
    assert zero["memory_accounting"] == "zero_paper" and zero["peak_memory_bytes"] < base["peak_memory_bytes"]
    # headroom: the margin shrinks by the fraction of HBM kept free
    head = run(load_scenario({**sc, "hbm_headroom": 0.1})).metrics
    hbm = load_scenario(sc).cluster.gpu.hbm_bytes
    assert head["memory_margin_bytes"] == pytest.approx(base["memory_margin_bytes"] - 0.1 * hbm)


@pytest.mark.parametrize("patch, field", [({"flop_convention": "6nd"}, "scenario.flop_convention"),
                                          ({"memory_accounting": "deepspeed"}, "scenario.memory_accounting"),
                                          ({"hbm_headroom": 0.9}, "scenario.hbm_headroom"),
                                          ({"hbm_headroom": -0.1}, "scenario.hbm_headroom"),
                                          ({"hbm_headroom": True}, "scenario.hbm_headroom")])
def test_bad_accounting_keys_name_the_field(patch, field):
    with pytest.raises(ConfigError) as err:
        load_scenario({**BASE, **patch})
    assert err.value.field == field


def test_one_memory_path_counts_the_recipes_fp8_copies_and_fp8_saved_gemm_inputs():
    # run, estimate, search and `clustersim memory` take memory from Scenario.memory_estimates:
    # an FP8 recipe adds its weight copies and saves GEMM inputs for the weight gradient in
    # FP8 (1 byte per element), not BF16; norm inputs and the SwiGLU input stay BF16
    sc = {"model": "llama3-8b", "cluster": {"preset": "dgx-h100", "num_nodes": 1},
          "parallel": {"tp": 2, "pp": 2, "dp": -1, "global_batch_size": 8, "seq_len": 2048}}
    bf16 = load_scenario(sc).memory_estimates()[0]
    fp8 = load_scenario({**sc, "precision": "fp8_delayed"}).memory_estimates()[0]
    assert bf16.fp8_weight_copies_bytes == 0 < fp8.fp8_weight_copies_bytes
    for term in ("attn_input", "attn_output", "ffn_input", "mlp_fc2_input"):
        assert fp8.activations[term] == pytest.approx(bf16.activations[term] / 2), term
    for term in ("norm_inputs", "mlp_fc1_output"):
        assert fp8.activations[term] == bf16.activations[term], term


FIXTURES = Path(__file__).resolve().parents[1] / "workloads" / "fixtures"


def test_a_scenario_takes_its_model_from_a_config_file(tmp_path):
    from workloads.hf_config import model_from_hf_config
    from workloads.megatron_args import model_from_megatron_args
    hf = FIXTURES / "nemotron3_nano_hf_config.json"
    sc = load_scenario({**BASE, "model": {"hf_config": str(hf), "seq_len": 2048}})
    want = model_from_hf_config(hf, seq_len=2048)
    assert sc.model.to_dict() == want.to_dict()
    args = (FIXTURES / "nemotron3_nano_megatron_args.txt").read_text()
    sc2 = load_scenario({**BASE, "model": {"megatron_args": args, "seq_len": 2048}})
    assert sc2.model.num_params() == model_from_megatron_args(args).num_params() == want.num_params()
    # a relative path is read from the scenario file's folder too
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text(hf.read_text())
    y = tmp_path / "s.yaml"
    y.write_text("model: {hf_config: cfg/config.json, seq_len: 2048}\ncluster: dgx-h100\n"
                 "parallel: {tp: 2, dp: -1, global_batch_size: 8}\n")
    assert load_scenario(y).model.num_params() == want.num_params()


@pytest.mark.parametrize("model, field", [({"preset": "llama3-8b", "hf_config": "x.json"}, "model.hf_config"),
                                          ({"hf_config": "/no/such/config.json"}, "model.hf_config"),
                                          ({"megatron_args": 3}, "model.megatron_args")])
def test_bad_model_sources_name_the_field(model, field):
    with pytest.raises(ConfigError) as err:
        load_scenario({**BASE, "model": model})
    assert err.value.field.startswith(field)


def test_cli_model_config_replaces_the_model(tmp_path, capsys):
    from simulator.cli import main
    y = tmp_path / "s.yaml"
    y.write_text("model: {preset: llama3-8b, seq_len: 2048}\ncluster: dgx-h100\n"
                 "parallel: {tp: 2, dp: -1, global_batch_size: 8}\nnum_steps: 1\n")
    assert main(["run", str(y), "--quiet", "--model-config", str(FIXTURES / "nemotron3_nano_hf_config.json")]) == 0
    assert "nemotron_h on 8 x H100" in capsys.readouterr().out


def test_a_run_whose_timeline_would_not_fit_in_memory_is_refused_before_simulating(tmp_path, capsys, monkeypatch):
    """Per-GPU jitter keeps every rank its own cell: the timeline has a row per op of every
    rank.  The run is refused up front, with its estimate, when that would not fit the memory
    budget (here set small), instead of running for minutes and running out of memory."""
    import time

    import yaml

    from simulator import run
    from simulator.cli import main
    from simulator.engine.simulate import ROW_BYTES

    sc = {"model": "tiny-dense", "cluster": {"preset": "dgx-h100", "num_nodes": 4}, "num_steps": 2,
          "parallel": {"tp": 2, "pp": 2, "dp": -1, "global_batch_size": 64, "seq_len": 1024},
          "whatif": {"jitter": {"scope": "gpu_step", "dist": "lognormal(0, 0.05)"}}}
    folded = run({**sc, "whatif": {}})
    rows_per_rank = len(folded.timeline) / folded.folding.num_cells      # every cell: one rank's ops
    # (below the interpreter's own share: not even a streamed timeline, simulator.engine.stream, fits)
    monkeypatch.setenv("CLUSTERSIM_MEMORY_BUDGET_GB", "0.29")
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as e:
        run(sc)
    assert time.perf_counter() - t0 < 5
    msg = str(e.value)
    assert e.value.field == "run" and "32 simulated cells" in msg and "2 steps" in msg
    assert f"{32 * rows_per_rank / 1e6:,.1f} M timeline rows" in msg and "memory budget of 0.3 GB" in msg
    assert folded.folding.num_cells == 2        # without jitter: one cell per stage, well within it
    # through the CLI: one line, exit 2
    p = tmp_path / "jitter.yaml"
    p.write_text(yaml.safe_dump(sc))
    assert main(["run", str(p), "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "memory budget" in err
    monkeypatch.setenv("CLUSTERSIM_MEMORY_BUDGET_GB", "lots")
    with pytest.raises(ConfigError, match="CLUSTERSIM_MEMORY_BUDGET_GB"):
        run(sc)
    assert ROW_BYTES >= 686        # the measured slope (simulate.py) rounded up, never down


# -- user YAML: every unusable file refused in one ConfigError naming it (issue 34) -----------------
@pytest.mark.parametrize("content, rule", [
    (b"", "the file is empty"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "a binary file"),
    (b"model: tiny-dense\nmodel: tiny-moe\ncluster: dgx-h100\n", "duplicate key 'model' at line 2"),
    (b"model: tiny-dense\ncluster: dgx-h100\nparallel: {tp: 2, tp: 4}\n", "duplicate key 'tp' at line 3"),
    (b"- model\n- cluster\n", "holds a list, expected a mapping of sections"),
])
def test_unusable_scenario_files_are_refused_naming_the_file(tmp_path, content, rule):
    p = tmp_path / "s.yaml"
    p.write_bytes(content)
    with pytest.raises(ConfigError) as e:
        load_scenario(p)
    assert e.value.field == "scenario" and e.value.value == str(p) and rule in e.value.rule


def test_a_folder_is_not_a_scenario(tmp_path):
    with pytest.raises(ConfigError, match="is a folder, not a file"):
        load_scenario(tmp_path)


def test_merge_keys_may_still_be_overridden():
    """``<<: *base`` then a key of base is a merge, not a duplicate (YAML's merge-key type)."""
    from simulator.scenario.yaml_input import parse_yaml
    data = parse_yaml("base: &b {tp: 2, pp: 2}\nparallel: {<<: *b, pp: 4}\n", "scenario", "x")
    assert data["parallel"] == {"tp": 2, "pp": 4}


@pytest.mark.parametrize("gbs", [0, -8])
def test_a_global_batch_below_one_is_refused_naming_the_rule(gbs):
    with pytest.raises(ConfigError) as e:
        load_scenario({**BASE, "parallel": {**BASE["parallel"], "global_batch_size": gbs}})
    assert e.value.field == "parallel.global_batch_size" and e.value.value == gbs and ">= 1" in e.value.rule
    # left out, the batch is one micro-batch per replica, as before
    assert load_scenario({**BASE, "parallel": {"tp": 2, "dp": -1}}).parallel.batch_size == 4


def test_a_binary_hf_config_named_in_a_scenario_is_refused_naming_it(tmp_path):
    blob = tmp_path / "config.json"
    blob.write_bytes(b"\xfc\x00\x01 not json")
    for where in (blob, tmp_path):                      # the file, or its folder
        with pytest.raises(ConfigError) as e:
            load_scenario({**BASE, "model": {"hf_config": str(where)}})
        assert e.value.field == "model.hf_config" and "a binary file, not text (at byte 0" in e.value.rule


def test_llama405b_16k_as_meta_ran_it_fits_term_by_term():
    """experiments/configs/llama3.1-405b-16k.yaml follows arXiv:2407.21783 (Table 4, §3.3.2):
    interleaved 1F1B with one layer slot per model chunk (vpp 8, embedding and loss counted
    in the split), no activation checkpointing, FSDP sharding gradients and optimizer state
    (zero_stage 2).  Read as plain 1F1B with ZeRO-1 it was 86.6 GB on stage 1 (0.7 GB over
    80 GiB); no memory term was wrong, the unsharded fp32 gradients (12.75 GB) were.

    Stage 1 (8 layers, 3.188 B parameters per rank), GB: weights 6.376 (bf16, unsharded: FSDP
    does not reshard after the forward), gradients 0.100 (fp32 / 128), master weights 0.100,
    Adam moments 0.199, activations 68.25 (all 16 micro-batches x 8 chunks warmed up: 128 x
    0.533 GB, 31.75 s b h / t bytes per layer plus the fp32 log-sum-exp), dp_buckets 1.024
    (two 128M-parameter fp32 buckets), reserve 3.221: 79.27 of 85.9 GB."""
    sc = load_scenario(CONFIGS / "llama3.1-405b-16k.yaml")
    par = sc.parallel
    assert (par.schedule, par.vpp, par.zero_stage, par.recompute) == ("interleaved_1f1b", 8, 2, "none")
    ests = sc.memory_estimates()
    hbm = sc.usable_hbm_bytes
    assert all(e.fits(hbm) for e in ests)
    worst = max(ests, key=lambda e: e.total_bytes)
    assert worst.stage == 1 and worst.in_flight_microbatches == 16 * 8
    gb = {k: round(v / 1e9, 3) for k, v in worst.terms().items() if v}
    assert gb == {"weights": 6.376, "gradients": 0.1, "master_weights": 0.1, "optimizer_states": 0.199,
                  "activations": 68.251, "dp_buckets": 1.024, "reserve": 3.221}
    assert worst.total_bytes / 1e9 == pytest.approx(79.27, abs=0.01)
    # the first and last ranks hold 7 layers: the embedding and the loss take a layer's slot
    assert [ests[0].num_layers, ests[-1].num_layers] == [7, 7]
