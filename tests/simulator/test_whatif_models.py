"""What-ifs change time the way their models say: closed forms, longest paths, rendezvous,
the expected maximum of N draws, re-routing and failures.

Every scenario is tiny (the ``tiny-dense`` model, one to four hosts) so that the file runs in
seconds, with an infinitely fast host (``host: none``: the closed forms are of GPU time); the folded engine is used throughout (``test_whatif.py`` shows it equals the
unfolded one under every what-if).
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator.engine import run
from simulator.engine import JobStopped, expected_max_lognormal
from tests.simulator.test_engine import _action_costs, _batched_longest_path
from topologies import ConfigError
from workloads.schedules import ActionKind, schedule_timing

ONE_GPU = {"gpu": "H100-SXM", "num_nodes": 1, "gpus_per_host": 1, "nvlink_domain_size": 1, "nics_per_host": 1}


def pipeline(schedule: str, *, pp: int = 4, nmb: int = 8, **kw) -> dict:
    """``pp`` stages x DP 2 on one DGX host, one layer per stage, ``nmb`` micro-batches."""
    dp = 8 // pp
    return {"model": {"preset": "tiny-dense", "num_layers": pp}, "cluster": {"preset": "dgx-h100", "num_nodes": 1},
            "parallel": {"tp": 1, "pp": pp, "dp": dp, "global_batch_size": nmb * dp, "seq_len": 512,
                         "schedule": schedule, "distributed_optimizer": False, "zero_stage": 0},
            "num_steps": 1, "host": "none", **kw}


def stage_gpus(stage: int, pp: int = 4) -> list[int]:
    """GPUs of a pipeline stage (mesh order tp-cp-ep-dp-pp: DP inside, PP outermost)."""
    dp = 8 // pp
    return [stage * dp + d for d in range(dp)]


def slow_stages(factors: dict[int, float], pp: int = 4) -> dict:
    return {"slow_gpus": {g: f for s, f in factors.items() for g in stage_gpus(s, pp)}}


def _stage_times(res, stage: int, factor: float) -> tuple[float, float, float]:
    """(F, backward, tail) seconds of one micro-batch / the step tail on ``stage``, slowed."""
    c = _action_costs(res, stage)
    f = sum(v for (ph, mb, _), v in c.items() if ph == "F" and mb == 0)
    b = sum(v for (ph, mb, _), v in c.items() if ph != "F" and mb == 0)
    cls = next(k for k in res.program.classes if k.stage == stage)
    tail = sum(op.duration_s for op in cls.ops if op.kind == "compute" and op.microbatch < 0)
    return f * factor, b * factor, tail * factor


# -- pipelines -----------------------------------------------------------------------------------------
def test_gpipe_with_per_stage_times_is_the_closed_form():
    """GPipe, free communication, stage i slowed to per-micro-batch times f_i (forward) and
    b_i (backward): the forward wave is a flow shop, Σ f + (m-1) max f, then the backward wave
    runs from the last stage, so stage s ends at T_F + Σ_{i>=s} b_i + (m-1) max_{i>=s} b_i.
    With one stage the slowest in both directions stage 0 ends at Σ t_i + (m-1) max t_i
    (t_i = f_i + b_i), the issue's closed form, exactly."""
    m, factors = 8, {0: 1.0, 1: 1.3, 2: 2.0, 3: 1.0}
    res = run(pipeline("gpipe", nmb=m, whatif=slow_stages(factors)), free_comm=True)
    f, b, tail = zip(*(_stage_times(res, s, factors[s]) for s in range(4)))
    t_fwd = sum(f) + (m - 1) * max(f)
    ends = [t_fwd + sum(b[s:]) + (m - 1) * max(b[s:]) for s in range(4)]
    assert res.metrics["step_time_s"] == pytest.approx(max(e + t for e, t in zip(ends, tail)), rel=1e-9)
    assert int(np.argmax(f)) == int(np.argmax(b)) == 2
    t = [fi + bi for fi, bi in zip(f, b)]
    assert ends[0] == pytest.approx(sum(t) + (m - 1) * max(t), rel=1e-12)
    tl = res.timeline
    s0 = tl[(tl["cell"] == res.folding.rank_cell[0]) & (tl["stream"] == "compute") & (tl["microbatch"] >= 0)]
    assert s0["end_s"].max() == pytest.approx(ends[0], rel=1e-9)


