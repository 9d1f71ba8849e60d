"""Rows from tables the harness has not seen: every cell read in the spellings real tables use,
or refused with the harness's refusal (Unsupported / InvalidRow) naming the cell and value.

The last test is a seeded fuzz: rows built from a shipped reference row with cells drawn from
these lists either map to a scenario ``load_scenario`` accepts or are refused, naming the cell.
No simulation here.
"""

import random
import re
from pathlib import Path

import pytest

from simulator.scenario import load_scenario
from simulator.validation import InvalidRow, Unsupported, load_runs, map_gpu, map_precision, row_to_scenario
from simulator.validation.ingest import PUBLISHED_COLUMNS, _bool
from simulator.validation.mapping import _network, _recompute, _zero, model_from_dimensions, stated_architecture
from topologies import ConfigError, load_preset
from topologies.specs import get_gpu_spec
from workloads import load_model

REF = Path(__file__).resolve().parents[2] / "experiments" / "reference"

# -- ZeRO / FSDP --------------------------------------------------------------------------------------
ZERO = [("ZeRO-1", 1), ("ZeRO stage 2", 2), ("zero_stage=3", 3), ("DeepSpeed ZeRO-3", 3), ("ZeRO-0", 0),
        ("FSDP FULL_SHARD", 3), ("FSDP FULL_SHARD (ZeRO-3-like)", 3), ("FSDP SHARD_GRAD_OP", 2),
        ("FSDP SHARD_GRAD_OP (ZeRO-2-like)", 2), ("NO_SHARD", 0), ("FSDP NO_SHARD", 0), ("FSDP2", 3),
        ("fully_shard", 3), ("distributed optimizer", 1), ("dist-opt", 1), ("--use-distributed-optimizer", 1),
        ("Megatron-FSDP", 3), ("DDP", 0), ("DDP (FSDP=0 per doc)", 0), ("none", 0), ("ZeRO-1 (distributed optimizer)", 1),
        ("ZeRO-3 + CPU offload", 3), ("ZeRO-Infinity", 3), ("ZeRO-Offload", 2)]
ZERO_REFUSED = ["HYBRID_SHARD", "HSDP", "FSDP HYBRID_SHARD", "ZeRO", "maybe"]


@pytest.mark.parametrize("text, stage", ZERO)
def test_sharding_spellings(text, stage):
    assert _zero(text) == stage


@pytest.mark.parametrize("text", ZERO_REFUSED)
def test_sharding_it_cannot_model_is_refused_naming_the_cell(text):
    with pytest.raises(Unsupported, match=re.escape(f"zero_fsdp {text!r}")):
        _zero(text)


def test_shard_grad_op_rows_run_as_zero_2():
    r = next(r for r in load_runs(REF / "published_runs_llmfoundry.csv") if "SHARD_GRAD_OP" in r["zero_fsdp"])
    sc, _ = row_to_scenario(r)
    par = load_scenario(sc).parallel
    assert (par.zero_stage, par.distributed_optimizer) == (2, True)


# -- booleans -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, value", [("yes (TP/SP)", True), ("\u2713", True), ("\u2714 (with TP)", True),
                                         ("Y", True), ("enabled", True), ("sp=true", True), ("True", True),
                                         ("yes: per recipe", True),
                                         ("\u2717", False), ("N", False), ("disabled", False), ("no (pre-SP)", False),
                                         ("-", None), ("n/a", None), ("", None)])
def test_boolean_spellings(text, value):
    assert _bool({"sp": text}, "sp") is value


# -- precision ----------------------------------------------------------------------------------------
PRECISION = [("BF16", None, "bf16"), ("bf16-mixed", None, "bf16"), ("amp_bf16", None, "bf16"),
             ("AMP BF16", None, "bf16"), ("fp16 mixed", None, "bf16"), ("FP16", None, "bf16"),
             ("FP8 (TE)", None, "fp8_delayed"), ("FP8 (TE)", "megatron_bridge", "fp8_tensorwise"),
             ("fp8 delayed scaling", None, "fp8_delayed"), ("fp8 delayed scaling", "megatron_bridge", "fp8_delayed"),
             ("MXFP8", None, "mxfp8"), ("FP8-CS", None, "fp8_tensorwise"), ("float8 rowwise", None, "fp8_tensorwise"),
             ("FP8 tensor-wise", None, "fp8_tensorwise"), ("FP8 blockwise", None, "fp8_blockwise"),
             ("NVFP4", None, "nvfp4"), ("amp_fp8 (MP mode DEFAULT)", None, "fp8_delayed")]


