"""Qwen3-Next (gated DeltaNet + gated attention, workloads/blocks/gated_deltanet.py): its
parameters equal Hugging Face's modules, its layers compose as the config says, and its
kernels, memory, FLOPs and program come from the blocks."""

from __future__ import annotations

import pytest

from topologies import ConfigError, get_gpu_spec
from workloads import OpName, ParallelConfig, build_program, load_model
from workloads.blocks import layer_blocks
from workloads.blocks.gated_deltanet import gdn_scan_kernels
from workloads.costs.flops import get_flop_convention, layer_ops
from workloads.memory import layer_activation_bytes

H100 = get_gpu_spec("H100")


def hf_qwen3_next_params(h=2048, layers=48, heads=16, kv=2, d=256, vocab=151936, nk=16, nv=32, dk=128, dv=128,
                         conv=4, experts=512, fe=512, fs=512, interval=4) -> int:
    """The parameters of transformers' Qwen3NextForCausalLM for the Qwen3-Next-80B-A3B config,
    module by module (models/qwen3_next/modeling_qwen3_next.py): embed_tokens, per layer
    input_layernorm and post_attention_layernorm, the token mixer, the sparse MoE block, the
    final norm and lm_head (untied).  MTP weights (mtp.*) are not modules there."""
    attention = (h * heads * d * 2 + h * kv * d + h * kv * d + heads * d * h   # q_proj (query and gate), k, v, o
                 + d + d)                                                        # q_norm, k_norm
    K, V = nk * dk, nv * dv
    deltanet = (h * (2 * K + 2 * V) + h * 2 * nv       # in_proj_qkvz, in_proj_ba
                + (2 * K + V) * conv                   # conv1d weight (no bias)
                + nv + nv + dv                         # dt_bias, A_log, the gated norm's weight
                + V * h)                               # out_proj
    moe = (experts * h                                 # gate (router)
           + experts * (2 * fe * h + h * fe)           # experts.gate_up_proj, experts.down_proj
           + 3 * h * fs + h)                           # shared_expert (gate, up, down), shared_expert_gate
    per_layer = [2 * h + (attention if (i + 1) % interval == 0 else deltanet) + moe for i in range(layers)]
    return vocab * h + sum(per_layer) + h + vocab * h


def test_parameters_equal_hugging_face_modules():
    m = load_model("qwen3-next-80b-a3b")
    assert m.num_params() == hf_qwen3_next_params()
    assert m.num_params(include_mtp=True) == m.num_params()        # no MTP modelled (HF has none)
    assert round(m.num_params() / 1e9) == 80                        # the model card's "80B"


def test_three_of_four_layers_are_gated_deltanet():
    m = load_model("qwen3-next-80b-a3b")
    kinds = [layer_blocks(m, i)[0].kind for i in range(m.num_layers)]
    assert kinds == (["gated_deltanet"] * 3 + ["attention"]) * 12
    assert all(layer_blocks(m, i)[1].kind == "moe" for i in range(m.num_layers))


def test_scan_bytes_have_the_stated_closed_form():
    """Forward: 11 q/k + 6 v + TH (2a + 8f) + THC (2a + 2f) + 2 a S bytes, with q/k = a T H dk,
    v = a T H dv, S = T H dk dv / C chunk-state elements, a = 2 (BF16), f = 4 (FP32)."""
    T, H, dk, dv, C = 4096, 16, 128, 128, 64
    f, _ = gdn_scan_kernels(T, H, dk, dv, C)
    a, fp = 2, 4
    TH, S = T * H, T * H * dk * dv / C
    want = 11 * a * TH * dk + 6 * a * TH * dv + TH * (2 * a + 8 * fp) + TH * C * (2 * a + 2 * fp) + 2 * a * S
    assert sum(x for _, x in f) == pytest.approx(want, rel=1e-12)


def test_kernels_memory_and_flops_come_from_the_blocks():
    m = load_model("qwen3-next-80b-a3b")
    par = ParallelConfig(tp=2, pp=1, dp=1, ep=1, etp=1, sequence_parallel=True, micro_batch_size=1,
                         global_batch_size=1, seq_len=4096)
    gdn = {o.name for o in layer_ops(m, par, 0)}
    att = {o.name for o in layer_ops(m, par, 3)}
    assert {"gdn_in_proj", "gdn_conv1d", "gdn_scan", "gdn_gated_norm", "gdn_out_proj"} <= gdn
    assert "core_attn" not in gdn and {"core_attn", "attn_gate"} <= att
    assert {"shared_gate", "shared_gate_mul"} <= gdn
    act = layer_activation_bytes(m, par, 0)
    assert act["gdn_scan_state"] > 0 and act["q"] == 0
    assert layer_activation_bytes(m, par, 3)["attn_gate"] > 0
    assert get_flop_convention("megatron_core_2025")(m, 4096) > 0
    with pytest.raises(ConfigError, match="gated DeltaNet"):
        get_flop_convention("nemo_24")(m, 4096)


def test_the_program_runs_the_mixers_between_tp_collectives_and_refuses_cp():
    m = load_model({"preset": "qwen3-next-80b-a3b", "num_layers": 4})
    par = ParallelConfig(tp=2, pp=1, dp=2, ep=2, etp=1, sequence_parallel=True, micro_batch_size=1,
                         global_batch_size=2, seq_len=4096)
    ops = build_program(m, par, H100).classes[0].ops
    names = [o.name for o in ops]
    assert names.count(OpName.GDN) == 3 and names.count(OpName.ATTN) == 1
    assert names.count(OpName.GDN_BWD) == 3
    with pytest.raises(ConfigError, match="context parallelism for gated DeltaNet"):
        build_program(m, ParallelConfig(tp=2, cp=2, pp=1, dp=1, ep=2, etp=1, sequence_parallel=True,
                                        micro_batch_size=1, global_batch_size=1, seq_len=4096), H100)
