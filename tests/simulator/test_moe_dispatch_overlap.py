"""MoE dispatchers (alltoall, allgather, flex: DeepEP / HybridEP) and Megatron-Core's MoE
communication overlap (combined 1F1B F&B pairs)."""

import numpy as np
import pytest

from simulator.collectives import CALIBRATIONS, Calibration
from simulator.collectives.ep_dispatch import (FLEX_EFFICIENCY, dedup_factor, flex_bytes_scale,
                                               flex_compute_slowdown, flex_pair_scale)
from simulator.engine import run
from tests.golden.cases import _small
from topologies import ConfigError, get_gpu_spec
from workloads import ParallelConfig, load_model
from workloads.ops import Coll, OpName
from workloads.program import build_program

H100 = get_gpu_spec("H100-SXM")
EP_OPS = ["ep_dispatch", "ep_combine", "ep_dispatch_bwd", "ep_combine_bwd"]


def _moe_sc(moe=None, overlap=None, **kw):
    sc = _small(pp=1, dp=2, ep=2, moe=True, nmb=4, layers=2, **kw)
    sc["model"]["moe"].update(moe or {})
    sc["overlap"] = dict(overlap or {})
    return sc


def test_allgather_dispatcher_gathers_tokens_and_reduce_scatters_outputs():
    model = load_model({"preset": "tiny-moe", "num_layers": 1, "moe": {"num_experts": 8, "token_dispatcher": "allgather"}})
    par = ParallelConfig(tp=1, pp=1, dp=4, ep=4, micro_batch_size=1, global_batch_size=4, seq_len=512)
    p = build_program(model, par, H100)
    ops = {(op.name, op.coll, op.size_bytes) for op in p.classes[0].ops if op.group == "ep" and op.microbatch == 0}
    full = 4 * 512 * model.hidden_size * 2.0          # ep x local tokens x hidden, BF16 (no top-k factor)
    assert ops == {(OpName.EP_DISPATCH, Coll.ALL_GATHER, full), (OpName.EP_COMBINE, Coll.REDUCE_SCATTER, full),
                   (OpName.EP_COMBINE_BWD, Coll.ALL_GATHER, full), (OpName.EP_DISPATCH_BWD, Coll.REDUCE_SCATTER, full)}
    with pytest.raises(ConfigError) as e:
        build_program(model, ParallelConfig(tp=2, pp=1, dp=4, ep=4, etp=2, micro_batch_size=1, global_batch_size=4,
                                            seq_len=512, sequence_parallel=True), H100)
    assert e.value.field == "model.moe.token_dispatcher"


def test_flex_constants_follow_their_sources():
    hopper = CALIBRATIONS["hopper"].tier_efficiency
    # DeepEP V1 README (H800): 153 of ~160 GB/s NVLink, 43 of ~50 GB/s RDMA
    assert FLEX_EFFICIENCY["nvlink"] == pytest.approx(0.95625)
    assert flex_bytes_scale(hopper, "nvlink") == pytest.approx(hopper["nvlink"] / 0.95625)
    deepep = load_model({"preset": "mixtral-8x7b", "moe": {"token_dispatcher": "flex"}}).moe
    hybrid = load_model({"preset": "mixtral-8x7b", "moe": {"token_dispatcher": "flex",
                                                            "flex_dispatcher_backend": "hybridep"}}).moe
    assert flex_compute_slowdown(deepep, "hopper", False) == pytest.approx(132 / 112)    # 20 SMs held
    assert flex_compute_slowdown(hybrid, "hopper", False) == pytest.approx(132 / 108)    # 24 on one node
    assert flex_compute_slowdown(hybrid, "hopper", True) == pytest.approx(132 / 124)     # 8 across nodes


