"""The harness reads real tables cell by cell: annotated booleans, recompute / precision /
sharding names, dimensions like ``2048 per expert``, variant tags in model names, FLOP
definitions that count the recomputed forward pass, and the Blackwell development set.

No simulation here: the mapping, the measured step and the scoring tables only.
"""

import io
from pathlib import Path

import pytest

from simulator.scenario import load_scenario
from simulator.validation import (
    InvalidRow,
    Unsupported,
    load_runs,
    map_model,
    map_precision,
    measured_step,
    row_to_scenario,
    source_convention,
    validate,
)
from simulator.validation.ingest import _bool
from simulator.validation.mapping import _recompute, _zero, model_variants
from simulator.validation.report import (ProgressBar, family, generation, layout_rank_correlation, paired_ratios,
                                         per_config, summary)
from workloads import load_model, model_flops_per_step

REF = Path(__file__).resolve().parents[2] / "experiments" / "reference"
BLACKWELL = REF / "published_runs_blackwell.csv"

BASE = {"row_id": "r1", "source_id": "synthetic", "framework": "NeMo 24.09", "gpu_type": "H100-SXM-80GB",
        "num_gpus": "64", "gpus_per_node": "8", "model": "Llama 3.1 70B", "seq_len": "8192", "tp": "4", "pp": "4",
        "vpp": "5", "dp": "2", "cp": "2", "micro_batch_size": "1", "global_batch_size": "128", "precision": "BF16",
        "step_time_s": "14.72", "_format": "published"}


def row(**kw):
    return {**BASE, **kw}


# -- cells --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, value", [("yes (TP/SP)", True), ("no (pre-SP)", False), ("Yes", True),
                                         ("true; per recipe", True), ("off", False)])
def test_annotated_booleans_read_their_first_word(text, value):
    assert _bool({"sp": text}, "sp") is value


def test_a_boolean_cell_that_says_something_else_is_invalid():
    with pytest.raises(InvalidRow, match="sp 'maybe'"):
        _bool({"sp": "maybe"}, "sp")


@pytest.mark.parametrize("text, recompute", [("full AC", "full"), ("selective AC", "selective"),
                                             ("per-op SAC", "selective"),
                                             ("selective (attention core only)", "selective"),
                                             ("none", "none")])
def test_recompute_names(text, recompute):
    assert _recompute(text)["recompute"] == recompute


@pytest.mark.parametrize("text, stage", [("DDP (FSDP=0 per doc)", 0), ("DDP", 0), ("FSDP2", 3), ("ZeRO-3", 3),
                                         ("Megatron-FSDP (sharding group = GPUs/(TP*PP))", 3), ("ZeRO-1", 1),
                                         ("ZeRO stage 2", 2)])
def test_sharding_names(text, stage):
    # "DDP (FSDP=0 per doc)" contains "fsdp": it must still read as plain data parallelism
    assert _zero(text) == stage


@pytest.mark.parametrize("text, fw, recipe", [
    ("FP8-MX", None, "mxfp8"), ("FP8-CS", None, "fp8_tensorwise"), ("FP8", None, "fp8_delayed"),
    ("FP8", "megatron_bridge", "fp8_tensorwise"), ("float8 rowwise", None, "fp8_tensorwise"),
    ("BF16 + Float8 linears", None, "fp8_tensorwise"), ("MXFP8", "megatron_bridge", "mxfp8"),
    ("NVFP4", "megatron_bridge", "nvfp4")])
def test_precision_names_by_framework(text, fw, recipe):
    got, notes = map_precision(text, fw)
    assert got == recipe
    if text in ("FP8", "float8 rowwise", "BF16 + Float8 linears"):
        assert notes                      # every reading that is not literal is said


