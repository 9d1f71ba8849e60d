"""Metrics of a run: pure functions of the timeline, the program and the cluster.

Every metric refers to the **last simulated step** (``Result.step_bounds[-1]``), so work
that crosses the step boundary is where it runs.  Definitions (each used once):

``step_time_s``       end of the last step minus end of the step before (0 for one step):
                      the latest finishing cell sets both ends.
``tflops_per_gpu``    model FLOPs per step (the scenario's ``flop_convention``, default
                      ``megatron_core_2025``, echoed as ``flop_convention``) / step time /
                      GPUs / 1e12.
``mfu``               model FLOPs / (step time x GPUs x dense peak of the recipe's GEMM dtype).
                      With token dropping the model FLOPs leave out the dropped token-expert
                      assignments (the convention's routed-expert part x kept fraction), so
                      MFU <= HFU holds as without; ``model_flops_per_step_dropless`` keeps the
                      convention's count of every routed assignment (what Megatron-LM logs).
``mfu_bf16_peak``     the same over the BF16 peak (comparable across precisions).
``hfu``               executed FLOPs (every compute op of the step, recompute included, over
                      all ranks) / (step time x GPUs x the same peak as ``mfu``).
``tokens_per_s``      global batch x sequence length / step time.
``breakdown_s``       on the cell that finishes last: each instant of its compute stream in
                      the step window is ``compute`` (F/B/W/step ops), ``recompute``, or idle;
                      idle is attributed to the axis of the blocking wait that covers it
                      (``exposed_<axis>``; the wait that ends last when several do), to
                      ``host_issue`` where the GPU waited for the host to issue work
                      (``Scenario.host``), or to ``bubble`` when nothing was outstanding.
                      Sums to the step time.
``exposed_comm_s``    the breakdown's ``exposed_<axis>`` terms by axis.
``bubble_fraction``   ``breakdown_s["bubble"] / step_time_s``.
``link_utilization``  per tier: bytes carried in the step / (tier capacity x step time).
``peak_memory_bytes`` the memory model's largest stage total; ``memory_fits`` whether every
stage fits its GPU's HBM, ``memory_margin_bytes`` the HBM left on the tightest stage
``layout``            the parallel layout in one line (``TP8 PP4 DP2 1f1b, bf16``).
``whatif``            one sentence per perturbation the run applied, naming for a slow GPU or
                      rank its rank, pipeline stage and groups (empty: none).
``last_ranks``        the ranks of the cell that finishes the step last and their stage.
``measured_compute_share``  only where some op's time came from a measured kernel table
                      (:mod:`workloads.costs.kernel_tables`): that share of the decoder layers'
                      kernel GPU time (:meth:`workloads.program.Program.measured_share`);
                      ``measured_step_share`` the share of the step it stands for: that share x
                      the compute and recompute time of ``breakdown_s`` / step time.
(negative: short by that much) and ``memory_worst_stage`` which stage that is, under the
scenario's ``memory_accounting`` and against ``(1 - hbm_headroom) x HBM`` (both echoed).
``moe_dropped_fraction``  only with token dropping (``model.moe.capacity_factor`` or a rank
                      budget): dropped / routed token-expert assignments over the step's MoE
                      layers; ``moe_routed_tokens`` (global batch x sequence x top-k x MoE
                      layers) and ``moe_dropped_tokens`` (fraction x routed) count them for
                      the whole job (a token dropped by one of its k experts counts once);
                      ``model_flops_per_step_dropless`` the convention's FLOPs with none dropped.
"""

from __future__ import annotations

import heapq

import numpy as np

from topologies.specs import TIERS
from workloads import get_recipe
from workloads.costs import DEFAULT_FLOP_CONVENTION, model_flops_per_step, routed_expert_flops_per_step
from workloads.ops import Phase, Stream

__all__ = ["summarize", "breakdown", "layout_label", "describe_whatif"]