def test_flex_all_to_all_runs_at_its_efficiency():
    """On links at the wire rate with no latency (an ideal calibration), NCCL's all-to-all
    takes bytes / bandwidth and the flex one bytes / (0.956 bandwidth), for the tokens it
    sends once per destination rank (:func:`dedup_factor`: a token with two of its top-k
    experts on one rank goes there once): each EP all-to-all takes dedup / 0.95625 times as
    long.  (On the Hopper calibration, where NCCL gets 0.816 of NVLink, the flex one is the
    faster.)"""
    ideal = Calibration(name="ideal0", ideal=True, step_latency_s=0.0,
                        tier_efficiency={"nvlink": 1.0, "pcie": 1.0, "ib": 1.0, "xrack": 1.0})
    dur = {}
    for disp in ("alltoall", "flex"):
        r = run(_moe_sc({"token_dispatcher": disp}, {"comm_slowdown": False, "grad_reduce": False}),
                calibration=ideal)
        tl = r.timeline
        ep = tl[tl.name.isin(EP_OPS)].sort_values(["step", "start_s"])
        dur[disp] = (ep.end_s - ep.start_s).to_numpy()
    assert len(dur["flex"]) == len(dur["alltoall"]) > 0
    moe = r.scenario.model.moe
    dedup = dedup_factor(moe.num_experts, moe.top_k, moe.num_experts // 2)       # ep 2
    assert dedup < 1
    np.testing.assert_allclose(dur["flex"], dur["alltoall"] * dedup / 0.95625, rtol=1e-9)


def test_flex_sends_a_token_once_per_destination_rank_and_domain():
    """DeepSeek-V3 on 32 ranks of 4 eight-GPU nodes: across nodes RDMA carries 0.452 of the
    (token, expert) copies (a token reaches a node with probability 0.903 and puts 2 copies
    there), inside a node each rank gets 0.908 of its copies; times each tier's wire
    efficiency."""
    eff = CALIBRATIONS["hopper"].tier_efficiency
    assert dedup_factor(256, 8, 64) == pytest.approx(0.4518, abs=1e-4)
    assert dedup_factor(256, 8, 8) == pytest.approx(0.9083, abs=1e-4)
    assert dedup_factor(8, 1, 4) == 1.0 and dedup_factor(8, 8, 8) == pytest.approx(1 / 8)   # top-1; every expert
    scale = flex_pair_scale(eff, np.repeat(np.arange(4), 8), 256, 8)
    assert scale[0, 1] == pytest.approx(flex_bytes_scale(eff, "nvlink") * dedup_factor(256, 8, 8))
    assert scale[0, 8] == pytest.approx(flex_bytes_scale(eff, "ib") * dedup_factor(256, 8, 64))
    assert np.allclose(scale, scale.T)


def test_moe_overlap_pairs_backward_with_the_next_forward():
    model = load_model({"preset": "tiny-moe", "num_layers": 1, "moe": {"num_experts": 8}})
    par = ParallelConfig(tp=1, pp=1, dp=2, ep=2, micro_batch_size=1, global_batch_size=6, seq_len=256)
    p = build_program(model, par, H100, moe_ep_overlap=True)
    lanes = [(op.lane, op.phase, op.microbatch) for op in p.classes[0].ops if op.name in ("experts", "experts_bwd")]
    # F0 alone; (BW0 | F1), (BW1 | F2) pairs; BW2 alone
    assert lanes == [(0, "F", 0), (1, "B", 0), (2, "F", 1), (1, "B", 1), (2, "F", 2), (0, "B", 2)]
    for bad, field_rule in (({"recompute": "full"}, "recompute"), ({"ep": 1}, "expert parallelism")):
        kw = dict(tp=1, pp=1, dp=2, ep=2, micro_batch_size=1, global_batch_size=6, seq_len=256)
        kw.update(bad)
        with pytest.raises(ConfigError) as e:
            build_program(model, ParallelConfig(**kw), H100, moe_ep_overlap=True)
        assert e.value.field == "overlap.moe_ep_comm" and field_rule in e.value.rule


def _overlapped_compute(res) -> float:
    """Compute time of the last cell inside its own EP all-to-alls (last step)."""
    t0, t1 = res.step_bounds[-1]
    tl = res.timeline
    tl = tl[(tl.cell == res.metrics["last_cell"]) & (tl.start_s >= t0) & (tl.end_s <= t1)]
    ep = sorted(zip(tl[tl.name.isin(EP_OPS)].start_s, tl[tl.name.isin(EP_OPS)].end_s))
    merged = []
    for a, b in ep:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    comp = tl[tl.stream == "compute"]
    return sum(max(0.0, min(e, b) - max(s, a)) for s, e in zip(comp.start_s, comp.end_s) for a, b in merged)


def test_moe_overlap_hides_the_all_to_all_behind_the_other_micro_batch():
    """Without overlap every EP all-to-all blocks: no compute runs inside one.  With it, the
    exposed EP time drops by exactly the compute that ran inside the all-to-alls, and the
    step by the same amount (compute is not slowed: comm_slowdown off)."""
    off = run(_moe_sc(overlap={"comm_slowdown": False}))
    on = run(_moe_sc(overlap={"comm_slowdown": False, "moe_ep_comm": True}))
    assert _overlapped_compute(off) == 0.0
    hidden = _overlapped_compute(on)
    assert hidden > 0
    drop_ep = off.metrics["exposed_comm_s"]["ep"] - on.metrics["exposed_comm_s"]["ep"]
    assert drop_ep == pytest.approx(hidden, rel=1e-9)
    assert off.metrics["step_time_s"] - on.metrics["step_time_s"] == pytest.approx(hidden, rel=1e-9)
    assert on.metrics["breakdown_s"]["compute"] == pytest.approx(off.metrics["breakdown_s"]["compute"], rel=1e-12)


def test_flex_sms_slow_the_compute_they_overlap():
    """A flex dispatcher holding half the SMs (66 of 132) doubles the time of compute that
    starts while its all-to-all runs, and leaves the rest alone."""
    r = run(_moe_sc({"token_dispatcher": "flex", "flex_dispatcher_num_sms": 66},
                    {"comm_slowdown": False, "moe_ep_comm": True}))
    prog = r.program
    cls = prog.classes[0]
    want = {(op.name, op.layer, op.microbatch, op.phase): op.duration_s for op in cls.ops if op.kind == "compute"}
    tl = r.timeline
    tl = tl[(tl.stream == "compute") & (tl.cell == 0) & (tl.step == tl.step.max())]
    ratios = {round((e - s) / want[(n, la, mb, ph)], 9) for n, la, mb, ph, s, e in
              zip(tl.name, tl.layer, tl.microbatch, tl.phase, tl.start_s, tl.end_s) if want[(n, la, mb, ph)] > 0}
    assert ratios == {1.0, 2.0}


def test_moe_overlap_runs_with_the_interleaved_schedules_overlapped_p2p():
    """Megatron-Core's combined 1F1B with ``overlap_p2p_comm``: the combined step waits for
    both halves' inputs before its first layer (``pre_forward``, ``pre_backward``) and sends
    both outputs after, and the schedule warms up one more forward so that a pair's halves
    are independent micro-batches.  The pairs hide all-to-all time; folded equals unfolded."""
    from workloads.schedules import ActionKind
    from workloads.schedules.interleaved import warmup_interleaved

    def sc(ep_overlap):
        s = _small(pp=2, dp=2, ep=2, moe=True, nmb=8, layers=4, schedule="interleaved_1f1b", vpp=2)
        s["overlap"] = {"p2p": True, "moe_ep_comm": ep_overlap, "comm_slowdown": False}
        return s
    off, on = run(sc(False)), run(sc(True))
    ops = on.program.classes[0].ops
    assert any(op.lane for op in ops) and not any(op.lane for op in ops if op.kind in ("send", "recv"))
    for stage, acts in enumerate(on.program.schedule.actions):
        kinds = [a.kind for a in acts if a is not None]
        # Megatron-Core's warm-up plus one, then the first steady step's forward, then its backward
        assert kinds.index(ActionKind.BW) == warmup_interleaved(2, stage, 2, 8) + 1 + 1
    assert on.metrics["exposed_comm_s"]["ep"] < off.metrics["exposed_comm_s"]["ep"]
    assert on.metrics["step_time_s"] < off.metrics["step_time_s"]
    assert sum(on.metrics["breakdown_s"].values()) == pytest.approx(on.metrics["step_time_s"], rel=1e-12)
    assert run(sc(True), fold=False).metrics["step_time_s"] == pytest.approx(on.metrics["step_time_s"], rel=1e-12)
    assert (on.timeline.stream == "pp").sum() == (off.timeline.stream == "pp").sum()


def test_the_memory_model_holds_the_extra_warm_up_forward_of_the_moe_overlap():
    from simulator.scenario import load_scenario

    def estimates(ep_overlap):
        s = _small(pp=2, dp=2, ep=2, moe=True, nmb=8, layers=4, schedule="interleaved_1f1b", vpp=2)
        s["overlap"] = {"p2p": True, "moe_ep_comm": ep_overlap}
        return load_scenario(s).memory_estimates()
    off, on = estimates(False), estimates(True)
    assert [e.in_flight_microbatches for e in on] == [e.in_flight_microbatches + 1 for e in off]
    assert all(a.total_bytes > b.total_bytes for a, b in zip(on, off))