def test_torchtitan_fp8_is_tensorwise_and_deepspeed_overlaps_only_at_zero3():
    assert map_precision("FP8", "torchtitan")[0] == "fp8_tensorwise"
    ds = row(framework="DeepSpeed 0.14", tp="1", pp="1", vpp="", cp="", dp="64", zero_fsdp="ZeRO-3")
    sc, notes = row_to_scenario(ds)
    assert sc["parallel"]["zero_stage"] == 3
    assert sc["overlap"]["grad_reduce"] is True and sc["overlap"]["param_gather"] is True
    sc, _ = row_to_scenario({**ds, "zero_fsdp": "ZeRO-2"})
    assert sc["overlap"]["grad_reduce"] is False and sc["parallel"]["sequence_parallel"] is False
    sc, _ = row_to_scenario({**ds, "framework": "Megatron-DeepSpeed", "zero_fsdp": ""})
    assert sc["parallel"]["zero_stage"] == 0          # Megatron-DeepSpeed reads as Megatron-LM


def test_model_variant_tags():
    assert model_variants("DeepSeekV3 (w/o MTP)") == ("DeepSeekV3", ("no_mtp",))
    assert model_variants("DeepSeekV3 (w/ MTP)") == ("DeepSeekV3", ("mtp",))
    assert model_variants("Qwen3_30B_a3B (tokendrop)") == ("Qwen3_30B_a3B", ("tokendrop",))
    assert map_model("Qwen3_235B_a22B (tokendrop)") == ("qwen3-235b-a22b", None)


DSV3 = row(framework="Megatron-Bridge / NeMo 26.08", gpu_type="GB200 (Blackwell GPU in NVL72 rack)",
           gpus_per_node="4", num_gpus="256", model="DeepSeekV3", num_layers="61", hidden_size="7168",
           ffn_hidden_size="2048 per expert", num_heads="128", num_experts="256 routed + 1 shared", moe_top_k="8",
           seq_len="4096", tp="1", pp="4", vpp="4", dp="64", cp="1", ep="64", global_batch_size="4096",
           micro_batch_size="1", precision="MXFP8", step_time_s="", tokens_per_s_per_gpu="4912")


def test_expert_width_and_shared_experts_cells():
    sc, notes = row_to_scenario(DSV3)
    # 2048 per expert, 256 + 1 shared: the preset's own; the recipe adds only its dispatcher settings
    # and its paged stash
    assert sc["model"]["preset"] == "deepseek-v3"
    assert set(sc["model"]["moe"]) <= {"token_dispatcher", "flex_dispatcher_backend", "expert_rank_capacity_factor",
                                       "paged_stash"}
    m = load_model(sc["model"])
    assert (m.moe.expert_ffn_hidden_size, m.moe.num_experts, m.moe.num_shared_experts) == (2048, 256, 1)
    sc, notes = row_to_scenario({**DSV3, "ffn_hidden_size": "1024 per expert", "num_experts": "128 routed + 2 shared"})
    moe = {k: v for k, v in sc["model"]["moe"].items()
           if k not in ("token_dispatcher", "flex_dispatcher_backend", "expert_rank_capacity_factor", "paged_stash")}
    assert moe == {"num_experts": 128, "expert_ffn_hidden_size": 1024, "num_shared_experts": 2}
    with pytest.raises(InvalidRow, match="ffn_hidden_size"):
        row_to_scenario({**DSV3, "model": "Llama 3.1 70B", "ffn_hidden_size": "2048 per expert",
                         "num_experts": "", "moe_top_k": "", "num_heads": "", "num_layers": "", "hidden_size": "",
                         "ep": "1", "dp": "", "pp": "4"})


def test_mtp_variants_change_the_model():
    sc, notes = row_to_scenario({**DSV3, "model": "DeepSeekV3 (w/o MTP)"})
    assert sc["model"]["mtp_layers"] == 0 and load_model(sc["model"]).mtp_layers == 0
    assert any("w/o MTP" in n for n in notes)
    sc, _ = row_to_scenario({**DSV3, "model": "DeepSeekV3 (w/ MTP)"})
    assert load_model(sc["model"]).mtp_layers == 1
    with pytest.raises(Unsupported, match="no MTP module"):
        row_to_scenario(row(model="Llama 3.1 70B (w/ MTP)"))


