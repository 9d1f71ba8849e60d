"""Kernel stacks (workloads/stacks/): the framework's rules live in the stack, the engine and
the estimator read what it sets."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest

from topologies import ConfigError
from workloads import Group, Issue, Op, OpKind, OpName, ParallelConfig, Phase, Stream, build_program, load_model
from workloads.ops import Coll
from workloads.stacks import DEFAULT_STACK, KERNEL_STACKS, get_stack
from workloads.stacks.megatron_te.issue import issue_mode

ROOT = Path(__file__).resolve().parents[2]


def _coll(name, group=Group.TP):
    return Op(Stream.TP, OpKind.COLLECTIVE, name, 0, 0, 0, Phase.F, 0.0, 0.0, Coll.ALL_GATHER, group, 0, 1e6, -1, None)


@pytest.mark.parametrize("name, group, overlap, mode", [
    (OpName.CP_HOP, Group.CP, {}, Issue.BESIDE_NEXT),
    (OpName.CP_HOP, Group.CP, {"cp_comm": False}, Issue.BLOCKING),
    (OpName.SP_AG, Group.TP, {}, Issue.BLOCKING),
    (OpName.SP_AG, Group.TP, {"tp_comm": True}, Issue.OVERLAP_NEXT),
    (OpName.SP_AG_INPUT, Group.TP, {}, Issue.BESIDE_NEXT),
    (OpName.SP_AG_INPUT, Group.TP, {"tp_comm": True}, Issue.OVERLAP_NEXT),
    (OpName.GRAD_DENSE, Group.DP_CP, {}, Issue.DP_STREAM),
    (OpName.GRAD_DENSE, Group.DP_CP, {"grad_reduce": False}, Issue.BLOCKING),
    (OpName.PARAM_GATHER_DENSE, Group.DP_CP, {}, Issue.DP_STREAM),
    (OpName.PARAM_GATHER_EXPERT, Group.EDP, {"param_gather": False}, Issue.BLOCKING),
    (OpName.FSDP_GATHER, Group.DP_CP, {}, Issue.PREFETCH),
    (OpName.FSDP_GATHER, Group.DP_CP, {"fsdp_prefetch": False}, Issue.BLOCKING),
    (OpName.GRAD_NORM, Group.WORLD, {"tp_comm": True}, Issue.BLOCKING),
])
def test_megatron_core_issue_modes(name, group, overlap, mode):
    assert issue_mode(_coll(name, group), overlap) == mode


def test_compute_is_blocking_whatever_the_switches():
    op = Op(Stream.COMPUTE, OpKind.COMPUTE, OpName.ATTN, 0, 0, 0, Phase.F, 1.0, 1.0, Coll.NONE, Group.NONE, -1, 0.0,
            -1, None)
    assert issue_mode(op, {"tp_comm": True, "cp_comm": True}) == Issue.BLOCKING


def test_the_program_carries_the_modes_the_overlap_switches_ask_for():
    m = load_model("tiny-dense")
    par = ParallelConfig(tp=2, pp=1, dp=1, sequence_parallel=True, micro_batch_size=1, global_batch_size=2)
    plain = build_program(m, par, get_gpu())
    overlapped = build_program(m, par, get_gpu(), overlap={"tp_comm": True})
    tp = [o for o in plain.classes[0].ops if o.group == Group.TP]
    assert {o.issue for o in tp} == {Issue.BLOCKING, Issue.BESIDE_NEXT}
    assert {o.issue for o in overlapped.classes[0].ops if o.group == Group.TP} == {Issue.OVERLAP_NEXT}
    assert plain.framework == DEFAULT_STACK


def get_gpu():
    from topologies import get_gpu_spec
    return get_gpu_spec("H100")


def test_unknown_framework_is_refused_with_the_known_ones():
    with pytest.raises(ConfigError, match="megatron_core, llm_foundry"):
        get_stack("maxtext")
    assert set(KERNEL_STACKS) == {DEFAULT_STACK, "llm_foundry", "llm_foundry_flash", "torchtitan", "torchtitan_compile",
                                  "pytorch_fsdp", "deepspeed"}


def test_a_block_the_stack_does_not_lower_is_refused_before_any_work():
    stack = get_stack()
    with pytest.raises(ConfigError, match="does not run 'hyena' blocks"):
        stack.check_blocks(["attention", "hyena"])


RULE_NAMES = {"is_cp_hop", "is_te_async", "is_fsdp_gather"}


@pytest.mark.parametrize("module, switches", [
    ("simulator/engine/simulate.py", {"cp_comm", "tp_comm", "fsdp_prefetch", "param_gather"}),
    # (the estimator still reads tp_comm once, scenario-wide: estimate_applies leaves TP overlap out of its domain)
    ("simulator/explore/estimate.py", {"cp_comm", "fsdp_prefetch", "param_gather"}),
])
def test_engine_and_estimator_read_issue_modes_instead_of_the_overlap_rules(module, switches):
    """The rules 'this collective runs beside the next compute op', 'on the DP stream' and
    'prefetched' are the stack's (workloads/stacks/megatron_te/issue.py); the engine and the
    estimator neither call the predicates they are made of nor read their switches."""
    tree = ast.parse((ROOT / module).read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert not names & RULE_NAMES
    assert not strings & switches


def test_kernel_table_adds_up_to_the_compute_ops():
    """Each compute op of the timeline is the sum of the kernels kernel_table lists for its
    segment: the attention op of a dense layer is its F:attn kernels, the MLP op its F:mlp."""
    m = load_model("tiny-dense")
    par = ParallelConfig(tp=2, pp=1, dp=1, sequence_parallel=True, micro_batch_size=1, global_batch_size=1)
    prog = build_program(m, par, get_gpu())
    rows = prog.kernel_table()
    assert {r["blocks"] for r in rows} == {"attention+mlp"}
    by_segment: dict = {}
    for r in rows:
        by_segment[r["segment"]] = by_segment.get(r["segment"], 0.0) + r["time_s"]
    ops = {(o.name, o.phase): o.duration_s for o in prog.classes[0].ops if o.layer == 0 and o.microbatch == 0}
    assert ops[(OpName.ATTN, Phase.F)] == pytest.approx(by_segment["F:attn"], rel=1e-12)
    assert ops[(OpName.MLP, Phase.F)] == pytest.approx(by_segment["F:mlp"], rel=1e-12)
    assert {"qkv_proj", "core_attn", "fc1", "fc2"} <= {r["kernel"] for r in rows}


def test_fusion_choices_are_the_stacks():
    """What fuses is data the stack hands the blocks: another framework's choices change the
    kernels (a six-kernel RoPE, an unfused cross entropy, eager expert clamps) and nothing else."""
    from workloads.blocks.fusion import MEGATRON_TE, Fusion
    from workloads.costs.flops import layer_ops
    assert get_stack().fusion is MEGATRON_TE
    m = load_model("llama3-8b")
    par = ParallelConfig(tp=1, pp=1, dp=1, micro_batch_size=1, global_batch_size=1, seq_len=1024)
    base = layer_ops(m, par, 0)
    other = layer_ops(m, par, 0, fusion=Fusion(rope_kernels=(6, 5)))
    assert [(o.name, o.num_kernels) for o in other if o.name == "rope"] == [("rope", 6), ("rope", 5)]
    assert [o for o in other if o.name != "rope"] == [o for o in base if o.name != "rope"]
    oss = load_model("gpt-oss-20b")
    clamps = {f: sum(o.name == "expert_clamp" for o in layer_ops(oss, par, 0, fusion=Fusion(expert_op_fuser=f)))
              for f in ("always", "never", "with_rank_budget")}
    assert clamps == {"always": 0, "never": 2, "with_rank_budget": 2}


def test_llm_foundry_differs_from_the_default_stack_in_its_attention_kernel_only():
    """The llm_foundry stack is the default one with llm-foundry's Triton FlashAttention (costed
    as FlashAttention v1): same lowering, schedule and overlap rules, and only the
    core-attention ops cost more."""
    from workloads.stacks.megatron_te import STACK as MC
    lf = get_stack("llm_foundry")
    assert lf.fusion.attention_backend == "flash_attention_1" and MC.fusion.attention_backend == "te_fused"
    for f in ("lowering", "stage_program", "assign_issue_modes", "check_layout", "kernel_rows", "segment_key"):
        assert getattr(lf, f) is getattr(MC, f)
    assert replace(lf.fusion, attention_backend="te_fused") == MC.fusion