def test_1f1b_with_a_slow_stage_is_the_longest_path():
    """1F1B with stage 2 at 1.7x: the step equals the longest path of the schedule's
    dependency graph (with Megatron's p2p batches) under the slowed action costs."""
    from workloads.schedules.comm import p2p_order
    factors = {0: 1.0, 1: 1.0, 2: 1.7, 3: 1.0}
    res = run(pipeline("1f1b", whatif=slow_stages(factors)), free_comm=True)
    costs = {s: _action_costs(res, s) for s in range(4)}

    def cost(a):
        c = costs[a.stage]
        if a.kind == ActionKind.BW:
            return (c[("B", a.microbatch, a.chunk)] + c[("W", a.microbatch, a.chunk)]) * factors[a.stage]
        return c[(str(a.kind), a.microbatch, a.chunk)] * factors[a.stage]

    sched = res.program.schedule
    orders = [p2p_order(sched, s, overlap_p2p=False) for s in range(4)]
    if all(o is None for o in orders):
        ends = [max(e) for e in schedule_timing(sched, cost).end]
    else:
        ends = _batched_longest_path(sched, cost, orders)
    tails = [_stage_times(res, s, factors[s])[2] for s in range(4)]
    assert res.metrics["step_time_s"] == pytest.approx(max(e + t for e, t in zip(ends, tails)), rel=1e-9)
    base = run(pipeline("1f1b"), free_comm=True)
    assert res.metrics["step_time_s"] > base.metrics["step_time_s"]


def test_a_slow_stage_delays_its_upstream_neighbour_through_the_rendezvous():
    """1F1B with real communication: stage 1 at 2x.  Stage 0's warm-up sends are rendezvous:
    the send of F1 completes only when stage 1 posts its receive, after its (slow) F0, so
    stage 0 starts F2 later than without the straggler, though F2 needs nothing from stage
    1.  With non-blocking sends (``overlap.p2p``) F2 starts on time.  Every send ends no
    earlier than its receive was posted."""
    def f2_start(res, stage=0):
        tl = res.timeline
        rows = tl[(tl["cell"] == res.folding.rank_cell[stage_gpus(stage)[0]]) & (tl["stream"] == "compute")
                  & (tl["phase"] == "F") & (tl["microbatch"] == 2)]
        return rows["start_s"].min()

    slow = slow_stages({1: 2.0})
    base, strag = run(pipeline("1f1b")), run(pipeline("1f1b", whatif=slow))
    assert f2_start(strag) > f2_start(base) * 1.2
    nb_base = run(pipeline("1f1b", overlap={"p2p": True}))
    nb_strag = run(pipeline("1f1b", overlap={"p2p": True}, whatif=slow))
    assert f2_start(nb_strag) == pytest.approx(f2_start(nb_base), rel=1e-9)
    tl = strag.rank_timeline()
    sends = tl[(tl["name"] == "send_act") & (tl["rank"] == stage_gpus(0)[0])]
    recvs = tl[(tl["name"] == "recv_act") & (tl["rank"] == stage_gpus(1)[0])]
    for _, s in sends.iterrows():
        r = recvs[recvs["microbatch"] == s["microbatch"]]
        assert s["end_s"] >= r["start_s"].min() - 1e-15


# -- slow GPUs in groups ---------------------------------------------------------------------------------
def _one_host(tp: int, dp: int) -> dict:
    return {"model": {"preset": "tiny-dense", "num_layers": 4}, "cluster": {"preset": "dgx-h100", "num_nodes": 1},
            "parallel": {"tp": tp, "pp": 1, "dp": dp, "global_batch_size": 4 * dp, "seq_len": 1024},
            "num_steps": 2, "host": "none"}