def breakdown(timeline, waits: list, t0: float, t1: float, cell: int) -> dict[str, float]:
    """Step-time breakdown of one cell's compute stream over ``[t0, t1]`` (sums to t1 - t0)."""
    tl = timeline[(timeline["cell"] == cell) & (timeline["stream"] == Stream.COMPUTE)]
    return breakdown_of(tl["start_s"].to_numpy(), tl["end_s"].to_numpy(),
                        (tl["phase"].to_numpy() == Phase.R).tolist(), waits, t0, t1)


def breakdown_of(starts, ends, recompute, waits: list, t0: float, t1: float) -> dict[str, float]:
    """:func:`breakdown` of one cell's compute-stream ops given as (start, end, is recompute),
    in the order they were recorded (a streamed run keeps only these, :mod:`.stream`)."""
    out: dict[str, float] = {"compute": 0.0, "recompute": 0.0}
    busy = []
    for s, e, rc in zip(starts, ends, recompute):
        if not (e > t0 and s < t1):
            continue
        s, e = max(s, t0), min(e, t1)
        if e <= s:
            continue
        out["recompute" if rc else "compute"] += e - s
        busy.append((s, e))
    busy.sort()
    # idle intervals of the compute stream
    idle, cur = [], t0
    for s, e in busy:
        if s > cur:
            idle.append((cur, s))
        cur = max(cur, e)
    if cur < t1:
        idle.append((cur, t1))
    ws = sorted((max(s, t0), min(e, t1), ax) for s, e, ax in waits if e > t0 and s < t1)
    # sweep over the idle intervals: each instant goes to the covering wait that ends last
    # (the one the stream was really held up by), uncovered time is bubble
    points = sorted({x for a, b in idle for x in (a, b)} | {x for s, e, _ in ws for x in (s, e)})
    heap: list = []
    axis_rank = {a: i for i, a in enumerate(sorted({w[2] for w in ws}))}
    j = k = 0
    for p, q in zip(points, points[1:]):
        while k < len(idle) and idle[k][1] <= p:
            k += 1
        if k == len(idle):
            break
        if not idle[k][0] <= p < idle[k][1]:
            continue
        mid = 0.5 * (p + q)
        while j < len(ws) and ws[j][0] <= mid:
            heapq.heappush(heap, (-ws[j][1], -axis_rank[ws[j][2]], ws[j][2]))
            j += 1
        while heap and -heap[0][0] <= mid:
            heapq.heappop(heap)
        # ties on the end go to the largest axis name (the heap orders by both)
        ax = heap[0][2] if heap else "bubble"
        key = ax if ax in ("bubble", "host_issue") else f"exposed_{ax}"
        out[key] = out.get(key, 0.0) + (q - p)
    out.setdefault("bubble", 0.0)
    return out


