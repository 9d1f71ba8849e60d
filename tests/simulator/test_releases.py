"""Release profiles: a Megatron-Bridge row runs with the switches its release's recipe set.

The data file holds what each release's recipe code set (extracted from the tags); these
tests pin how the harness reads it: the release -> tag map, variant choice, each switch's
scenario setting, and the capped list of features declared not modelled.
"""

import pytest

from simulator.scenario import load_scenario
from simulator.validation import load_runs, row_to_scenario
from simulator.validation.releases import (BRIDGE_TAGS, DECLARED_CAP, DECLARED_NOT_MODELLED, NOT_MODELLED,
                                           _records, bridge_layout, bridge_recipe, bridge_release, bridge_settings)

from .test_validate_cells import BLACKWELL


def test_release_cells_map_to_bridge_tags():
    assert bridge_release("Megatron-Bridge / NeMo 26.04.01") == "26.04.01"
    assert bridge_release("Megatron-Bridge / NeMo 25.09") == "25.09"
    assert bridge_release("NeMo 24.09") is None
    # every record was extracted from the tag its release maps to
    assert {(r["release"], r["bridge_ref"]) for r in _records()} <= set(BRIDGE_TAGS.items())
    assert {r["release"] for r in _records()} == set(BRIDGE_TAGS)


def test_a_variant_that_matches_the_row_wins_over_the_default():
    layout = {"tp": 1, "pp": 4, "cp": 1, "vpp": 4, "ep": 64, "mbs": 1, "gbs": 4096}
    rec, how = bridge_recipe("26.08", "DeepSeekV3", "GB200", "mxfp8", layout)
    assert rec["recipe"] == "deepseek_v3" and "match" in how
    rec, how = bridge_recipe("26.08", "DeepSeekV3", "GB200", "mxfp8", {**layout, "gbs": 12345})
    assert rec["default"] and "no variant matches" in how
    rec, how = bridge_recipe("26.08", "DeepSeekV3", "H100", "mxfp8", layout)
    assert rec is None and "no Megatron-Bridge 26.08" in how


def _settings(release, model, gpu, precision, par, moe):
    layout = {"tp": par["tp"], "pp": par["pp"], "cp": 1, "vpp": par.get("vpp", 1), "ep": par.get("ep", 1),
              "mbs": par.get("mbs", 1), "gbs": par.get("gbs", 0)}
    rec, _ = bridge_recipe(release, model, gpu, precision, layout)
    return bridge_settings(rec, {"cp": 1, "ep": 1, "dp": 1, **par}, moe)


def test_deepseek_v3_2608_gb200_mxfp8_switches():
    s, notes = _settings("26.08", "DeepSeekV3", "GB200", "mxfp8",
                         {"tp": 1, "pp": 4, "vpp": 4, "ep": 64, "dp": 1, "gbs": 4096}, True)
    assert s["host"] == "cuda_graphs"                          # cuda_graph_impl full_iteration
    assert s["parallel"]["recompute"] == "selective" and s["parallel"]["recompute_modules"] == ["mla_up_proj"]
    assert s["cluster"] == {"nvls": False}                     # NCCL_NVLS_ENABLE=0
    assert s["overlap"]["tp_comm"] is False and s["overlap"]["p2p"] is True
    text = " | ".join(notes)
    assert "perf_recipes/deepseek/gb200/deepseek_v3.py @ v0.6.0" in text
    # the dispatcher is modelled, and the EP overlap together with the interleaved p2p overlap
    assert s["moe"]["token_dispatcher"] == "flex" and s["moe"]["flex_dispatcher_backend"] == "hybridep"
    assert "expert-parallel all-to-all overlap" not in text
    assert s["overlap"]["moe_ep_comm"] is True and "EP communication overlap" in text