@pytest.mark.parametrize("tp, dp", [pytest.param(1, 8, id="dp8"), pytest.param(8, 1, id="tp8")])
def test_a_slow_gpu_delays_the_step_by_about_its_extra_compute(tp, dp):
    """GPU 3 at 1.5x.  In a DP replica the others wait at the gradient reduction and the
    grad-norm all-reduce; in a TP group the whole group waits at every layer's collective.
    Either way the step grows by about the slow rank's extra compute, 0.5 x its compute
    (within 15 %: the overlap of the gradient reduction changes a little), and every rank
    ends its step together."""
    sc = _one_host(tp, dp)
    base, slow = run(sc), run({**sc, "whatif": {"slow_gpus": {3: 1.5}}})
    compute = base.timeline[(base.timeline["step"] == 1) & (base.timeline["stream"] == "compute")]
    per_rank = compute.groupby("cell").apply(lambda g: (g["end_s"] - g["start_s"]).sum(), include_groups=False)
    extra = 0.5 * float(per_rank.max())
    delta = slow.metrics["step_time_s"] - base.metrics["step_time_s"]
    assert 0.85 * extra <= delta <= 1.15 * extra, (delta, extra)
    tl = slow.timeline
    ends = tl[(tl["step"] == 1) & (tl["name"] == "grad_norm")]["end_s"]
    assert ends.nunique() == 1
    if tp > 1:
        # a healthy rank waits for the slow one at every TP collective that follows a compute
        # op (an SP all-gather right after a reduce-scatter has nothing left to wait for)
        fast = int(slow.folding.rank_cell[0])
        lo, hi = slow.step_bounds[-1]
        waits = [w for w in slow.waits[fast] if w[2] == "bubble" and lo <= w[0] < hi]
        ops = slow.program.classes[slow.folding.cell_class[fast]].ops
        n_tp = sum(1 for i, o in enumerate(ops) if o.kind == "collective" and o.group == "tp" and i > 0
                   and ops[i - 1].kind == "compute")
        assert len(waits) == n_tp > 0