def test_tokendrop_sets_the_capacity_factor_and_says_why_nothing_drops():
    sc, notes = row_to_scenario({**DSV3, "model": "DeepSeekV3 (tokendrop)"})
    assert sc["model"]["moe"]["capacity_factor"] == 1.0
    assert load_model(sc["model"]).moe.capacity_factor == 1.0
    assert any("forced-balanced" in n for n in notes)
    with pytest.raises(InvalidRow, match="token-drop"):
        row_to_scenario(row(model="Llama 3.1 70B (tokendrop)"))


def test_expert_parallelism_wider_than_dp_folds_with_expert_tp_1():
    # Megatron-Bridge Qwen3 235B token-drop on 64 GB200: TP2 DP32 EP64 -- the expert mesh
    # (etp 1 x ep 64) spans the 64 ranks of tp x dp
    r = {**DSV3, "model": "Qwen3_235B_a22B", "num_gpus": "64", "tp": "2", "pp": "1", "vpp": "1", "dp": "32",
         "ep": "64", "num_layers": "", "hidden_size": "", "ffn_hidden_size": "", "num_heads": "", "num_experts": "",
         "moe_top_k": "", "global_batch_size": "1024"}
    sc, notes = row_to_scenario(r)
    par = load_scenario(sc).parallel
    assert (par.tp, par.dp, par.ep, par.expert_tp, par.expert_dp) == (2, 32, 64, 1, 1)
    assert any("parallel folding" in n for n in notes)
    with pytest.raises(InvalidRow, match="divides neither"):
        row_to_scenario({**r, "ep": "128"})


@pytest.mark.parametrize("cell", ["8 (TP*PP)", "8 (MP)", "16 model parallel", "8 (pp x tp)"])
def test_a_model_parallel_size_without_its_split_says_so(cell):
    with pytest.raises(Unsupported, match="without the TP/PP split"):
        row_to_scenario(row(tp=cell, pp="", vpp=""))


# -- FLOP definitions -----------------------------------------------------------------------------------
def test_a_definition_that_counts_the_recomputed_forward_gives_four_passes():
    # SC'21-style rows: TFLOP/s with the recompute forward counted.  Reading them with the
    # 3-pass count would derive a step 25 % short.
    r = row(framework="Megatron-LM", model="GPT3-175B", vocab_size="51200", seq_len="2048", num_gpus="1024",
            tp="8", pp="16", vpp="", cp="", dp="8", global_batch_size="1536", step_time_s="",
            tflops_per_gpu="138", tflops_definition="megatron_2021 count including activation recomputation "
                                                      "(4 passes)")
    conv, why = source_convention(r)
    assert conv == "megatron_2021+recompute_forward" and "4 passes" in why
    sc, _ = row_to_scenario(r)
    step, how, _ = measured_step(r, scenario=sc)
    m = load_model(sc["model"])
    eq3 = model_flops_per_step(m, 1536, 2048, "narayanan_eq3", vocab_size=51200)
    assert step == pytest.approx(eq3 / (138e12 * 1024), rel=1e-12)      # exactly the paper's eq. 3
    three = model_flops_per_step(m, 1536, 2048, "megatron_2021", vocab_size=51200) / (138e12 * 1024)
    assert step / three == pytest.approx(1.33, abs=0.01)
    assert source_convention({**r, "tflops_definition": "narayanan eq. 3"})[0] == "narayanan_eq3"


# -- the Blackwell development set ----------------------------------------------------------------------
KNOWN_REASONS = ("unsupported: unknown model",)