@pytest.mark.parametrize("text, fw, recipe", PRECISION)
def test_precision_spellings(text, fw, recipe):
    assert map_precision(text, fw)[0] == recipe


@pytest.mark.parametrize("text", ["FP32", "TF32", "MXFP4", "int8"])
def test_precision_it_cannot_model_is_refused_naming_the_cell(text):
    with pytest.raises(Unsupported, match=re.escape(f"precision {text!r}")):
        map_precision(text)


# -- recompute ----------------------------------------------------------------------------------------
RECOMPUTE = [("full", {"recompute": "full"}), ("selective", {"recompute": "selective"}),
             ("none", {"recompute": "none"}), ("activation checkpointing", {"recompute": "full"}),
             ("AC=full", {"recompute": "full"}), ("recompute: selective", {"recompute": "selective"}),
             ("full (uniform, 1 layer)", {"recompute": "full", "recompute_num_layers": 1}),
             ("block 4", {"recompute": "full", "recompute_method": "block", "recompute_num_layers": 4}),
             ("full (FSDP activation_checkpointing)", {"recompute": "full"}), ("no AC", {"recompute": "none"}),
             ("per-op SAC", {"recompute": "selective"}), ("off", {"recompute": "none"}), ("-", None)]


@pytest.mark.parametrize("text, settings", RECOMPUTE)
def test_recompute_spellings(text, settings):
    assert _recompute(text) == settings


@pytest.mark.parametrize("text", ["partial", "sometimes"])
def test_recompute_it_cannot_model_is_refused_naming_the_cell(text):
    with pytest.raises(Unsupported, match=re.escape(f"activation_recompute {text!r}")):
        _recompute(text)


# -- network ------------------------------------------------------------------------------------------
NETWORK = [  # cell, preset, (NICs per host, Gb/s per NIC) or None for the preset's own
    ("8x400Gb/s IB", "dgx-h100", None), ("3.2 Tbps per node", "dgx-h100", None), ("400G per GPU", "dgx-h100", None),
    ("ConnectX-7 NDR 400", "dgx-h100", None), ("RoCE 4x200Gbps", "dgx-h100", (4, 200)),
    ("8x400Gb/s IB", "dgx-a100", (8, 400)), ("3.2 Tbps per node", "dgx-a100", (8, 400)),
    ("1600 Gbps node-node RoCE", "dgx-a100", None), ("1600 Gbps node-node RoCE", "dgx-h100", (8, 200)),
    ("IB (50 GB/s) per GPU", "hgx-h800", None), ("2x200G per GPU", "dgx-a100", (8, 400)),
    ("not stated in table", "dgx-h100", None), ("8x NDR", "dgx-a100", (8, 400)),
    ("8x100GbE", "dgx-h100", (8, 100)), ("NVIDIA GPU fabric, 400G", "dgx-a100", None),
]


@pytest.mark.parametrize("text, preset, want", NETWORK)
def test_network_cells_per_gpu_per_host_or_per_nic(text, preset, want):
    net, notes = _network(text, load_preset(preset))
    if want is None:
        assert net == {}
    else:
        assert (net["nics_per_host"], net["nic_bandwidth"]) == (want[0], f"{want[1]} Gb/s")
        assert notes and "per host" in notes[0]
    if want is None and "fabric" in text:
        assert "kept" in notes[0]          # a rate that says neither per GPU nor per host


def test_a_bare_rate_keeps_the_preset_and_says_so():
    net, notes = _network("100 Gbps", load_preset("dgx-h100"))
    assert net == {} and "preset" in notes[0] and "'100 Gbps'" in notes[0]


# -- GPUs ---------------------------------------------------------------------------------------------
GPUS = [("A800 80GB", "dgx-a100", "A800-SXM4-80GB"), ("A800-SXM4-80GB", "dgx-a100", "A800-SXM4-80GB"),
        ("H800", "hgx-h800", "H800-SXM"), ("H100 SXM5", "dgx-h100", "H100-SXM"),
        ("H100-80GB-HBM3", "dgx-h100", "H100-SXM"), ("NVIDIA H100 80GB HBM3", "dgx-h100", "H100-SXM"),
        ("A100-SXM4-40GB", "dgx-a100", "A100-SXM4-40GB"), ("H200", "dgx-h200", "H200-SXM")]


