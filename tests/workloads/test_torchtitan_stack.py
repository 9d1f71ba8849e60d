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
    assert replace(comp.fusion, attention_backend="te_fused", optimizer="megatron", fsdp2_copies=False,
                   float8_casts="te") == MC.fusion
    assert replace(titan.fusion, elementwise="fused", moe_kernels="megatron", float8_casts="torchao_compiled") == comp.fusion
    for s in (titan, comp, get_stack("pytorch_fsdp")):
        for f in ("lowering", "stage_program", "check_layout"):
            assert getattr(s, f) is getattr(MC, f)
    assert comp.assign_issue_modes is MC.assign_issue_modes


def test_tp_overlap_is_async_tp_only_under_compile():
    """torchtitan's maybe_enable_async_tp (tensor_parallel.py v0.2.2) needs compile: the eager
    stacks refuse overlap.tp_comm; the compiled one overlaps as the default stack does."""
    m = load_model("tiny-dense")
    par = ParallelConfig(tp=2, pp=1, dp=4, sequence_parallel=True, micro_batch_size=1, global_batch_size=4)
    for fw in ("torchtitan", "pytorch_fsdp"):
        with pytest.raises(ConfigError, match="overlap.tp_comm.*torchtitan_compile"):
            build_program(m, par, _H100, framework=fw, overlap={"tp_comm": True})
        build_program(m, par, _H100, framework=fw, overlap={"tp_comm": False})
    comp = build_program(m, par, _H100, framework="torchtitan_compile", overlap={"tp_comm": True})
    mc = build_program(m, par, _H100, framework="megatron_core", overlap={"tp_comm": True})
    assert [o.issue for o in comp.classes[0].ops if o.group == "tp"] == \
        [o.issue for o in mc.classes[0].ops if o.group == "tp"] != []


def test_stacks_run_fsdp2_copies_and_torch_adamw():
    """torchtitan (eager or compiled): FSDP2 and fused AdamW; a plain PyTorch loop: FSDP2 and
    AdamW's foreach default; the default stack neither."""
    assert (MC.fusion.optimizer, MC.fusion.fsdp2_copies) == ("megatron", False)
    for fw, opt in (("torchtitan", "torch_fused"), ("torchtitan_compile", "torch_fused"),
                    ("pytorch_fsdp", "torch_foreach")):
        assert (get_stack(fw).fusion.optimizer, get_stack(fw).fusion.fsdp2_copies) == (opt, True)


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


def _moe_ops(framework):
    m = load_model("tiny-moe")
    par = ParallelConfig(tp=1, pp=1, dp=1, micro_batch_size=1, global_batch_size=1)
    layer = next(i for i in range(m.num_layers) if m.moe.is_moe_layer(i))
    ops = layer_ops(m, par, layer, 1, m.seq_len, fusion=get_stack(framework).fusion)
    return m, {(o.name, o.phase): o for o in ops}


def test_torchtitan_eager_moe_router_and_permutation_bytes():
    """torchtitan's MoE module eager (moe.py, utils.py v0.2.2): router + reorderer (a + 24) TE
    + 116 Tk in 13 kernels; permute (8 a + 16) R h in 6; unpermute 6 a R h + a T h in 4 --
    against Megatron's fused 3 x 4 TE and a h (T (1 + k) + 2 R) in 3 kernels each."""
    m, eager = _moe_ops("torchtitan")
    _, fused = _moe_ops("torchtitan_compile")
    a, h, E, k = kn.act_bytes(), m.hidden_size, m.moe.num_experts, m.moe.top_k
    T = fused[("router_topk", "F")].mem_bytes / (3 * 4 * E)
    R = T * k
    assert eager[("router_topk", "F")].mem_bytes == pytest.approx((a + 24) * T * E + 116 * T * k)
    assert eager[("router_topk", "B")].mem_bytes == pytest.approx((20 + a) * T * E + 44 * T * k)
    assert eager[("moe_permute", "F")].mem_bytes == pytest.approx((8 * a + 16) * R * h)
    assert eager[("moe_permute", "B")].mem_bytes == pytest.approx(a * T * h + (9 * a + 28) * R * h)
    assert eager[("moe_unpermute", "F")].mem_bytes == pytest.approx(6 * a * R * h + a * T * h)
    assert eager[("moe_unpermute", "B")].mem_bytes == pytest.approx(4 * a * R * h)
    assert [eager[(n, "F")].num_kernels for n in ("router_topk", "moe_permute", "moe_unpermute")] == [13, 6, 4]
    assert fused[("moe_permute", "F")].mem_bytes == pytest.approx(a * h * (T * (1 + k) + 2 * R))
    # the norm, the experts' SwiGLU and the residual run eagerly too; the grouped GEMMs are the same
    assert eager[("mlp_norm", "F")].num_kernels == 6 and eager[("expert_act", "F")].num_kernels == 2
    for name in ("expert_fc1", "expert_fc2"):
        assert eager[(name, "F")].flops == fused[(name, "F")].flops > 0