def test_qwen3_30b_recipe_runs_hybridep_with_its_ep_overlap():
    s, notes = _settings("26.08", "Qwen3_30B_a3B", "GB200", "mxfp8",
                         {"tp": 1, "pp": 1, "ep": 8, "dp": 8, "mbs": 4, "gbs": 512}, True)
    assert s["moe"]["token_dispatcher"] == "flex" and s["moe"]["flex_dispatcher_backend"] == "hybridep"
    text = " | ".join(notes)
    assert "moe dispatcher flex (hybridep)" in text and "dispatcher" not in "".join(
        n for n in notes if n.startswith(NOT_MODELLED))


def test_llama3_70b_fsdp_recipe_becomes_zero3_with_activation_offload():
    s, notes = _settings("26.04.01", "LLAMA3_70B", "GB200", "fp8_tensorwise",
                         {"tp": 1, "pp": 1, "dp": 64, "mbs": 2, "gbs": 256}, False)
    assert s["parallel"]["zero_stage"] == 3 and s["host"] == "eager"
    assert s["overlap"] == {"tp_comm": False, "grad_reduce": True, "param_gather": True, "p2p": False}
    assert s["offload"] == {"activations": 40}
    assert not any(n.startswith(NOT_MODELLED) for n in notes)
    # Megatron-Core has no CPU offloading with pipeline parallelism: a row at pp 16 drops it
    s, notes = _settings("25.11", "LLAMA3.1_405B", "GB200", "fp8_tensorwise",
                         {"tp": 4, "pp": 16, "vpp": 4, "dp": 4, "mbs": 1, "gbs": 1536}, False)
    assert "offload" not in s and any("pipeline parallelism" in n for n in notes)


def test_fp4_gathers_fp8_attention_and_paged_stash_become_settings():
    s, notes = _settings("26.08", "Qwen3_235B_a22B", "GB200", "mxfp8",
                         {"tp": 1, "pp": 8, "vpp": 3, "ep": 32, "dp": 32, "mbs": 1, "gbs": 8192}, True)
    assert s["precision_options"]["fp8_attention"] is True and s["moe"]["paged_stash"] is True
    s, _ = _settings("26.06", "LLAMA3.1_405B", "GB200", "nvfp4",
                     {"tp": 4, "pp": 16, "vpp": 8, "dp": 4, "mbs": 1, "gbs": 1536}, False)
    assert s["precision_options"]["fp4_param_gather"] is True


def test_tp_comm_overlap_needs_tp_2_and_p2p_overlap_needs_interleaving():
    s, _ = _settings("26.06", "LLAMA3.1_405B", "GB200", "fp8_tensorwise",
                     {"tp": 4, "pp": 16, "vpp": 4, "dp": 4, "gbs": 1536}, False)
    assert s["overlap"]["tp_comm"] is True and s["overlap"]["p2p"] is True
    rec = next(r for r in _records() if r["knobs"].get("tp_comm_overlap") and r["knobs"].get("tp") == 1)
    s, _ = bridge_settings(rec, {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "dp": 8}, False)
    assert s["overlap"]["tp_comm"] is False and s["overlap"]["p2p"] is False