@pytest.mark.parametrize("text, preset, gpu", GPUS)
def test_gpu_spellings(text, preset, gpu):
    assert map_gpu(text)[:2] == (preset, gpu)


@pytest.mark.parametrize("text", ["H20", "NVIDIA H20 96GB", "A100 40GB PCIe", "H100 PCIe", "A800 40GB PCIe",
                                  "GH200", "V100"])
def test_gpus_without_a_spec_are_refused_naming_the_cell(text):
    with pytest.raises(Unsupported, match=re.escape(f"gpu_type {text!r}")):
        map_gpu(text)


def test_export_skus_have_half_the_nvlink_per_direction():
    # A800 / H800: 400 GB/s both directions together, 200 per direction (A100 300, H100 450)
    assert get_gpu_spec("A800").nvlink_bandwidth_bytes_per_s == 200e9
    assert get_gpu_spec("H800").nvlink_bandwidth_bytes_per_s == 200e9
    a800, a100 = get_gpu_spec("A800-SXM4-80GB"), get_gpu_spec("A100-SXM4-80GB")
    assert (a800.peak_flops, a800.hbm_bandwidth_bytes_per_s) == (a100.peak_flops, a100.hbm_bandwidth_bytes_per_s)
    sc, notes = row_to_scenario(_llama(gpu_type="A800 80GB"))
    assert load_scenario(sc).cluster.gpu.name == "A800-SXM4-80GB" and any("A800" in n for n in notes)


# -- models from dimensions and stated layer counts ---------------------------------------------------
def _mpt(**kw):
    base = {"model": "MPT-7b", "num_layers": "32", "hidden_size": "4096", "ffn_hidden_size": "16384",
            "num_heads": "32", "vocab_size": "50368", "seq_len": "2048", "params_b": "", "notes": ""}
    return {**base, **kw}


def test_the_architecture_a_row_states_is_taken():
    assert stated_architecture(_mpt(notes="MPT arch: ALiBi, no biases, tied embeddings")) == \
        {"position_embedding": "none", "tied_embeddings": True, "add_bias_linear": False}
    assert stated_architecture(_mpt(notes="GPT-2 style: learned absolute position embeddings, biases, LayerNorm")) \
        == {"position_embedding": "learned", "add_bias_linear": True, "norm": "layernorm"}
    assert stated_architecture(_mpt(notes="untied input/output embeddings, RoPE, SwiGLU")) == \
        {"position_embedding": "rope", "tied_embeddings": False, "mlp": "swiglu"}


def test_alibi_biases_and_tying_change_the_count_the_row_is_checked_against():
    # MPT-7B: ALiBi (no position table), no biases, tied embeddings: 6.649B as llm-foundry counts it
    m, note = model_from_dimensions(_mpt(notes="ALiBi, no biases, tied embeddings", params_b="6.649"))
    assert (m["position_embedding"], m["tied_embeddings"], m["add_bias_linear"], m["mlp"]) == \
        ("none", True, False, "gelu")
    assert "ALiBi" in note and abs(load_model(m).num_params() / 6.649e9 - 1) < 0.01
    # the same dimensions stated with biases and a learned table count more parameters
    m2, _ = model_from_dimensions(_mpt(notes="learned positions, biases, tied embeddings", params_b="6.649"))
    assert m2["add_bias_linear"] and load_model(m2).num_params() > load_model(m).num_params()
    # an architecture the row states that cannot reach its size is refused, naming it
    with pytest.raises(Unsupported, match="stated in the row: SwiGLU|mlp swiglu"):
        model_from_dimensions(_mpt(notes="SwiGLU, untied", params_b="6.649"))


def _llama(**kw):
    base = {"row_id": "x", "framework": "NeMo 24.09", "gpu_type": "H100-SXM-80GB", "num_gpus": "64",
            "model": "Llama 3.1 70B", "seq_len": "8192", "tp": "4", "pp": "4", "vpp": "5", "dp": "4", "cp": "1",
            "micro_batch_size": "1", "global_batch_size": "128", "precision": "BF16", "step_time_s": "10",
            "_format": "published"}
    return {**base, **kw}