def test_every_blackwell_row_maps_or_says_exactly_why():
    rows = load_runs(BLACKWELL)
    assert len(rows) == 117
    mapped = 0
    for r in rows:
        try:
            scenario, notes = row_to_scenario(r)
        except Unsupported as e:
            # the only rows left out are models clustersim cannot build yet, named
            assert e.reason.startswith("unknown model"), (r["row_id"], e.reason)
            continue
        sc = load_scenario(scenario)
        assert sc.cluster.num_gpus == int(r["num_gpus"])
        step, how, _ = measured_step(r, scenario=scenario)
        assert step > 0 and "tokens_per_s_per_gpu" in how
        mapped += 1
    assert mapped >= 78, mapped


def _fake(step):
    class R:
        metrics = {"step_time_s": step}
    return R()


def test_scoring_tables_per_generation_family_and_configuration(tmp_path):
    res = validate(BLACKWELL, run_fn=lambda sc: _fake(1.0))
    text = summary(res)
    for title in ("GPU generation", "model family", "per configuration", "paired ratios"):
        assert title in text
    assert {generation(r["gpu"]) for r in res} == {"Blackwell"}
    assert {"Llama", "DeepSeek", "Qwen", "gpt-oss", "Nemotron"} <= {family(r["model"]) for r in res}
    configs = per_config(res)
    assert len(configs) < len(res)                  # releases of one configuration collapse into one
    # a configuration's error is the median over its releases
    ok = [c for c in configs if c["status"] == "ok"]
    assert ok and all(isinstance(c["error_pct"], float) for c in ok)


def test_paired_ratios_compare_what_changed():
    def r(i, prec, gpu, par, measured, predicted, n="64"):
        return {"id": i, "source": "s", "framework": "MB 26.04", "model": "LLAMA3_70B", "gpu": gpu, "num_gpus": n,
                "precision": prec, "parallel": par, "status": "ok", "measured_step_s": measured,
                "predicted_step_s": predicted, "error_pct": (predicted / measured - 1) * 100}
    res = [r("a", "MXFP8", "GB200", "tp2 pp4", 10.0, 11.0), r("b", "NVFP4", "GB200", "tp2 pp4", 8.0, 9.9),
           r("c", "MXFP8", "B200", "tp1 pp8", 12.0, 12.0), r("d", "MXFP8", "GB200", "tp1 pp1", 9.0, 10.0),
           r("e", "MXFP8", "GB200", "tp4 pp2", 11.0, 12.5)]
    pairs = {(p["kind"], p["a"], p["b"]): p for p in paired_ratios(res)}
    p = pairs[("precision", "a", "b")]
    assert p["measured_ratio"] == pytest.approx(0.8) and p["predicted_ratio"] == pytest.approx(0.9)
    assert p["ratio_error_pct"] == pytest.approx(12.5)       # a uniform 10 % bias would give 0 here
    assert ("gpu", "a", "c") in pairs and ("layout", "a", "d") in pairs
    assert not any(k[0] == "gpu" and "b" in k[1:] for k in pairs)   # NVFP4 has no B200 partner
    (corr,) = layout_rank_correlation(res)
    assert corr["layouts"] == 3 and corr["spearman"] == pytest.approx(1.0)


def test_progress_bar_prints_a_line_per_tenth_off_a_terminal():
    out = io.StringIO()
    bar = ProgressBar(out)
    for i in range(1, 101):
        bar(i, 100)
    lines = out.getvalue().splitlines()
    assert len(lines) == 11 and lines[-1].startswith("[" + "#" * 30 + "] 100/100 rows")
    assert "left" in lines[0] and "left" not in lines[-1]


def test_llm_foundry_rows_run_on_the_llm_foundry_stack():
    """A row whose framework cell names llm-foundry / Composer runs on the ``llm_foundry``
    kernel stack (its attention kernel; the Triton one outside the "Large Scale" table), with
    FSDP FULL_SHARD read from the row."""
    import csv

    from simulator.validation.mapping import row_to_scenario
    path = Path(__file__).resolve().parents[2] / "experiments" / "reference" / "published_runs_llmfoundry.csv"
    with path.open() as f:
        row = next(r for r in csv.DictReader(f) if "Large Scale" not in r["source_location"])
    scenario, notes = row_to_scenario(row, "published")
    assert scenario["framework"] == "llm_foundry" and "kernel stack llm_foundry" in notes
    assert scenario["parallel"]["zero_stage"] == 3
    assert load_scenario(scenario).framework == "llm_foundry"