# -- jitter ------------------------------------------------------------------------------------------------
def _pure_dp(n: int, wi: dict, seed: int = 0) -> dict:
    return {"model": {"preset": "tiny-dense", "num_layers": 1}, "cluster": {"preset": "dgx-h100", "num_nodes": n // 8},
            "parallel": {"tp": 1, "pp": 1, "dp": n, "global_batch_size": n, "seq_len": 512},
            "num_steps": 1, "seed": seed, "whatif": wi, "host": "none"}


@pytest.mark.parametrize("n, seeds", [(8, 24), (32, 16), (128, 8), (1024, 4)])
def test_gpu_step_jitter_tracks_the_expected_maximum_of_n_draws(n, seeds):
    """Pure DP, negligible (free) communication, every GPU's step at exp(N(0, 0.1^2)) x its
    time: the step is exactly base x the largest of the N factors drawn (the grad-norm
    all-reduce waits for the slowest), and the mean over seeds of step / base is the
    expected maximum of N draws within 5 %."""
    from simulator.engine.perturb import Perturbation
    sigma = 0.1
    wi = {"jitter": {"scope": "gpu_step", "dist": f"lognormal(0, {sigma})"}}
    base = run(_pure_dp(n, {}), free_comm=True).metrics["step_time_s"]
    ratios = []
    for seed in range(seeds):
        res = run(_pure_dp(n, wi, seed), free_comm=True)
        sc = res.scenario
        pert = Perturbation(sc.whatif, sc.cluster, n, lambda r: r, seed, 1)
        f_max = float(pert._step_draws[0][0][0].max())
        assert res.metrics["step_time_s"] == pytest.approx(base * f_max, rel=1e-12)
        ratios.append(res.metrics["step_time_s"] / base)
    assert np.mean(ratios) == pytest.approx(expected_max_lognormal(n, 0.0, sigma), rel=0.05)


def test_op_jitter_averages_out_and_host_step_jitter_is_shared_by_a_host():
    """Per-op lognormal noise over a step's ops moves the step by far less than the same
    noise drawn once per GPU step; a host-step draw gives all GPUs of a host one factor."""
    n = 64
    base = run(_pure_dp(n, {}), free_comm=True).metrics["step_time_s"]
    op = run(_pure_dp(n, {"jitter": {"scope": "op", "dist": "lognormal(0, 0.3)"}}), free_comm=True)
    step = run(_pure_dp(n, {"jitter": {"scope": "gpu_step", "dist": "lognormal(0, 0.3)"}}), free_comm=True)
    assert op.metrics["step_time_s"] / base - 1 < 0.5 * (step.metrics["step_time_s"] / base - 1)
    host = run(_pure_dp(16, {"jitter": {"scope": "host_step", "dist": "lognormal(0, 0.3)"}}), free_comm=True)
    tl = host.rank_timeline()
    busy = tl[tl["stream"] == "compute"].assign(d=lambda t: t["end_s"] - t["start_s"]).groupby("rank")["d"].sum()
    per_host = busy.groupby(busy.index // 8).nunique()
    assert (per_host == 1).all() and busy.round(15).nunique() == 2


# -- closed forms on one GPU: thermal throttling and stalls --------------------------------------------------
def _one_gpu(wi: dict, num_steps: int = 1) -> dict:
    return {"model": "tiny-dense", "cluster": ONE_GPU,
            "parallel": {"tp": 1, "pp": 1, "dp": 1, "global_batch_size": 4, "seq_len": 512},
            "num_steps": num_steps, "whatif": wi, "host": "none"}


def test_thermal_throttling_and_stalls_are_closed_forms():
    """One GPU, step T (the sum of its op times).  Throttled by f from instant s inside the
    step: s + (T - s) f (an op across s is slowed on its remaining part); from step 1 of
    two: T f; a certain stall per GPU step: T + stall; a certain stall per op: T + k stall
    for k compute ops."""
    res = run(_one_gpu({}))
    t = res.metrics["step_time_s"]
    k = sum(1 for op in res.program.classes[0].ops if op.kind == "compute")
    s, f = 0.37 * t, 1.6
    assert run(_one_gpu({"thermal": {"factor": f, "start_s": s}})).metrics["step_time_s"] == \
        pytest.approx(s + (t - s) * f, rel=1e-12)
    assert run(_one_gpu({"thermal": {"factor": f, "start_step": 1}}, num_steps=2)).metrics["step_time_s"] == \
        pytest.approx(t * f, rel=1e-12)
    stall = 1e-3
    assert run(_one_gpu({"jitter": {"scope": "gpu_step", "dist": f"bernoulli_stall(1, {stall})"}})
               ).metrics["step_time_s"] == pytest.approx(t + stall, rel=1e-12)
    assert run(_one_gpu({"jitter": {"scope": "op", "dist": f"bernoulli_stall(1, {stall})"}})
               ).metrics["step_time_s"] == pytest.approx(t + k * stall, rel=1e-12)
    assert run(_one_gpu({"slow_gpus": {0: 1.25}})).metrics["step_time_s"] == pytest.approx(1.25 * t, rel=1e-12)


# -- links and NICs ----------------------------------------------------------------------------------------
#: TP 8 in each host, DP 4 across 4 hosts, 2 hosts per leaf: the DP rings cross the spines.
FABRIC = {"model": {"preset": "tiny-dense", "num_layers": 2},
          "cluster": {"preset": "dgx-h100", "num_nodes": 4, "hosts_per_leaf": 2},
          "parallel": {"tp": 8, "pp": 1, "dp": 4, "global_batch_size": 8, "seq_len": 1024}, "num_steps": 1}


def _bytes(res, u, v) -> float:
    c = res.scenario.cluster
    lb = res.network.link_bytes
    return float(lb[c.link_id[(u, v)]] + lb[c.link_id[(v, u)]])


def test_a_failed_link_moves_its_traffic_to_the_other_planes():
    base = run(FABRIC)
    cut = run({**FABRIC, "whatif": {"failed_links": [["leaf0.0", "spine0.0"]]}})
    assert _bytes(base, "leaf0.0", "spine0.0") > 0
    assert _bytes(cut, "leaf0.0", "spine0.0") == 0
    # everything leaf0.0 sent up and received from the spines now crosses spine0.1
    assert _bytes(cut, "leaf0.0", "spine0.1") == pytest.approx(
        _bytes(base, "leaf0.0", "spine0.0") + _bytes(base, "leaf0.0", "spine0.1"), rel=1e-9)
    assert cut.metrics["step_time_s"] >= base.metrics["step_time_s"]


def test_removing_every_path_names_both_gpus():
    wi = {"failed_links": [["leaf0.0", "spine0.0"], ["leaf0.0", "spine0.1"]]}
    with pytest.raises(ConfigError, match=r"gpu\d+ -> gpu\d+") as e:
        run({**FABRIC, "whatif": wi})
    assert e.value.field == "whatif.failed_links" and "no path left" in str(e.value)


def test_a_failed_nic_stops_the_job_unless_pxn_fails_over():
    """nic1.0 (GPU 8's) fails: without failover the job stops at the first transfer that
    needs it, naming the NIC, the GPU and the instant; at an instant after the run nothing
    happens; with ``nic_failover: pxn`` GPU 8's traffic leaves through its peer's NIC
    (nic1.1), which carries more bytes than before, and the step completes."""
    base = run(FABRIC)
    with pytest.raises(JobStopped) as e:
        run({**FABRIC, "whatif": {"failed_nics": ["nic1.0"]}})
    assert e.value.nic == "nic1.0" and e.value.gpus == (8,)
    assert 0 < e.value.time_s < base.metrics["step_time_s"]
    late = run({**FABRIC, "whatif": {"failed_nics": [{"gpu": 8, "at_s": 10.0}]}})
    assert late.metrics["step_time_s"] == pytest.approx(base.metrics["step_time_s"], rel=1e-12)
    mid = 0.5 * (e.value.time_s + base.step_bounds[-1][1])
    with pytest.raises(JobStopped) as e2:
        run({**FABRIC, "whatif": {"failed_nics": [{"nic": "nic1.0", "at_s": mid}]}})
    assert e2.value.time_s >= mid
    pxn = run({**FABRIC, "whatif": {"failed_nics": ["nic1.0"], "nic_failover": "pxn"}})
    assert pxn.metrics["step_time_s"] >= base.metrics["step_time_s"]
    assert _bytes(pxn, "nic1.0", "leaf0.0") == 0
    assert _bytes(pxn, "nic1.1", "leaf0.1") > _bytes(base, "nic1.1", "leaf0.1") > 0


def test_degrading_a_link_the_job_does_not_use_changes_nothing():
    base = run(FABRIC)
    c = base.scenario.cluster
    unused = [c.link_nodes[i] for i in np.flatnonzero(base.network.link_bytes == 0)
              if {c.graph.nodes[x]["kind"] for x in c.link_nodes[i]} == {"leaf", "spine"}]
    assert unused
    wi = {"degraded_links": [{"link": list(unused[0]), "bandwidth_factor": 0.01, "extra_latency": "50 us"}]}
    other = run({**FABRIC, "whatif": wi})
    assert other.metrics["step_time_s"] == base.metrics["step_time_s"]
    cols = ["rank", "stream", "name", "start_s", "end_s"]
    assert other.rank_timeline()[cols].sort_values(cols).reset_index(drop=True).equals(
        base.rank_timeline()[cols].sort_values(cols).reset_index(drop=True))
    used = {"degraded_links": [{"link": ["leaf0.0", "spine0.0"], "bandwidth_factor": 0.01}]}
    assert run({**FABRIC, "whatif": used}).metrics["step_time_s"] > base.metrics["step_time_s"]