def summarize(res, snap_a=None, snap_b=None) -> dict:
    """All metrics of a :class:`~simulator.engine.Result` (see the module docstring)."""
    sc, prog = res.scenario, res.program
    t0, t1 = res.step_bounds[-1]
    step = t1 - t0
    n = sc.cluster.num_gpus
    gpu = sc.cluster.gpu
    recipe = get_recipe(sc.precision, gpu=gpu)
    peak = gpu.peak_flops.get(recipe.peak_dtype, gpu.peak_flops["bf16"])
    executed, last_cell, bd = _last_step(res, t0, t1)
    seq = sc.parallel.seq_len or sc.model.seq_len
    tokens = sc.parallel.batch_size * seq
    exposed = {k[len("exposed_"):]: v for k, v in bd.items() if k.startswith("exposed_")}
    util = {}
    if snap_a is not None and snap_b is not None and step > 0:
        summ = res.network.tier_summary(snap_a, snap_b, res.network.capacity, sc.cluster.link_tier,
                                        [t.value for t in TIERS])
        util = {k: v["utilization"] for k, v in summ.items()}
    mf = prog.model_flops_per_step
    if sc.flop_convention != DEFAULT_FLOP_CONVENTION:
        mf = model_flops_per_step(sc.model, sc.parallel.batch_size, seq, convention=sc.flop_convention)
    drops = _moe_drops(prog, tokens)
    if drops:
        # dropped token-expert assignments are no work of the model (docs/modelling.md, "MFU
        # with token dropping"): the convention's routed-expert part counts only those kept
        drops["model_flops_per_step_dropless"] = mf
        mf -= prog.moe_drops["fraction"] * routed_expert_flops_per_step(sc.model, sc.parallel.batch_size, seq,
                                                                        convention=sc.flop_convention)
    bd = {k: float(v) for k, v in bd.items()}
    exposed = {k: float(v) for k, v in exposed.items()}
    measured = _measured(prog, bd, step)
    return {
        "step_time_s": step,
        "mfu": mf / (step * n * peak) if step > 0 else 0.0,
        "mfu_bf16_peak": mf / (step * n * gpu.peak_flops["bf16"]) if step > 0 else 0.0,
        "hfu": executed / (step * n * peak) if step > 0 else 0.0,
        "tflops_per_gpu": mf / step / n / 1e12 if step > 0 else 0.0,
        "tokens_per_s": tokens / step if step > 0 else 0.0,
        "bubble_fraction": bd.get("bubble", 0.0) / step if step > 0 else 0.0,
        "exposed_comm_s": exposed,
        "breakdown_s": bd,
        "link_utilization": util,
        "peak_memory_bytes": max(e.total_bytes for e in res.memory) if res.memory else 0.0,
        **_memory_verdict(res.memory),
        **drops,
        **measured,
        "num_gpus": n,
        "model_flops_per_step": mf,
        "layout": layout_label(sc),
        "whatif": describe_whatif(sc, prog.grid),
        "last_ranks": _ranks_label(res.folding.cells[last_cell], prog.grid),
        "flop_convention": sc.flop_convention,
        "memory_accounting": sc.memory_accounting,
        "hbm_headroom": sc.hbm_headroom,
        "last_cell": last_cell,
    }


def _last_step(res, t0: float, t1: float) -> tuple[float, int, dict]:
    """The FLOPs executed in the last step (every op over all ranks), the cell that finishes
    it last, and that cell's :func:`breakdown`: from the timeline, or from the summaries of
    a streamed one (:mod:`simulator.engine.stream`, the same numbers in the same order)."""
    st = getattr(res, "stream", None)
    if st is not None:
        last_cell = st.last_cell()
        return st.executed_flops(), last_cell, st.breakdown(last_cell, res.waits[last_cell], t0, t1)
    rows = res.timeline_rows() if hasattr(res, "timeline_rows") else None
    got = _last_step_of_rows(rows, res, t0, t1) if rows else None
    if got is not None:
        return got
    tl = res.timeline
    last_step = tl[tl["step"] == tl["step"].max()]
    sizes = np.array([len(m) for m in res.folding.cells])
    executed = float((last_step["flops"].to_numpy() * sizes[last_step["cell"].to_numpy()]).sum())
    # the cell that finishes the last step last
    ends = last_step.groupby("cell")["end_s"].max()
    last_cell = int(ends.idxmax())
    return executed, last_cell, breakdown(tl, res.waits[last_cell], t0, t1, last_cell)