def test_eager_moe_is_slower_than_fused_by_its_extra_bytes():
    """The MoE layer's compute time under torchtitan (eager) minus the compiled stack's equals
    the extra bytes of its element-wise kernels at the compute model's HBM rate (same GEMMs)."""
    from workloads.costs import RooflineComputeModel
    cm = RooflineComputeModel(_H100)
    _, eager = _moe_ops("torchtitan")
    _, fused = _moe_ops("torchtitan_compile")
    ew_names = [key for key, o in eager.items() if o.op_class == "elementwise"]
    def t(ops, keys):
        return float(sum(cm.op_times_s([ops[key] for key in keys])))
    gemm = [key for key, o in eager.items() if o.op_class != "elementwise"]
    assert t(eager, gemm) == pytest.approx(t(fused, gemm), rel=1e-12)
    assert t(eager, ew_names) > 1.5 * t(fused, ew_names)
    # the default stack and the plain PyTorch loop keep Megatron's MoE kernels
    _, mc = _moe_ops("megatron_core")
    _, plain = _moe_ops("pytorch_fsdp")
    for key in ("router_topk", "moe_permute", "moe_unpermute"):
        assert mc[(key, "F")] == fused[(key, "F")] == plain[(key, "F")]


def _quant_ops(framework, precision="fp8_tensorwise"):
    from workloads.costs.precision import get_recipe, with_quantize_ops
    m = load_model("tiny-dense")
    par = ParallelConfig(tp=1, pp=1, dp=1, micro_batch_size=1, global_batch_size=1)
    fusion = get_stack(framework).fusion
    ops = with_quantize_ops(get_recipe(precision), layer_ops(m, par, 0, 1, m.seq_len, fusion=fusion),
                            m.num_layers, fusion.float8_casts)
    return {(o.name, o.phase): o for o in ops}


def test_torchao_tensorwise_casts_eager_and_compiled():
    """torchao (float8_linear.py v0.13.0): fprop casts the input and the weight, dgrad the output
    gradient twice, the weight and the saved input; 33 B / element in 10 kernels per cast eager,
    5 B in 2 compiled; Transformer Engine's recipe casts the input (6 B) and weights once a step."""
    from workloads.costs.precision import TORCHAO_CAST
    eager, comp, te = _quant_ops("torchtitan"), _quant_ops("torchtitan_compile"), _quant_ops("megatron_core")
    f, d = eager[("fc1", "F")], eager[("fc1", "B")]
    tokens, k, n = f.m, f.k, f.n
    assert eager[("fc1.quantize", "F")].mem_bytes == pytest.approx(33 * (tokens * k + n * k))
    assert eager[("fc1.quantize", "B")].mem_bytes == pytest.approx(33 * (2 * tokens * d.k + d.n * d.k + tokens * d.n))
    assert comp[("fc1.quantize", "F")].mem_bytes == pytest.approx(5 * (tokens * k + n * k))
    assert (eager[("fc1.quantize", "F")].num_kernels, comp[("fc1.quantize", "B")].num_kernels) == (20, 8)
    assert te[("fc1.quantize", "F")].mem_bytes == pytest.approx(6 * tokens * k)
    assert TORCHAO_CAST == {"torchao_eager": (33.0, 10), "torchao_compiled": (5.0, 2)}
    # other recipes keep their own casts; BF16 adds none
    assert _quant_ops("torchtitan", "fp8_delayed")[("fc1.quantize", "F")] == \
        _quant_ops("megatron_core", "fp8_delayed")[("fc1.quantize", "F")]
    assert not any(name.endswith(".quantize") for name, _ in _quant_ops("torchtitan", "bf16"))


def test_torchao_casts_drop_the_once_a_step_weight_quantize():
    def names(fw):
        m = load_model("tiny-dense")
        par = ParallelConfig(tp=1, pp=1, dp=8, micro_batch_size=1, global_batch_size=8)
        return {o.name for o in build_program(m, par, _H100, framework=fw, precision="fp8_tensorwise").classes[0].ops}
    assert "weight_quantize" in names("megatron_core")
    assert "weight_quantize" not in names("torchtitan_compile")