def _llm_foundry_rows():
    import csv
    path = Path(__file__).resolve().parents[2] / "experiments" / "reference" / "published_runs_llmfoundry.csv"
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("mode, dtype", [("DEFAULT", "fp32"), ("PURE", "bf16")])
def test_composer_mp_mode_sets_the_gradient_reduction_dtype(mode, dtype):
    """Composer's get_mixed_precision: DEFAULT reduces gradients in FP32, PURE in BF16."""
    from simulator.validation.mapping import row_to_scenario
    row = {**_llm_foundry_rows()[0], "precision": f"amp_bf16 (MP mode {mode})"}
    scenario, notes = row_to_scenario(row, "published")
    assert scenario["grad_reduce_dtype"] == dtype
    assert any(f"MP mode {mode}" in n for n in notes)
    assert load_scenario(scenario).grad_reduce_dtype == dtype


def test_composer_full_mode_is_unsupported_naming_the_cell():
    from simulator.validation.ingest import Unsupported
    from simulator.validation.mapping import row_to_scenario
    row = {**_llm_foundry_rows()[0], "precision": "amp_bf16 (MP mode FULL)"}
    with pytest.raises(Unsupported, match="precision .*FULL.*FP32"):
        row_to_scenario(row, "published")


def test_each_llm_foundry_row_runs_the_attention_its_sweep_gave_it():
    """The "Large Scale" H100 table's MPT 1b/3b/7b/70b runs had attn_impl flash (sweep.py
    @5e85bd62); its 13b/30b and every other table's runs the Triton default."""
    from simulator.validation.mapping import row_to_scenario
    seen = {}
    for row in _llm_foundry_rows():
        scenario, _ = row_to_scenario(row, "published")
        large = "large scale" in row["source_location"].lower()
        seen.setdefault((large, row["model"].lower()), set()).add(scenario["framework"])
    for (large, model), stacks in seen.items():
        flash = large and model.split("-")[1] in ("1b", "3b", "7b", "70b")
        assert stacks == {"llm_foundry_flash" if flash else "llm_foundry"}, (large, model)
    assert (True, "mpt-13b") in seen and (True, "mpt-7b") in seen


@pytest.mark.parametrize("pp, layers, expect", [(1, 32, 16), (2, 32, 8), (4, 30, 4), (1, 1, 1)])
def test_torchtitan_default_checkpoints_every_second_block(pp, layers, expect):
    """torchtitan v0.2.2's default AC (mode selective, selective_ac_option "2": every second
    block fully checkpointed) runs as full recompute of ceil(half) of each stage's layers."""
    from simulator.validation.mapping import row_to_scenario
    from workloads.stacks.megatron_te.layers import _recompute_kind
    row = {"framework": "torchtitan", "gpu_type": "H100 80GB", "num_gpus": str(8 * pp), "tp": "1", "pp": str(pp),
           "model": "test-dense",
           "num_layers": str(layers), "hidden_size": "1024", "ffn_hidden_size": "4096", "num_heads": "8",
           "vocab_size": "32000",
           "seq_len": "2048", "micro_batch_size": "1", "global_batch_size": str(8 * pp * 2), "precision": "BF16"}
    scenario, _ = row_to_scenario(row, "published")
    par = load_scenario(scenario).parallel
    assert (par.recompute, par.recompute_method, par.recompute_num_layers) == ("full", "block", expect)
    per_stage = layers // pp
    assert sum(_recompute_kind(par, i, per_stage) == "full" for i in range(per_stage)) == -(-per_stage // 2)