@pytest.mark.parametrize("layers", ["80", "40", "60"])
def test_a_row_that_states_its_layer_count_is_simulated_with_it(layers):
    sc, _ = row_to_scenario(_llama(num_layers=layers, vpp=""))
    assert load_scenario(sc).model.num_layers == int(layers)
    built, _ = row_to_scenario({**_llama(), **_mpt(num_layers=layers, notes="ALiBi"), "tp": "1", "pp": "1", "vpp": "",
                                "dp": "64", "global_batch_size": "256", "framework": "llm-foundry"})
    assert load_scenario(built).model.num_layers == int(layers)


def test_a_hybrid_preset_with_another_layer_count_is_refused():
    r = next(r for r in load_runs(REF / "published_runs_blackwell.csv") if r["model"].startswith("Nemotron_3_Super"))
    with pytest.raises(Unsupported, match="num_layers 44: .*hybrid"):
        row_to_scenario({**r, "num_layers": "44"})


def test_a_recipe_layout_is_not_used_for_another_layer_count():
    r = next(r for r in load_runs(REF / "published_runs_blackwell.csv")
             if r["model"] == "DeepSeekV3" and r["pp"] not in ("", "1"))
    sc, notes = row_to_scenario({**r, "num_layers": "60"})
    assert "pipeline_layout" not in sc["parallel"] and load_scenario(sc).model.num_layers == 60
    assert any("the row states 60" in n for n in notes)


# -- fuzz ---------------------------------------------------------------------------------------------
SPELLINGS = {
    "zero_fsdp": [t for t, _ in ZERO] + ZERO_REFUSED + [""],
    "sp": ["yes (TP/SP)", "\u2713", "Y", "enabled", "no", "", "-", "perhaps"],
    "precision": [t for t, _, _ in PRECISION] + ["FP32", "MXFP4", ""],
    "activation_recompute": [t for t, _ in RECOMPUTE] + ["CPU offload", "sometimes", ""],
    "inter_node_network": [t for t, _, _ in NETWORK] + ["100 Gbps", "0x400Gb/s", ""],
    "gpu_type": [t for t, _, _ in GPUS] + ["H20", "A100 40GB PCIe", "GB200 NVL72", "B200", ""],
    "framework": ["NeMo 24.09", "Megatron-LM", "DeepSpeed 0.14", "torchtitan", "llm-foundry/Composer",
                  "Megatron-Bridge / NeMo 26.04", "MaxText", ""],
}


def _base_rows():
    """One row of each shipped published-format set that maps as shipped."""
    out = []
    for name in ("published_runs_h100.csv", "published_runs_llmfoundry.csv", "published_runs_blackwell.csv"):
        for r in load_runs(REF / name):
            try:
                row_to_scenario(r)
            except (Unsupported, InvalidRow):
                continue
            out.append(r)
            break
    return out


def test_fuzz_rows_of_real_spellings_map_or_are_refused_naming_the_cell():
    rng = random.Random(20261129)
    bases = _base_rows()
    assert len(bases) == 3
    mapped = refused = 0
    for _ in range(300):
        r = dict(rng.choice(bases))
        changed = rng.sample(sorted(SPELLINGS), rng.randint(1, 3))
        for col in changed:
            r[col] = rng.choice(SPELLINGS[col])
        try:
            sc, _notes = row_to_scenario(r)
        except (Unsupported, InvalidRow) as e:
            # the reason names a cell: the one drawn, or one a drawn cell made matter (a GPU that
            # cannot run the precision, a host size, a pipeline split no recipe gives)
            assert re.match(rf"(?:{'|'.join(PUBLISHED_COLUMNS)})\b", e.reason), \
                ({c: r[c] for c in changed}, e.reason)
            refused += 1
            continue
        try:
            load_scenario(sc)
        except ConfigError as e:                    # the scenario's own check (the harness's 'invalid' status)
            pytest.fail(f"{ {c: r[c] for c in changed} } mapped to a scenario load_scenario refuses: {e}")
        mapped += 1
    assert mapped > 100 and refused > 30, (mapped, refused)