def test_cuda_graph_scopes():
    def host(knobs, moe):
        return bridge_settings({"knobs": knobs, "source": "x @ y", "bridge_ref": "y"},
                               {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "dp": 8}, moe)
    assert host({"enable_cuda_graph": True}, False)[0]["host"] == "cuda_graphs"          # 25.09 per-layer graphs
    assert host({"cuda_graph_impl": "local", "cuda_graph_scope": ["full_iteration"]}, False)[0]["host"] == "cuda_graphs"
    assert host({"cuda_graph_impl": "none", "cuda_graph_scope": "full_iteration"}, False)[0]["host"] == "eager"
    assert host({"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ["mlp", "attn"]}, False)[0]["host"] \
        == "cuda_graphs"                                                                  # the whole dense layer
    s, notes = host({"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ["attn", "moe_router"]}, True)
    assert s["host"] == {"cuda_graph_scope": ["attn", "moe_router"]}                   # experts and dispatch eager
    assert not any(n.startswith(NOT_MODELLED) for n in notes)
    # 26.08's recipes record the scopes as CudaGraphModule members
    mods = [f"<megatron.core.transformer.enums.CudaGraphModule.{m}>" for m in ("attn", "mamba", "moe_router")]
    assert host({"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": mods}, True)[0]["host"] == \
        {"cuda_graph_scope": ["attn", "mamba", "moe_router"]}
    load_scenario({"model": "tiny-moe", "cluster": {"preset": "dgx-h100", "num_nodes": 1}, "host": s["host"],
                   "parallel": {"tp": 1, "pp": 1, "dp": 8, "global_batch_size": 8, "seq_len": 512}})


def test_every_recipe_reads_and_its_unmodelled_features_are_declared():
    assert len(DECLARED_NOT_MODELLED) <= DECLARED_CAP
    seen = set()
    for rec in _records():
        k = rec["knobs"]
        par = {"tp": k.get("tp") or 1, "pp": k.get("pp") or 1, "vpp": k.get("vpp") or 1, "cp": 1,
               "ep": k.get("ep") or 1, "dp": 2}
        for moe in (False, True):
            _, notes = bridge_settings(rec, par, moe)
            for n in notes:
                if n.startswith(NOT_MODELLED):
                    what = n[len(NOT_MODELLED):]
                    key = next((d for d in DECLARED_NOT_MODELLED if what.startswith(d)), None)
                    assert key is not None, f"undeclared: {what}"
                    seen.add(key)
    assert seen == set(DECLARED_NOT_MODELLED), set(DECLARED_NOT_MODELLED) - seen


def test_deepseek_layouts_come_from_the_recipes_by_stage_count():
    layout, rec = bridge_layout("deepseek_v3", 32, "25.11")
    assert layout == "Et|(tt|)*30mL" and rec["release"] == "25.09"
    assert bridge_layout("deepseek_v3", 7, "26.08") is None


def test_blackwell_deepseek_rows_run_with_the_recipes_layout_and_mtp():
    rows = {r["row_id"]: r for r in load_runs(BLACKWELL)}
    sc, notes = row_to_scenario(rows["95"])                  # 26.08, pp 4 x vpp 4
    assert sc["parallel"]["pipeline_layout"].endswith("tmL")
    load_scenario(sc)
    sc, notes = row_to_scenario(rows["329"])                 # w/o MTP, pp 8 x vpp 4: a 32-stage layout, MTP removed
    assert "m" not in sc["parallel"]["pipeline_layout"] and any("MTP layer removed" in n for n in notes)
    assert load_scenario(sc).model.mtp_layers == 0


@pytest.mark.parametrize("row_id, zero, dist", [("161", 1, True), ("160", 3, True)])
def test_ddp_in_the_table_keeps_the_recipes_distributed_optimizer(row_id, zero, dist):
    rows = {r["row_id"]: r for r in load_runs(BLACKWELL)}
    sc, _ = row_to_scenario(rows[row_id])
    assert (sc["parallel"]["zero_stage"], sc["parallel"]["distributed_optimizer"]) == (zero, dist)


def test_recipe_precision_details_reach_the_scenario():
    rows = {r["row_id"]: r for r in load_runs(BLACKWELL)}
    sc, notes = row_to_scenario(rows["131"])                 # 405B NVFP4, 26.06: no BF16 layers at the ends
    assert sc["precision"] == "nvfp4"
    assert sc["precision_options"] == {"bf16_first_layers": 0, "bf16_last_layers": 0, "fp4_param_gather": True}
    s = load_scenario(sc)
    assert s.recipe_or_name.bf16_first_layers == 0 and s.recipe_or_name.bf16_last_layers == 0
    sc, _ = row_to_scenario(rows["130"])                     # 405B MXFP8: FP8 parameter all-gather
    assert sc["precision_options"]["fp8_param_gather"] is True
    assert load_scenario(sc).recipe_or_name.param_gather_bytes_per_param < 2.0
