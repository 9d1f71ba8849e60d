"""FSDP2's copies around its collectives and torch's AdamW step, as the torchtitan and PyTorch
FSDP stacks run them (workloads/stacks/megatron_te/data_parallel.py, workloads/costs/flops.py):
closed-form bytes at the compute model's HBM rate, and the default stack untouched."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from topologies import ConfigError, get_gpu_spec
from workloads import ParallelConfig, build_program, load_model
from workloads.blocks.kernels import ew
from workloads.costs import RooflineComputeModel
from workloads.costs.flops import optimizer_ops
from workloads.ops import FSDP2_COPIES, OpKind, OpName, Phase, is_fsdp_gather
from workloads.stacks import get_stack
from workloads.stacks.megatron_te.data_parallel import (FSDP2_COPY_IN_BYTES, FSDP2_COPY_OUT_BYTES,
                                                        FSDP2_GRAD_READ_BYTES, _count_local_params)

_H100 = get_gpu_spec("H100")
_DP = 8


def _program(framework, zero=3, dp=_DP, gbs=None, **kw):
    m = load_model("tiny-dense")
    par = ParallelConfig(tp=1, pp=1, dp=dp, zero_stage=zero, distributed_optimizer=True, micro_batch_size=1,
                         global_batch_size=gbs or dp)
    return m, par, build_program(m, par, _H100, framework=framework, **kw).classes[0].ops


def _hbm_s(name, nbytes, kernels):
    """The compute model's time of one memory-bound op of ``nbytes`` in ``kernels`` launches."""
    return float(np.sum(RooflineComputeModel(_H100).op_times_s([ew(name, "F", 0, nbytes, kernels)])))


def test_each_gather_pays_copy_in_of_the_shard_and_copy_out_of_the_layer():
    """Layer 0's forward gather: 10 bytes per shard element in (the FP32 -> BF16 cast into the
    flat buffer, then into the all-gather input), 4 bytes per gathered element out."""
    m, par, ops = _program("torchtitan")
    dense = _count_local_params(type("C", (), {"model": m, "par": par})(), (0,))[0]
    copy = [o for o in ops if o.name == OpName.FSDP_COPY and o.layer == 0 and o.phase == Phase.F]
    assert len(copy) == 1
    want = (_hbm_s("fsdp2_copy_in", FSDP2_COPY_IN_BYTES * dense / _DP, 2)
            + _hbm_s("fsdp2_copy_out", FSDP2_COPY_OUT_BYTES * dense, 1))
    assert copy[0].duration_s == pytest.approx(want, rel=1e-9)
    assert copy[0].host_ops == 3
    # one copy per gather, right after it in program order (the gather stays prefetched)
    gathers = [i for i, o in enumerate(ops) if is_fsdp_gather(o)]
    assert sum(o.name == OpName.FSDP_COPY for o in ops) == len(gathers)
    assert all(ops[i + 1].name == OpName.FSDP_COPY for i in gathers)


def test_reduce_scatter_copy_in_widens_bf16_gradients_to_the_reduce_dtype():
    """foreach_reduce's _chunk_cat: read 2 B, write 4 B (FP32 reduction) or 2 B (BF16) per
    gradient element of the layer."""
    m, par, ops = _program("torchtitan")
    dense = _count_local_params(type("C", (), {"model": m, "par": par})(), (0,))[0]
    grad = [o for o in ops if o.name == OpName.FSDP_GRAD_COPY and o.layer == 0]
    assert len(grad) == 1
    assert grad[0].duration_s == pytest.approx(_hbm_s("g", (FSDP2_GRAD_READ_BYTES + 4.0) * dense, 1), rel=1e-9)
    _, _, b16 = _program("torchtitan", grad_reduce_dtype="bf16")
    g16 = [o for o in b16 if o.name == OpName.FSDP_GRAD_COPY and o.layer == 0][0]
    assert g16.duration_s == pytest.approx(_hbm_s("g", 4.0 * dense, 1), rel=1e-9)


def test_copies_only_under_zero3_with_sharding_and_not_on_the_default_stack():
    for fw, zero, dp in (("megatron_core", 3, _DP), ("torchtitan", 1, _DP), ("torchtitan", 3, 1)):
        _, _, ops = _program(fw, zero=zero, dp=dp)
        assert not any(o.name in FSDP2_COPIES for o in ops), (fw, zero, dp)


