"""The host cursor: the GPU cannot start work the host has not issued yet (``Scenario.host``).

Eager PyTorch issues a modelled kernel in ``HOST_COSTS["eager"].kernel_s`` of host time and a
collective call in ``call_s`` (measured, ``experiments/microbench/gpu_bench.py``); a tiny
model's kernels run far faster, so its step is paced by the host, while a large layer hides
the host behind its kernels.
"""

from __future__ import annotations

import pytest

from simulator.engine import run
from simulator.explore.estimate import estimate
from simulator.scenario import load_scenario
from tests.simulator.test_whatif_models import ONE_GPU
from topologies import ConfigError
from workloads.costs.compute import HOST_COSTS


def _one_gpu(model="tiny-dense", host="eager", seq_len=512, gbs=4, **kw) -> dict:
    return {"model": model, "cluster": ONE_GPU, "host": host, "num_steps": 1,
            "parallel": {"tp": 1, "pp": 1, "dp": 1, "global_batch_size": gbs, "seq_len": seq_len}, **kw}


def _cursor_step(ops) -> float:
    """The host-cursor recurrence written out for one GPU with nothing to wait for but the
    host: the host issues op after op; a compute op of ``k`` kernels starts once the host has
    issued its first (its ``host_s / k``) and ends no earlier than its last kernel's issue
    plus that kernel's share of the run time."""
    gpu = host = 0.0
    for op in ops:
        k = max(op.host_ops, 1)
        if op.kind == "compute":
            first = host + op.host_s / k
            host += op.host_s
            start = max(gpu, first)
            gpu = max(start + op.duration_s, host + op.duration_s / k)
        elif op.kind == "host_sync":    # the host waits for the GPU to reach the point
            host = max(host, gpu - op.duration_s)
        else:                       # a call on a group of one: issued, then done
            host += op.host_s
            gpu = max(gpu, host)
    return gpu


def test_a_host_bound_step_is_the_host_cursor_recurrence():
    res = run(_one_gpu())
    ops = res.program.classes[0].ops
    gpu_time = sum(op.duration_s for op in ops if op.kind == "compute")
    host_time = sum(op.host_s for op in ops)
    step = res.metrics["step_time_s"]
    assert step == pytest.approx(_cursor_step(ops), rel=1e-9)
    assert host_time > 3 * gpu_time                   # tiny kernels: the host paces the step
    assert host_time <= step <= host_time + max(op.duration_s for op in ops)
    bd = res.metrics["breakdown_s"]
    assert bd["host_issue"] == pytest.approx(step - gpu_time, rel=1e-9)
    assert sum(bd.values()) == pytest.approx(step, rel=1e-9)
    assert "host_issue" not in res.metrics["exposed_comm_s"] and "exposed_host_issue" not in bd
    # every compute op carries its kernels' host time, every call one issue
    eager = HOST_COSTS["eager"]
    for op in ops:
        per = op.host_s / max(op.host_ops, 1)
        assert per == pytest.approx(eager.kernel_s if op.kind == "compute" else eager.call_s, rel=1e-12)


def test_the_host_modes():
    none = run(_one_gpu(host="none")).metrics
    graphs = run(_one_gpu(host="cuda_graphs")).metrics
    eager = run(_one_gpu(host="eager")).metrics
    assert none["breakdown_s"].get("host_issue", 0.0) == 0.0 and graphs["breakdown_s"].get("host_issue", 0.0) == 0.0
    # CUDA graphs also cut the GPU-side launch gap (LAUNCH_OVERHEAD_S)
    assert graphs["step_time_s"] < none["step_time_s"] < eager["step_time_s"]


def test_a_large_layer_hides_the_host():
    """Llama-3 8B layers at 4k tokens run for milliseconds per op: the host is soon far
    ahead; only the step's first, short ops (embedding, norm) wait for their issue."""
    sc = _one_gpu(model={"preset": "llama3-8b", "num_layers": 2}, seq_len=4096, gbs=1)
    eager, none = run(sc).metrics, run({**sc, "host": "none"}).metrics
    assert eager["step_time_s"] == pytest.approx(none["step_time_s"], rel=5e-3)
    assert 0 < eager["breakdown_s"]["host_issue"] < 5e-3 * eager["step_time_s"]