def _last_step_of_rows(rows: list, res, t0: float, t1: float) -> "tuple[float, int, dict] | None":
    """:func:`_last_step` from the recorder's rows (``(op, rank, node, stream, axis, start,
    end, step, cell)``) without building the timeline's frame: each column an array of the
    dtype the frame gives it (None, for the frame to be built, when one would not be int64 or
    float64), filtered and summed in the same order, so the same numbers bit for bit."""
    ops, _, _, stream, _, start, end, step, cell = zip(*rows)
    step, cell = np.array(step), np.array(cell)
    flops, start, end = np.array([op.flops for op in ops]), np.array(start), np.array(end)
    if (step.dtype != np.int64 or cell.dtype != np.int64 or flops.dtype not in (np.int64, np.float64)
            or start.dtype != np.float64 or end.dtype != np.float64):
        return None
    last = np.flatnonzero(step == step.max())
    sizes = np.array([len(m) for m in res.folding.cells])
    executed = float((flops[last] * sizes[cell[last]]).sum())
    # the cell that finishes the last step last (the lowest-numbered one on a tie)
    ends = np.full(len(sizes), -np.inf)
    np.maximum.at(ends, cell[last], end[last])
    present = np.unique(cell[last])
    last_cell = int(present[np.argmax(ends[present])])
    mine = [i for i in np.flatnonzero(cell == last_cell).tolist() if stream[i] == Stream.COMPUTE]
    bd = breakdown_of(start[mine], end[mine], [ops[i].phase == Phase.R for i in mine], res.waits[last_cell], t0, t1)
    return executed, last_cell, bd


def _measured(prog, bd: dict, step: float) -> dict:
    """``measured_compute_share`` and ``measured_step_share`` where any op was timed from a
    measured kernel table (absent otherwise)."""
    share = prog.measured_share() if hasattr(prog, "measured_share") else None
    if not share:
        return {}
    busy = bd.get("compute", 0.0) + bd.get("recompute", 0.0)
    return {"measured_compute_share": float(share),
            "measured_step_share": float(share * busy / step) if step > 0 else 0.0}


def _moe_drops(prog, tokens: int) -> dict:
    """Dropped token-expert assignments of the step (only when the run drops tokens)."""
    d = getattr(prog, "moe_drops", None)
    if d is None:
        return {}
    m = prog.model
    routed = tokens * m.moe.top_k * sum(1 for i in range(m.num_layers) if m.is_moe_layer(i))
    return {"moe_routed_tokens": routed, "moe_dropped_tokens": int(round(d["fraction"] * routed)),
            "moe_dropped_fraction": float(d["fraction"])}


def _memory_verdict(memory) -> dict:
    """``memory_fits`` (every stage within HBM under the memory model), ``memory_margin_bytes``
    (HBM minus the worst stage's total: negative when it does not fit) and
    ``memory_worst_stage`` (that stage's description)."""
    if not memory or memory[0].hbm_bytes is None:
        return {}
    worst = max(memory, key=lambda e: e.total_bytes - e.hbm_bytes)
    return {"memory_fits": all(e.fits() for e in memory),
            "memory_margin_bytes": float(worst.hbm_bytes - worst.total_bytes),
            "memory_worst_stage": worst.where}


def layout_label(sc) -> str:
    """``TP8 PP4 DP2 1f1b, bf16`` (CP, VPP and EP named when above 1)."""
    par = sc.parallel
    parts = [f"TP{par.tp}"] + ([f"CP{par.cp}"] if par.cp > 1 else []) + [f"PP{par.pp}"]
    parts += ([f"VPP{par.vpp}"] if par.vpp > 1 else []) + [f"DP{par.dp}"] + ([f"EP{par.ep}"] if par.ep > 1 else [])
    return f"{' '.join(parts)} {par.schedule}, {sc.precision}"


def _span(ranks) -> str:
    r = sorted(int(x) for x in ranks)
    if len(r) > 2 and r == list(range(r[0], r[-1] + 1)):
        return f"{r[0]}-{r[-1]}"
    if len(r) > 6:
        return f"{', '.join(map(str, r[:3]))}, ... {r[-1]} ({len(r)})"
    return ", ".join(map(str, r))


def _ranks_label(ranks, grid) -> str:
    stages = sorted({grid.stage_of(int(r)) for r in ranks})
    where = f"pipeline stage {stages[0]}" if len(stages) == 1 else f"pipeline stages {_span(stages)}"
    return f"rank{'s' if len(ranks) > 1 else ''} {_span(ranks)} ({where})"


