"""The torchtitan / PyTorch FSDP stacks (workloads/stacks/torchtitan/): SDPA's kernel by torch
version, eager PyTorch's unfused element-wise kernels (closed-form bytes), FSDP2's FP32
gradient reduction, and the validation mapping of framework cells to the stacks."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simulator.scenario import load_scenario
from simulator.validation.mapping import row_to_scenario
from topologies import ConfigError, get_gpu_spec
from workloads import ParallelConfig, build_program, load_model
from workloads.blocks import kernels as kn
from workloads.costs.flops import layer_ops
from workloads.ops import is_fsdp_gather, is_grad_bucket
from workloads.stacks import get_stack
from workloads.stacks.megatron_te import STACK as MC
from workloads.stacks.torchtitan import sdpa_backend

_H100 = get_gpu_spec("H100")
_TITAN_ORDER = ("cudnn", "flash", "math")


@pytest.mark.parametrize("version,generation,expect", [
    ("2.4.1", "hopper", "flash_attention_2"),     # flash, efficient, math, cuDNN
    ("2.5.0", "hopper", "cudnn_sdpa"),            # 2.5.0 put cuDNN first
    ("2.5.1", "hopper", "flash_attention_2"),
    ("2.7.0+cu126", "hopper", "flash_attention_2"),
    ("2.9.0", "hopper", "cudnn_sdpa"),            # check_prefer_cudnn_attention on sm90+
    ("2.9.0", "blackwell", "cudnn_sdpa"),
    ("2.9.0", "ampere", "flash_attention_2"),
])
def test_sdpa_default_backend_by_torch_version(version, generation, expect):
    assert sdpa_backend(version, generation) == expect


def test_torchtitan_priority_runs_cudnn_on_hopper_and_flash_on_ampere():
    assert sdpa_backend("2.7.0", "hopper", _TITAN_ORDER) == "cudnn_sdpa"
    assert sdpa_backend("2.7.0", "ampere", _TITAN_ORDER) == "flash_attention_2"
    assert get_stack("torchtitan").fusion.attention_backend == "cudnn_sdpa"
    assert get_stack("pytorch_fsdp").fusion.attention_backend == "flash_attention_2"


@pytest.mark.parametrize("bad", ["two.four", "1.13.1"])
def test_bad_torch_version_is_refused_with_the_field(bad):
    with pytest.raises(ConfigError, match="torch_version"):
        sdpa_backend(bad, "hopper")


def _ops(framework, model="tiny-dense", seq=None):
    m = load_model(model)
    par = ParallelConfig(tp=1, pp=1, dp=1, micro_batch_size=1, global_batch_size=1)
    ops = layer_ops(m, par, 0, 1, seq or m.seq_len, fusion=get_stack(framework).fusion)
    return m, {(o.name, o.phase): o for o in ops}


def test_eager_rmsnorm_moves_seven_and_nineteen_activation_passes():
    """Fused norm: F 2 a, B 3 a (a = one BF16 pass over the activation); eager nn.RMSNorm
    F 7 a in 6 kernels, B 19 a in 10 kernels."""
    m, fused = _ops("megatron_core")
    _, eager = _ops("torchtitan")
    tokens = fused[("attn_norm", "F")].mem_bytes / (2 * kn.act_bytes() * m.hidden_size)
    a = kn.act_bytes() * tokens * m.hidden_size
    for name in ("attn_norm", "mlp_norm"):
        assert eager[(name, "F")].mem_bytes == pytest.approx(7 * a)
        assert eager[(name, "B")].mem_bytes == pytest.approx(19 * a)
        assert (eager[(name, "F")].num_kernels, eager[(name, "B")].num_kernels) == (6, 10)
        assert fused[(name, "B")].mem_bytes == pytest.approx(3 * a)
    assert eager[("attn_residual", "B")].mem_bytes == pytest.approx(1.5 * fused[("attn_residual", "B")].mem_bytes)


def test_eager_swiglu_and_rope_bytes():
    """silu(gate) * up: 5 and 9 passes of the FFN output against the fused 3 and 5; RoPE as
    complex products: 10 passes per direction against the fused 2, six kernels each way."""
    _, fused = _ops("megatron_core")
    _, eager = _ops("torchtitan")
    assert eager[("mlp_act", "F")].mem_bytes == pytest.approx(5 / 3 * fused[("mlp_act", "F")].mem_bytes)
    assert eager[("mlp_act", "B")].mem_bytes == pytest.approx(9 / 5 * fused[("mlp_act", "B")].mem_bytes)
    assert eager[("rope", "F")].mem_bytes == pytest.approx(5 * fused[("rope", "F")].mem_bytes)
    assert (eager[("rope", "F")].num_kernels, eager[("rope", "B")].num_kernels) == (6, 6)


def test_compile_stack_is_the_fused_kernels_with_sdpa_attention():
    """torch.compile fuses the element-wise groups: the default stack's kernels but SDPA's
    attention; the collectives and overlap rules are the default stack's in every variant."""
    titan, comp = get_stack("torchtitan"), get_stack("torchtitan_compile")
    assert replace(comp.fusion, attention_backend="te_fused") == MC.fusion
    assert replace(titan.fusion, elementwise="fused") == comp.fusion
    for s in (titan, comp, get_stack("pytorch_fsdp")):
        for f in ("lowering", "stage_program", "assign_issue_modes", "check_layout"):
            assert getattr(s, f) is getattr(MC, f)