def test_copies_cost_their_time_and_leave_the_gathers_prefetched(monkeypatch):
    """With the copies the eager stack's step grows by about their compute-stream time: the
    gathers still hide behind the layer before them (the engine looks past the copies; had the
    copies taken the gathers' place in the prefetch, the step would change by other amounts)."""
    from simulator import run
    from workloads import stacks
    sc = {"model": "llama3-8b", "cluster": {"preset": "dgx-h100", "num_nodes": 1},
          "parallel": {"tp": 1, "pp": 1, "dp": _DP, "micro_batch_size": 1, "global_batch_size": _DP,
                       "seq_len": 32768, "zero_stage": 3, "distributed_optimizer": True, "recompute": "full"},
          "precision": "bf16", "num_steps": 2, "framework": "torchtitan"}
    res = run(sc, progress=False)
    tl = res.timeline
    tl = tl[(tl["step"] == tl["step"].max()) & (tl["rank"] == 0)]
    copies = float(((tl["end_s"] - tl["start_s"])[tl["name"].isin([str(n) for n in FSDP2_COPIES])]).sum())
    titan = stacks.KERNEL_STACKS["torchtitan"]
    monkeypatch.setitem(stacks.KERNEL_STACKS, "torchtitan",
                        replace(titan, fusion=replace(titan.fusion, fsdp2_copies=False)))
    without = run(sc, progress=False).metrics["step_time_s"]
    assert copies > 0.005 * without
    assert res.metrics["step_time_s"] - without == pytest.approx(copies, rel=0.1)


def test_torch_adamw_bytes_and_kernels():
    """fused AdamW: 28 B/param in one kernel (FP32 param, grad, moments; no BF16 copy); the
    foreach default: eight _foreach_* passes, 80 B/param; Megatron's: 30 B/param."""
    n = 1.0e6
    meg, fused, fe = (optimizer_ops(n, k)[1] for k in ("megatron", "torch_fused", "torch_foreach"))
    assert optimizer_ops(n) == optimizer_ops(n, "megatron")
    assert (meg.mem_bytes, fused.mem_bytes, fe.mem_bytes) == (30 * n, 28 * n, 80 * n)
    assert (fused.num_kernels, fe.num_kernels) == (1, 8)
    with pytest.raises(ConfigError, match="optimizer implementation.*torch_foreach"):
        optimizer_ops(n, "apex")


def test_step_end_runs_the_stacks_optimizer():
    """The optimizer op of the step: the local shard's AdamW at the compute model's rate."""
    def opt_s(fw):
        _, _, ops = _program(fw)
        return sum(o.duration_s for o in ops if o.name == OpName.OPTIMIZER)
    meg, titan, plain = opt_s("megatron_core"), opt_s("torchtitan"), opt_s("pytorch_fsdp")
    assert titan < meg < plain
    # the foreach step moves 80 / 30 of Megatron's Adam bytes (the 4-byte norm pass alike)
    assert plain / meg == pytest.approx((80 + 4) / (30 + 4), rel=0.05)


def test_default_stack_fusion_is_unchanged():
    mc = get_stack("megatron_core").fusion
    assert (mc.optimizer, mc.fsdp2_copies) == ("megatron", False)
    assert replace(get_stack("torchtitan_compile").fusion, attention_backend="te_fused", optimizer="megatron",
                   fsdp2_copies=False, float8_casts="te") == mc
    assert [o.kind for o in _program("megatron_core")[2] if o.name == OpName.OPTIMIZER] == [OpKind.COMPUTE]


def test_estimate_charges_the_copies_and_keeps_the_gathers_hidden(monkeypatch):
    """The closed-form estimate grows by the copies' time alone: a pending prefetched gather
    still hides behind the layer after the copy, not behind the copy."""
    from simulator import estimate
    from workloads import stacks
    sc = {"model": "llama3-8b", "cluster": {"preset": "dgx-h100", "num_nodes": 1},
          "parallel": {"tp": 1, "pp": 1, "dp": _DP, "micro_batch_size": 1, "global_batch_size": _DP,
                       "seq_len": 8192, "zero_stage": 3, "distributed_optimizer": True, "recompute": "full"},
          "precision": "bf16", "framework": "torchtitan"}
    m = load_model("llama3-8b")
    par = ParallelConfig(tp=1, pp=1, dp=_DP, zero_stage=3, distributed_optimizer=True, micro_batch_size=1,
                         global_batch_size=_DP, seq_len=8192, recompute="full")
    ops = build_program(m, par, _H100, framework="torchtitan").classes[0].ops
    copies = sum(o.duration_s for o in ops if o.name in FSDP2_COPIES)
    with_copies = estimate(sc)["step_time_s"]
    titan = stacks.KERNEL_STACKS["torchtitan"]
    monkeypatch.setitem(stacks.KERNEL_STACKS, "torchtitan",
                        replace(titan, fusion=replace(titan.fusion, fsdp2_copies=False)))
    assert with_copies - estimate(sc)["step_time_s"] == pytest.approx(copies, rel=0.1)