@pytest.mark.parametrize("pp", [1, 2])
def test_the_estimate_follows_a_host_bound_engine(pp):
    """The estimator floors each schedule action at the host's time to issue it; a
    pipeline's batched transfers synchronise the host (Megatron's batch_p2p_sync), so the
    engine is host-bound per micro-batch too."""
    sc = {"model": {"preset": "tiny-dense", "num_layers": 4}, "cluster": {"preset": "dgx-h100", "num_nodes": 1},
          "parallel": {"tp": 1, "pp": pp, "dp": 8 // pp, "global_batch_size": 8 * 8 // pp, "seq_len": 512},
          "num_steps": 2}
    engine = run(sc).metrics["step_time_s"]
    est = estimate(sc)["step_time_s"]
    free = run({**sc, "host": "none"}).metrics["step_time_s"]
    assert engine > 2 * free
    assert est == pytest.approx(engine, rel=0.15)


def test_full_recompute_charges_the_checkpoint_function_once_per_layer_and_micro_batch():
    sc = _one_gpu(model={"preset": "tiny-dense", "num_layers": 3}, gbs=2)
    sc["parallel"]["recompute"] = "full"
    ops = run(sc).program.classes[0].ops
    eager = HOST_COSTS["eager"]
    extra = [op.host_s - op.host_ops * eager.kernel_s for op in ops if op.kind == "compute"]
    charged = [op for op, x in zip([o for o in ops if o.kind == "compute"], extra) if x > 1e-12]
    assert len(charged) == 3 * 2                                  # layers x micro-batches
    assert all(op.phase == "R" and op.name == "attn" for op in charged)
    assert sum(extra) == pytest.approx(6 * eager.checkpoint_s, rel=1e-9)


def test_a_measured_host_replaces_the_defaults():
    fast = run(_one_gpu(host={"kernel_us": 10, "call_us": 10})).metrics["step_time_s"]
    slow = run(_one_gpu(host={"kernel_us": 200})).metrics["step_time_s"]
    eager = run(_one_gpu()).metrics["step_time_s"]
    assert fast < eager < slow


def test_the_host_mode_is_validated():
    with pytest.raises(ConfigError, match="scenario.host"):
        load_scenario(_one_gpu(host="gpu"))
    with pytest.raises(ConfigError, match="scenario.host.kernel_us"):
        load_scenario(_one_gpu(host={"kernel_us": -3}))
    assert load_scenario(_one_gpu(host="cuda_graphs")).host == "cuda_graphs"
    assert load_scenario({k: v for k, v in _one_gpu().items() if k != "host"}).host == "eager"


def test_a_batch_of_pipeline_transfers_resynchronises_the_host():
    """GPU-bound pipeline stages: the host runs ahead of every compute op, except after a
    batch of transfers (Megatron's batch_p2p_sync), where the next op waits for the issue of
    its first kernel.  Each stage syncs twice per micro-batch, so the step grows by at least
    one kernel's issue per micro-batch over an infinitely fast host (and the DualPipe
    halves, which the same cursor drives, fold exactly)."""
    m = 8
    sc = {"model": {"preset": "llama3-8b", "num_layers": 2}, "cluster": {"preset": "dgx-h100", "num_nodes": 1},
          "parallel": {"tp": 1, "pp": 2, "dp": 4, "global_batch_size": 4 * m, "seq_len": 4096},
          "num_steps": 1}
    eager, none = run(sc), run({**sc, "host": "none"})
    delta = eager.metrics["step_time_s"] - none.metrics["step_time_s"]
    kernel = HOST_COSTS["eager"].kernel_s
    assert m * kernel <= delta < 0.01 * none.metrics["step_time_s"]
    waits = [w for c in eager.waits.values() for w in c if w[2] == "host_issue"]
    assert len(waits) >= 2 * m


def test_dualpipe_halves_wait_for_the_host_and_fold_exactly():
    from tests.simulator.test_fold import assert_same_run
    sc = {"model": {"preset": "tiny-moe", "num_layers": 8}, "cluster": {"preset": "dgx-h100", "num_nodes": 2},
          "parallel": {"tp": 1, "pp": 2, "ep": 4, "dp": -1, "global_batch_size": 32, "micro_batch_size": 1,
                       "seq_len": 2048, "schedule": "dualpipe", "mesh_order": "tp-cp-dp-ep-pp"},
          "num_steps": 1}
    folded = run(sc)
    assert folded.metrics["breakdown_s"]["host_issue"] > 0
    assert_same_run(folded, run(sc, fold=False))


def test_the_step_end_resynchronises_the_host():
    """The host runs far ahead of a GPU-bound step, but the step ends in a sync (loss, grad
    norm): the next step's first op waits for the issue of its first kernel."""
    sc = _one_gpu(model={"preset": "llama3-8b", "num_layers": 2}, seq_len=4096, gbs=1, num_steps=2)
    res = run(sc)
    t0, _ = res.step_bounds[-1]
    tl = res.timeline
    first = tl[(tl["step"] == 1) & (tl["stream"] == "compute")].sort_values("start_s").iloc[0]
    op = next(o for o in res.program.classes[0].ops if o.kind == "compute")
    assert first["name"] == op.name
    assert first["start_s"] - t0 == pytest.approx(op.host_s / op.host_ops, rel=1e-9)


def test_a_search_passes_the_host_to_its_candidates():
    from simulator.explore.search import SearchSpec
    spec = SearchSpec.from_dict({"model": "tiny-dense", "cluster": {"preset": "dgx-h100", "num_nodes": 1},
                                 "global_batch_size": 8, "seq_len": 512, "host": "cuda_graphs"})
    sc = load_scenario(spec.scenario_for({"tp": 1, "pp": 1, "dp": 8}))
    assert sc.host == "cuda_graphs"


def _moe_ops(host):
    """The compute ops of one tiny-moe step on one GPU (one EP rank), by (name, phase, layer)."""
    sc = _one_gpu(model="tiny-moe", host=host, gbs=1)
    return {(op.name, op.phase, op.layer, op.microbatch): op for op in run(sc).program.classes[0].ops if op.kind == "compute"}


def test_per_module_graphs_replay_their_scope_and_leave_the_experts_eager():
    """Megatron-Core's per-module scopes (``cuda_graph_scope: [attn, moe_router]``): the
    attention block and the router are replayed from graphs -- no host time, and each of
    their kernels leaves the GPU the graph's launch gap instead of the eager one -- while
    the permutation, the routed experts and the unpermutation keep eager issue; an op the
    scope does not touch is the eager op, field for field."""
    from workloads.costs.compute import LAUNCH_OVERHEAD_S
    eager = _moe_ops("eager")
    part = _moe_ops({"cuda_graph_scope": ["attn", "moe_router", "moe_preprocess"]})
    gap = LAUNCH_OVERHEAD_S[False] - LAUNCH_OVERHEAD_S[True]
    kernel_s = HOST_COSTS["eager"].kernel_s
    assert eager.keys() == part.keys()
    names = {k[0] for k in eager}
    assert {"attn", "moe_pre", "experts", "moe_post"} <= names
    for key, e in eager.items():
        p = part[key]
        if key[0] == "attn":                          # the whole block is graphed
            assert p.host_s == 0.0
            assert p.duration_s == pytest.approx(e.duration_s - e.host_ops * gap, rel=1e-12)
        elif key[0] in ("experts", "moe_post"):       # eager, untouched
            assert p == e
        elif key[0] == "moe_pre":                     # norm and router graphed, the permutation eager
            assert 0 < p.host_s < e.host_s
            graphed_kernels = (e.host_s - p.host_s) / kernel_s
            assert graphed_kernels == pytest.approx(round(graphed_kernels), abs=1e-9)
            assert p.duration_s == pytest.approx(e.duration_s - graphed_kernels * gap, rel=1e-12)
    # the 'moe' scope graphs the whole MoE block: the layers' host time is gone
    whole = _moe_ops({"cuda_graph_scope": ["attn", "moe"]})
    assert all(op.host_s == 0.0 for k, op in whole.items() if k[2] >= 0)


def test_a_host_bound_step_with_partial_graphs_is_still_the_cursor_recurrence():
    res = run(_one_gpu(model="tiny-moe", host={"cuda_graph_scope": ["attn", "moe_router"]}, gbs=2))
    ops = res.program.classes[0].ops
    assert res.metrics["step_time_s"] == pytest.approx(_cursor_step(ops), rel=1e-9)
    graphs = run(_one_gpu(model="tiny-moe", host="cuda_graphs", gbs=2)).metrics["step_time_s"]
    eager = run(_one_gpu(model="tiny-moe", gbs=2)).metrics["step_time_s"]
    assert graphs < res.metrics["step_time_s"] < eager


def test_the_graph_scope_is_validated():
    with pytest.raises(ConfigError, match="scenario.host.cuda_graph_scope"):
        load_scenario(_one_gpu(host={"cuda_graph_scope": ["experts"]}))
    with pytest.raises(ConfigError, match="scenario.host.cuda_graph_scope"):
        load_scenario(_one_gpu(host={"cuda_graph_scope": []}))
    assert load_scenario(_one_gpu(host={"cuda_graph_scope": ["attn"], "kernel_us": 50})).host["kernel_us"] == 50


# -- the dropless MoE dispatcher's host sync ------------------------------------------------------
_TWO_GPUS = {"gpu": "H100-SXM", "num_nodes": 1, "gpus_per_host": 2, "nvlink_domain_size": 2, "nics_per_host": 1}


def _ep2(host="eager", moe=None, **par) -> dict:
    """Qwen3-30B-A3B, two layers, EP 2 on two NVLink GPUs, two micro-batches."""
    model = {"preset": "qwen3-30b-a3b", "num_layers": 2, **({"moe": moe} if moe else {})}
    return {"model": model, "cluster": _TWO_GPUS, "host": host, "num_steps": 1,
            "parallel": {"tp": 1, "pp": 1, "dp": 1, "ep": 2, "global_batch_size": 4, "seq_len": 4096, **par}}


def _syncs(prog):
    return [op for op in prog.classes[0].ops if op.kind == "host_sync"]


def test_the_dropless_dispatcher_sync_exposes_the_calls_issued_after_it():
    """A host that issues kernels (per-expert ones too) for free and each call in C = 250 us runs far ahead of the
    GPU -- except at the dispatcher's sync: the host resumes when the GPU reaches the point
    before the permutation (the sync's lag ``l`` ahead of the end of ``moe_pre``), then
    issues the tokens' all-to-all, which starts ``C - l`` after the GPU is ready for it.
    The experts then outlast the issue of the probabilities' all-to-all and the combine
    (2C), so each of the n = 2 layers x 2 micro-batches forward syncs adds exactly ``C - l``:
    the closed form.  Padding to capacity
    (Megatron-Core's drop_and_pad: the counts are known on the host) is the same program
    without the syncs -- under balanced routing every expert receives exactly its capacity."""
    call = 250e-6
    host = {"kernel_us": 0, "expert_launch_us": 0, "call_us": call * 1e6}
    sync, pad = run(_ep2(host)), run(_ep2(host, moe={"capacity_factor": 1.0, "pad_expert_input_to_capacity": True}))
    syncs = _syncs(sync.program)
    assert len(syncs) == 2 * 2 and not _syncs(pad.program)
    # the same program but for the syncs and the counts' all-gather, issued with moe_pre (its
    # host time lies before the sync, so it moves nothing)
    def bare(op):
        return op._replace(host_s=0.0, host_ops=0) if op.name == "moe_pre" else op
    assert [bare(op) for op in sync.program.classes[0].ops if op.kind != "host_sync"] == \
        [bare(op) for op in pad.program.classes[0].ops]
    lag = syncs[0].duration_s
    assert 0 < lag < call and all(op.duration_s == lag for op in syncs)
    delta = sync.metrics["step_time_s"] - pad.metrics["step_time_s"]
    assert delta == pytest.approx(len(syncs) * (call - lag), rel=1e-9)
    assert sync.metrics["breakdown_s"]["host_issue"] - pad.metrics["breakdown_s"].get("host_issue", 0.0) == \
        pytest.approx(delta, rel=1e-6)
    # an infinitely fast host never waits for the GPU's counts (and gets no sync op)
    assert not _syncs(run(_ep2("none")).program)


def test_where_the_dispatchers_sync():
    """Megatron-Core (token_dispatcher.py, fused_a2a.py): every dropless dispatcher syncs the
    host once per MoE layer forward -- alltoall ahead of the all-to-all, allgather after its
    all-gather, DeepEP and HybridEP inside the dispatch -- but not in the backward (the
    splits are kept); padding to capacity and HybridEP's rank budget know the sizes on the
    host; a recomputed MoE forward syncs again."""
    from workloads.ops import OpName
    ops = build(_ep2()).classes[0].ops
    syncs = _syncs(build(_ep2()))
    assert {(op.phase, op.name) for op in syncs} == {("F", OpName.MOE_HOST_SYNC)}
    for s in syncs:                       # right after moe_pre, before the dispatch
        i = ops.index(s)
        assert ops[i - 1].name == "moe_pre" and ops[i + 1].name == "ep_dispatch"
    gather = build(_ep2(moe={"token_dispatcher": "allgather"})).classes[0].ops
    for i, op in enumerate(gather):
        if op.kind == "host_sync":
            assert gather[i - 1].name == "ep_dispatch" and op.duration_s == 0.0
    assert len(_syncs(build(_ep2(moe={"token_dispatcher": "flex"})))) == 4
    assert len(_syncs(build(_ep2(moe={"token_dispatcher": "flex", "flex_dispatcher_backend": "hybridep"})))) == 4
    assert not _syncs(build(_ep2(moe={"token_dispatcher": "flex", "flex_dispatcher_backend": "hybridep",
                                      "expert_rank_capacity_factor": 1.5})))
    assert len(_syncs(build(_ep2(moe={"capacity_factor": 1.0})))) == 4          # dropping, not padded
    assert not _syncs(build(_ep2("cuda_graphs")))
    full = _syncs(build(_ep2(recompute="full")))
    assert sorted(op.phase for op in full) == ["F"] * 4 + ["R"] * 4
    moe = _syncs(build(_ep2(recompute="selective", recompute_modules=["moe"])))
    assert sorted(op.phase for op in moe) == ["F"] * 4 + ["R"] * 4
    # with the moe_preprocess graph the counts are copied after permutation 1: the lag is
    # only the sort by local expert, 2k / (1 + 3k) of the permutation's bytes
    eager = _syncs(build(_ep2()))[0].duration_s
    graphed = _syncs(build(_ep2({"cuda_graph_scope": ["attn", "moe_router", "moe_preprocess"]})))[0].duration_s
    assert graphed == pytest.approx(eager * 2 * 8 / (1 + 3 * 8), rel=1e-12)


def build(sc):
    from workloads import build_program
    s = load_scenario(sc)
    return build_program(s.model, s.parallel, s.cluster.gpu, precision=s.recipe_or_name, host=s.host)


@pytest.mark.parametrize("ep_overlap", [False, True])
def test_the_dispatcher_syncs_fold_exactly(ep_overlap):
    """The sync moves one host cursor per cell, in the main loop and in the combined 1F1B's
    halves (which share one host thread): folded runs equal unfolded ones."""
    from tests.simulator.test_fold import assert_same_run
    sc = {"model": {"preset": "tiny-moe", "num_layers": 4, "moe": {"num_experts": 8}},
          "cluster": {"preset": "dgx-h100", "num_nodes": 2},
          "parallel": {"tp": 1, "pp": 2, "ep": 4, "dp": -1, "vpp": 2, "schedule": "interleaved_1f1b",
                       "global_batch_size": 32, "micro_batch_size": 1, "seq_len": 2048},
          "overlap": {"p2p": True, "moe_ep_comm": ep_overlap}, "num_steps": 1}
    folded = run(sc)
    ops = folded.program.classes[0].ops
    assert any(op.kind == "host_sync" and bool(op.lane) == ep_overlap for op in ops)
    assert_same_run(folded, run(sc, fold=False))


def test_the_host_issues_every_call_of_a_dispatch():
    """Megatron-Core's alltoall dispatcher all-gathers the per-expert counts in its eager
    preprocessing (issued with moe_pre; inside the moe_preprocess graph when that is
    captured), then dispatches the tokens and the probabilities in two all-to-alls, forward
    and backward; allgather gathers three tensors and reduce-scatters two; the flex
    dispatchers make one call; every combine one."""
    call, kernel = HOST_COSTS["eager"].call_s, HOST_COSTS["eager"].kernel_s

    def calls(sc):
        return {(op.name, op.phase): op.host_ops for op in build(sc).classes[0].ops
                if op.kind == "collective" and op.group == "ep"}
    assert calls(_ep2()) == {("ep_dispatch", "F"): 2, ("ep_combine", "F"): 1, ("ep_combine_bwd", "B"): 1,
                             ("ep_dispatch_bwd", "B"): 2}
    pre = {g: next(op for op in build(_ep2(g)).classes[0].ops if op.name == "moe_pre")
           for g in ("eager", "none")}
    assert pre["eager"].host_s == pytest.approx((pre["eager"].host_ops - 1) * kernel + call, rel=1e-12)
    graphed = build(_ep2({"cuda_graph_scope": ["moe_router", "moe_preprocess"]})).classes[0].ops
    # graphed: only the eager permutation's kernels, no call
    assert all(op.host_s / kernel == pytest.approx(round(op.host_s / kernel), abs=1e-9)
               for op in graphed if op.name == "moe_pre")
    assert calls(_ep2(moe={"token_dispatcher": "allgather"}))[("ep_dispatch", "F")] == 3
    assert set(calls(_ep2(moe={"token_dispatcher": "flex"})).values()) == {1}
    ops = [op for op in build(_ep2()).classes[0].ops if op.kind == "collective" and op.group == "ep"]
    assert all(op.host_s == pytest.approx(op.host_ops * call, rel=1e-12) for op in ops)
    assert all(op.host_s == 0.0 for op in build(_ep2("none")).classes[0].ops)


@pytest.mark.parametrize("precision, launches_per_gemm", [("bf16", 1), ("fp8_tensorwise", 2)])
def test_each_further_local_expert_costs_the_host_its_looped_launches(precision, launches_per_gemm):
    """Transformer Engine's grouped linear quantises each expert's slice and issues one
    cuBLASLt GEMM per expert from a C++ loop.  With E experts on the rank, each of the two
    grouped GEMMs (fc1, fc2) adds ``(E - 1)`` GEMM launches in every phase (F, B, W), and
    under FP8 as many quantisations of its input in F and B (wgrad reuses them): closed
    form against the same host with ``expert_launch_us: 0``."""
    def experts(host):
        sc = _one_gpu(model="tiny-moe", host=host, gbs=1, precision=precision)
        ops = run(sc).program.classes[0].ops
        return {(op.phase, op.layer): op for op in ops if op.kind == "compute" and op.name.startswith("experts")}
    loop = HOST_COSTS["eager"].expert_launch_s
    assert loop == pytest.approx(10e-6)
    base = experts({"expert_launch_us": 0})
    full = experts("eager")
    per_phase = {"F": 2 * launches_per_gemm, "B": 2 * launches_per_gemm}
    e = 4                                          # tiny-moe: 4 experts, all on this one rank
    assert base.keys() == full.keys()
    for (phase, layer), op in full.items():
        extra = per_phase.get(phase, 2) * (e - 1)  # W: the two wgrad GEMMs
        assert op.host_s - base[(phase, layer)].host_s == pytest.approx(extra * loop, rel=1e-9)
        assert op.host_ops - base[(phase, layer)].host_ops == extra
        assert op.duration_s == base[(phase, layer)].duration_s
    # a graphed or ideal host issues no per-expert launches
    assert all(op.host_s == 0.0 for op in experts("cuda_graphs").values())
    # the measured-host mapping takes its own figure
    assert load_scenario(_one_gpu(host={"expert_launch_us": 4})).host == {"expert_launch_us": 4}


def test_batched_gemms_are_not_per_expert_launches():
    """Unfused attention's batched GEMMs carry groups (heads x sequences) but launch one
    kernel: a dense model's program is the same with or without per-expert launch costs."""
    model = {"preset": "tiny-dense", "flash_attention": False}
    with_loop = run(_one_gpu(model=model)).program.classes[0].ops
    without = run(_one_gpu(model=model, host={"expert_launch_us": 0})).program.classes[0].ops
    assert with_loop == without