def _rank_sentence(grid, rank: int) -> str:
    """Where ``rank`` sits: its stage and the groups with more than one member."""
    out = [f"pipeline stage {grid.stage_of(rank)}"]
    for kind, label in (("tp", "TP"), ("cp", "CP"), ("dp", "DP"), ("ep", "EP")):
        try:
            g = grid.group(kind, rank)
        except Exception:                       # noqa: BLE001 (a kind this layout has no mesh axis for)
            continue
        if len(g) > 1:
            out.append(f"{label} group [{_span(g)}]")
    return ", ".join(out)


def describe_whatif(sc, grid) -> list[str]:
    """One sentence per perturbation of ``sc.whatif``, for the summary, JSON and charts."""
    w = sc.whatif
    if w.empty:
        return []
    gpu_to_rank = {grid.gpu_of(r): r for r in range(grid.world_size)}
    out = []
    for g, f in sorted(w.slow_gpus.items()):
        r = gpu_to_rank.get(g)
        where = f": rank {r}, {_rank_sentence(grid, r)}" if r is not None else " (no rank on it)"
        out.append(f"GPU {g} computes {f:g}x slower{where}")
    for r, f in sorted(w.slow_ranks.items()):
        out.append(f"rank {r} (GPU {grid.gpu_of(r)}) computes {f:g}x slower: {_rank_sentence(grid, r)}")
    for g, f in sorted(w.slow_nics.items()):
        out.append(f"GPU {g}'s NIC runs at 1/{f:g} of its bandwidth")
    for j in w.jitter:
        on = "every GPU" if j.gpus is None else f"GPUs {_span(j.gpus)}"
        out.append(f"jitter {j.dist}{tuple(j.params)} drawn per {j.scope.replace('_', ' ')} on {on}")
    for t in w.thermal:
        on = "every GPU" if t.gpus is None else f"GPUs {_span(t.gpus)}"
        when = (f" from {t.start_s:g} s" if t.start_s is not None else
                f" from step {t.start_step}" if t.start_step is not None else "")
        out.append(f"thermal throttling: {on} {t.factor:g}x slower{when}")
    for c in w.degraded_links:
        out.append(f"link {c.nodes[0]} - {c.nodes[1]} at {c.bandwidth_factor:g}x bandwidth"
                   + (f", +{c.extra_latency_s * 1e6:g} us" if c.extra_latency_s else ""))
    for n in w.failed_links:
        out.append(f"link {n[0]} - {n[1]} failed")
    for c in w.degraded_nics:
        out.append(f"NIC {c.nic} at {c.bandwidth_factor:g}x bandwidth"
                   + (f", +{c.extra_latency_s * 1e6:g} us" if c.extra_latency_s else ""))
    for n in w.failed_nics:
        out.append(f"NIC {n.nic} fails at {n.at_s:g} s (failover: {w.nic_failover})")
    if w.placement is not None:
        out.append("ranks placed on GPUs by a custom placement")
    if w.cp_mla_latent:
        out.append(_cp_mla_latent_sentence(sc))
    return out


def _cp_mla_latent_sentence(sc) -> str:
    """The ``cp_mla_latent`` what-if in one sentence, with the bytes per token and layer each
    CP exchange moves both ways."""
    from workloads.stacks.megatron_te.context_parallel import mla_cp_bytes_per_token
    m, tp = sc.model.mla, sc.parallel.tp
    kv, latent = mla_cp_bytes_per_token(sc.model, tp)
    heads = sc.model.num_attention_heads // tp
    return (f"cp_mla_latent (what-if; no framework does this today): the CP {sc.parallel.cp_comm_type} exchange "
            f"carries MLA's latent and RoPE key, ({m.kv_lora_rank} + {m.qk_rope_head_dim}) x 2 = {latent:,.0f} B "
            f"per token and layer, instead of per-head K and V, {heads} heads x ({m.qk_head_dim} + {m.v_head_dim}) "
            f"x 2 = {kv:,.0f} B ({kv / latent:.1f}x less); each rank up-projects the chunks it receives")