def test_eager_is_slower_than_compiled_and_fa2_slower_than_cudnn_on_h100():
    def step(fw):
        m = load_model("tiny-dense")
        par = ParallelConfig(tp=1, pp=1, dp=8, zero_stage=3, distributed_optimizer=True, micro_batch_size=1,
                             global_batch_size=8)
        prog = build_program(m, par, _H100, framework=fw)
        return sum(o.duration_s for o in prog.classes[0].ops if o.kind.name == "COMPUTE")
    assert step("megatron_core") < step("torchtitan_compile") < step("torchtitan") < step("pytorch_fsdp")


def test_fsdp2_fp32_reduce_scatter_carries_twice_the_bf16_bytes():
    """torchtitan's mixed_precision_reduce = float32: 4 B per gradient element against 2 B;
    the BF16 parameter gathers are the same in both."""
    def prog(dtype):
        m = load_model("tiny-dense")
        par = ParallelConfig(tp=1, pp=1, dp=8, zero_stage=3, distributed_optimizer=True, micro_batch_size=1,
                             global_batch_size=16)
        return build_program(m, par, _H100, framework="torchtitan", grad_reduce_dtype=dtype)
    def total(p, pred):
        return sum(o.size_bytes for o in p.classes[0].ops if pred(o))
    f32, b16 = prog("fp32"), prog("bf16")
    assert total(f32, is_grad_bucket) == pytest.approx(2 * total(b16, is_grad_bucket), rel=1e-12)
    assert total(f32, is_fsdp_gather) == total(b16, is_fsdp_gather) > 0


_ROW = {"gpu_type": "H100 80GB", "num_gpus": "8", "tp": "1", "pp": "1", "model": "test-dense", "num_layers": "4",
        "hidden_size": "1024", "ffn_hidden_size": "4096", "num_heads": "8", "vocab_size": "32000", "seq_len": "2048",
        "micro_batch_size": "1", "global_batch_size": "16", "precision": "BF16"}


@pytest.mark.parametrize("cell,stack", [
    ("torchtitan", "torchtitan"),
    ("PyTorch FSDP2", "pytorch_fsdp"),
    ("FSDP", "pytorch_fsdp"),
    ("llm-foundry/Composer, PyTorch FSDP", "llm_foundry"),
    ("DeepSpeed ZeRO-3", "deepspeed"),
])
def test_framework_cells_map_to_their_stacks(cell, stack):
    scenario, notes = row_to_scenario(dict(_ROW, framework=cell), "published")
    assert scenario["framework"] == stack and f"kernel stack {stack}" in notes
    assert load_scenario(scenario).framework == stack


@pytest.mark.parametrize("cell", ["Megatron-DeepSpeed", "NeMo 24.09"])
def test_megatron_deepspeed_and_nemo_rows_keep_the_default_stack(cell):
    scenario, _ = row_to_scenario(dict(_ROW, framework=cell), "published")
    assert "framework" not in scenario


def test_scenario_framework_names_the_known_stacks_when_wrong():
    with pytest.raises(ConfigError, match="scenario.framework.*torchtitan_compile"):
        load_scenario({"model": "tiny-dense", "cluster": {"preset": "dgx-h100", "num_nodes": 1},
                       "parallel": {"tp": 1, "pp": 1, "dp": 8, "micro_batch_size": 1, "global_batch_size": 8},
                       "precision": "bf16", "framework": "torchtitan-eager"})
