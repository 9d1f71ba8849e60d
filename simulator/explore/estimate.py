"""A fast closed-form step-time estimate, built from the simulator's own models.

``estimate(scenario)`` answers in milliseconds what :func:`simulator.engine.run` answers
in seconds, for screening thousands of layouts (:mod:`simulator.explore.search`).  It has no
formula of its own:

* **per-action costs** come from the program builder (:func:`workloads.build_program`,
  the same compute model and the same collectives), built with the fewest micro-batches
  the schedule accepts: the ops of one micro-batch of every chunk are what every
  micro-batch runs.  Within an action its ops run back to back, each collective taking
  its uncontended predicted time (:meth:`~simulator.collectives.CollectiveEngine.predict`,
  NCCL's choice: the least predicted time); a collective the engine overlaps (CP ring
  hops with ``cp_comm``, each a transfer to the ring neighbour, TP with ``tp_comm``, the
  backward's input re-gather always, prefetched FSDP gathers) hides behind the next
  compute op; a receive adds its p2p transfer; an action takes at least the host's time
  to issue its ops (``Op.host_s``, the engine's host cursor), a fused backward (B and W,
  issued in one run of the host) the longer of its GPU sum and its host sum
  (:func:`_fused_backward_s`);
* **the pipeline** is the schedule's longest path over those costs
  (:func:`workloads.schedules.schedule_timing`);
* **data parallelism**: the gradient buckets overlap the last micro-batch's backward, so
  the estimate exposes ``max(last bucket, all buckets - one backward)`` (ZeRO-2/3 reduce
  every micro-batch's: each micro-batch exposes what its backward does not hide); buckets
  the stack issues off the data-parallel stream (``grad_reduce`` overlap off, DeepSpeed
  without ``overlap_comm``) expose all of them; the distributed
  optimizer's parameter gather exposes ``max(first bucket, all buckets - one forward)``, or
  all of it where it blocks (``param_gather`` off, DeepSpeed ZeRO-1/2's step all-gather);
  step-end ops (grad-norm all-reduce, tied embeddings, the optimizer) add;
* **memory** is :func:`workloads.memory_estimates`, the simulator's memory model.

What it leaves out, by construction: contention between concurrent flows (DP buckets
against PP transfers, EP all-to-alls against each other), the compute slowdown while
collectives share the GPU, DualPipe's F&B overlap, per-micro-batch routing imbalance, and
the host running ahead past overlapped (batched) pipeline p2p.  Where none of these arise
and the host does not pace the step it stays within 10 % of the engine
(:func:`check_estimate`, checked on fuzz draws; :func:`estimate_applies` lists the domain and
the gaps measured outside it).
The search therefore simulates its best candidates with the engine; a test checks that
the estimate ranks layouts like the simulator does (Spearman >= 0.9).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable

from workloads import build_program
from workloads.costs import model_flops_per_step
from workloads.costs.compute import host_costs
from workloads.schedules import get_schedule, min_microbatches, schedule_timing
from workloads.ops import (FSDP2_COPIES, KIND_COLLECTIVE, KIND_COMPUTE, KIND_RECV, PHASE_B, PHASE_R, Issue, Phase, is_grad_bucket,
                           is_param_gather)
from workloads.schedules.actions import ActionKind

from ..collectives import CollectiveEngine
from ..engine.invariants import InvariantError
from ..scenario import Scenario, load_scenario

__all__ = ["estimate", "Estimator", "check_estimate", "estimate_applies", "ESTIMATE_TOL"]

_ONE_CHUNK = ("gpipe", "1f1b", "zb_h1")       # the same per-action costs; only the order differs


def _fewest_microbatches_program(sc, schedule: str):
    """``sc``'s program under ``schedule`` with the fewest micro-batches it accepts (no
    more than ``sc``'s): every micro-batch of a chunk runs the same ops."""
    par = sc.parallel
    m_small = min(par.num_microbatches, max(1, min_microbatches(schedule, par.pp, par.vpp)))
    small = dataclasses.replace(par, schedule=schedule, global_batch_size=m_small * par.micro_batch_size * par.dp)
    return build_program(sc.model, small, sc.cluster.gpu, precision=sc.recipe_or_name, moe_routing="balanced",
                         seed=sc.seed, grad_reduce_dtype=sc.grad_reduce_dtype,
                         p2p_overlap=sc.overlap.get("p2p", False),
                         grad_reduce_overlap=sc.overlap.get("grad_reduce", True), host=sc.host,
                         overlap=sc.overlap, framework=sc.framework, stack_options=sc.stack_options, cp_mla_latent=sc.whatif.cp_mla_latent)


_PENDING_ISSUES = frozenset({Issue.BESIDE_NEXT, Issue.OVERLAP_NEXT, Issue.PREFETCH})
"""Issue modes of collectives that run beside the next compute op: the action pays for them
only where they outlast it."""


class Estimator:
    """Estimates for many scenarios on one cluster (keeps the collective predictions)."""

    def __init__(self, cluster, calibration=None):
        import simpy
        self.cluster = cluster
        self.coll = CollectiveEngine(simpy.Environment(), cluster, calibration)
        self._pred: dict = {}
        self._p2p: dict = {}
        self._tables: dict = {}
        self._groups: dict = {}

    def collective_s(self, groups: tuple[tuple[int, ...], ...], kind: str, size: float) -> float:
        """Time of one call of ``groups[0]`` while every group of ``groups`` makes it too
        (:meth:`~simulator.collectives.CollectiveEngine.concurrent_s`)."""
        if size <= 0 or len(groups[0]) < 2:
            return 0.0
        key = (groups, kind, size)
        t = self._pred.get(key)
        if t is None:
            t = self._pred[key] = self.coll.concurrent_s(groups, kind, size)
        return t

    def p2p_s(self, src: int, dst: int, size: float) -> float:
        """Time of one ``size``-byte transfer from GPU ``src`` to GPU ``dst`` on an idle network."""
        key = (src, dst, size)
        t = self._p2p.get(key)
        if t is None:
            t = self._p2p[key] = self.coll.uncontended_s((src, dst), "send_recv", size)
        return t

    def _stage_tables(self, sc) -> dict[int, dict]:
        """Per stage: the seconds of one micro-batch's F / B / W on each chunk, the DP
        buckets, the parameter gathers and the step-end time (cached: GPipe, 1F1B and ZB-H1
        share their tables, and so do layouts that differ only in the batch).  A stage's
        table is that of its slowest program class."""
        par = sc.parallel
        canon = "1f1b" if par.schedule in _ONE_CHUNK else par.schedule
        key = (sc.model, dataclasses.replace(par, global_batch_size=0, schedule=canon), sc.recipe_or_name,
               sc.grad_reduce_dtype, tuple(sorted(sc.overlap.items())), host_costs(sc.host), sc.host == "cuda_graphs",
               sc.framework)
        hit = self._tables.get(key)
        if hit is not None:
            return hit
        prog = _fewest_microbatches_program(sc, canon)
        gkey = (par.tp, par.cp, par.dp, par.pp, par.ep, par.expert_tp, par.expert_dp, par.mesh_order)
        per_stage: dict[int, dict] = {}
        # ZeRO-2/3 reduce every micro-batch's gradients (the program's buckets repeat per micro-batch)
        grad_mbs = prog.parallel.num_microbatches if (par.zero_stage >= 2 and par.dp * par.cp > 1) else 1
        for cls in prog.classes:
            table = self._class_table(prog.grid, cls, self._group_finder(prog.grid, gkey, cls))
            table["grad_mbs"] = grad_mbs
            cur = per_stage.get(cls.stage)
            if cur is None or table["total"] > cur["total"]:
                per_stage[cls.stage] = table
        self._tables[key] = per_stage
        return per_stage

    def _group_finder(self, grid, gkey: tuple, cls) -> Callable[[str], tuple]:
        """``kind -> groups``: the GPUs of the ``kind`` group of ``cls``'s first member and of
        the groups that make its calls with it (cached per class, and per layout and stage
        in ``self._groups``)."""
        rep, stage = cls.members[0], cls.stage
        gpu_of = grid.gpu_of
        members: dict[str, tuple[tuple[int, ...], ...]] = {}

        def group_gpus(kind):
            # the rank's group first, then the other groups of its stage that make
            # the same calls at the same time
            g = members.get(kind)
            if g is None:
                if kind in ("world", "embedding"):
                    ranks = range(grid.world_size) if kind == "world" else grid.embedding_group(rep)
                    g = (tuple(gpu_of(r) for r in ranks),)
                else:
                    own = grid.group(kind, rep)
                    peers = self._groups.get((gkey, kind, stage))
                    if peers is None:
                        peers = self._groups[(gkey, kind, stage)] = [grp for grp in grid.groups(kind)
                                                                     if grid.stage_of(grp[0]) == stage]
                    g = tuple(tuple(gpu_of(r) for r in grp) for grp in [own] + [p for p in peers if p != own])
                members[kind] = g
            return g

        return group_gpus

    def _class_table(self, grid, cls, group_gpus: Callable[[str], tuple]) -> dict:
        """One program class's table (see :meth:`_stage_tables`), from its ops: the step ops
        (micro-batch -1) give the buckets, gathers and step-end time; the ops of the first
        micro-batch on each (F | B | W, chunk) the action's seconds."""
        rep = cls.members[0]
        gpu_of = grid.gpu_of
        action = defaultdict(float)       # (kind F|B|W, chunk) -> seconds of one micro-batch
        host = defaultdict(float)         # the same, the host's time to issue it
        seen: dict[tuple[str, int], int] = {}
        pending = 0.0
        grad, gather, tail = [], [], 0.0
        for op in cls.ops:
            if op.microbatch < 0:
                if op.kind == KIND_COMPUTE:
                    tail += op.duration_s
                elif is_grad_bucket(op):
                    grad.append(self.collective_s(group_gpus(op.group), op.coll, op.size_bytes))
                elif is_param_gather(op):
                    gather.append(self.collective_s(group_gpus(op.group), op.coll, op.size_bytes))
                elif op.kind == KIND_COLLECTIVE:
                    tail += self.collective_s(group_gpus(op.group), op.coll, op.size_bytes)
                continue
            # gradient buckets and parameter gathers are step ops (micro-batch -1), above
            kind = PHASE_B if op.phase == PHASE_R else op.phase
            if op.microbatch != seen.setdefault((kind, op.chunk), op.microbatch):
                continue
            akey = (kind, op.chunk)
            host[akey] += op.host_s
            if op.kind == KIND_COMPUTE and op.name in FSDP2_COPIES:
                action[akey] += op.duration_s        # a pending gather hides behind the layer after it
            elif op.kind == KIND_COMPUTE:
                action[akey] += max(op.duration_s, pending)
                pending = 0.0
            elif op.kind == KIND_RECV:
                peer = grid.rank(pp=op.peer, **{a: v for a, v in grid.coords(rep).items() if a != "pp"})
                action[akey] += self.p2p_s(gpu_of(peer), gpu_of(rep), op.size_bytes)
            elif op.kind == KIND_COLLECTIVE:
                t = self._cp_exchange_s(op, group_gpus, gpu_of(rep))
                if t is None:
                    t = self.collective_s(group_gpus(op.group), op.coll, op.size_bytes)
                if op.issue in _PENDING_ISSUES:      # runs beside the next compute op (the stack's issue mode)
                    pending += t
                else:
                    action[akey] += t
        # a fused backward (BW): the longer of its GPU sum and its host sum (_fused_backward_s)
        bw = {c: max(action.get((PHASE_B, c), 0.0) + action.get((Phase.W, c), 0.0),
                     host.get((PHASE_B, c), 0.0) + host.get((Phase.W, c), 0.0)) for kind, c in action if kind == PHASE_B}
        for akey, h in host.items():      # the GPU cannot run ahead of the host
            action[akey] = max(action[akey], h)
        # the stack's issue modes say whether the buckets and gathers overlap anything: off the
        # data-parallel stream each one blocks (DeepSpeed without overlap_comm, ZeRO-1/2's
        # step all-gather; Megatron with grad_reduce / param_gather off)
        blocking = {name: any(pick(op) and op.issue is not Issue.DP_STREAM for op in cls.ops)
                    for name, pick in (("grad_blocking", is_grad_bucket), ("gather_blocking", is_param_gather))}
        return {"action": dict(action), "bw": bw, "grad": grad, "gather": gather, "tail": tail,
                "total": sum(action.values()), **blocking}

    def _cp_exchange_s(self, op, group_gpus, gpu: int) -> float | None:
        """A context-parallel exchange the engine runs as a sized all-to-all (tag
        ``("cp_ring", a2a, bytes)``: a ring hop to the member ``a2a`` places on;
        ``("cp_a2a", a2a, bytes)``: an all-to-all inside blocks of ``a2a`` members): its
        uncontended time (a hop: the transfer to the ring neighbour); None for any other op."""
        tag = op.tag
        if not (isinstance(tag, tuple) and tag and tag[0] in ("cp_ring", "cp_a2a")):
            return None
        own = group_gpus(op.group)[0]
        i, step = own.index(gpu), tag[1]
        if tag[0] == "cp_ring":
            return self.p2p_s(gpu, own[(i + step) % len(own)], op.size_bytes)
        b = (i // step) * step
        return self.collective_s((tuple(own[b:b + step]),), op.coll, op.size_bytes)

    def estimate(self, scenario, mem=None) -> dict:
        """The closed-form estimate of ``scenario`` (see :func:`estimate`); ``mem``: its
        :func:`workloads.memory_estimates`, when already computed."""
        sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
        if sc.cluster is not self.cluster and sc.cluster.spec != self.cluster.spec:
            raise ValueError("Estimator: the scenario's cluster is not the one this estimator was built for")
        par = sc.parallel
        m = par.num_microbatches
        per_stage = self._stage_tables(sc)
        sched = get_schedule(par.schedule)(par.pp, m, par.vpp)

        def cost(a):
            tab = per_stage[a.stage]["action"]
            if a.kind is ActionKind.FB:
                f, b = a.halves()
                return cost(f) + cost(b)
            if a.kind is ActionKind.BW:
                return _fused_backward_s(per_stage[a.stage], a.chunk)
            return tab.get((a.kind.value, a.chunk), 0.0)

        timing = schedule_timing(sched, cost)
        stage_end, exposed_dp = [], []
        for s in range(par.pp):
            st = per_stage[s]
            window = st["action"].get(("B", 0), 0.0) + st["action"].get(("W", 0), 0.0)
            k = st.get("grad_mbs", 1)
            if not st["grad"]:
                dp = 0.0
            elif st["grad_blocking"]:        # each bucket blocks where it is issued
                dp = sum(st["grad"])
            elif k > 1:            # per micro-batch: each micro-batch's buckets overlap its own backward
                one = st["grad"][:len(st["grad"]) // k]
                per = sum(one)
                dp = (m - 1) * max(0.0, per - window) + max(one[-1], per - window)
            else:
                dp = max(st["grad"][-1], sum(st["grad"]) - window)
            if st["gather_blocking"]:
                dp += sum(st["gather"])
            elif st["gather"]:     # the next step's first forward waits for the buckets it needs
                dp += max(st["gather"][0], sum(st["gather"]) - st["action"].get(("F", 0), 0.0))
            exposed_dp.append(dp)
            stage_end.append(max(timing.end[s]) + dp + st["tail"])
        step = max(stage_end)
        worst = stage_end.index(step)
        busy = timing.busy[worst]
        if mem is None:
            mem = sc.memory_estimates(par)
        peak_mem = max(e.total_bytes for e in mem)
        gpu = sc.cluster.gpu
        from workloads import get_recipe
        recipe = get_recipe(sc.precision, gpu=gpu)
        peak = gpu.peak_flops.get(recipe.peak_dtype, gpu.peak_flops["bf16"])
        model_flops = model_flops_per_step(sc.model, par.batch_size, par.seq_len or sc.model.seq_len)
        n = par.world_size
        seq = par.seq_len or sc.model.seq_len
        return {
            "step_time_s": step,
            "mfu": model_flops / (step * n * peak) if step > 0 else 0.0,
            "tokens_per_s": par.batch_size * seq / step if step > 0 else 0.0,
            "pipeline_s": max(max(e) for e in timing.end),
            "bubble_fraction": (max(timing.end[worst]) - busy) / step if step > 0 else 0.0,
            "exposed_dp_s": exposed_dp[worst],
            "peak_memory_bytes": peak_mem,
            "fits": all(e.fits() for e in mem),
        }


def _fused_backward_s(table: dict, chunk: int) -> float:
    """Seconds of one fused backward (B and W) of ``chunk`` from a stage's ``table``.  The
    engine's host issues a fused backward's ops in one run, in program order (per layer:
    recomputation, input gradients, weight gradients), so the action takes the longer of its
    GPU sum and its host sum.  Flooring each half at its own host time instead charges an
    eager host that is slower than the recompute and input-gradient kernels (attention
    backward, eager element-wise kernels, the FSDP gathers' calls) a second time during the
    weight-gradient GEMMs, which in the engine hide it: +8 to +13 % on the eager stacks at
    2k tokens, 1-5 % on the default stack's host-bound TP-8 layouts (docs/modelling.md
    "Host launch").  The rule is the engine's for every stack, so it applies to all."""
    act = table["action"]
    fused = table["bw"].get(chunk)
    if fused is None:
        return act.get(("B", chunk), 0.0) + act.get(("W", chunk), 0.0)
    return fused


def estimate(scenario, calibration=None) -> dict:
    """The closed-form estimate of one scenario (see the module docstring): step time, MFU,
    tokens/s, the pipeline's longest path, bubble fraction and exposed DP time of the
    slowest stage, peak memory and whether every stage fits.

    >>> from simulator import run
    >>> sc = {"model": "tiny-dense", "cluster": {"preset": "dgx-h100", "num_nodes": 1}, "host": "none",
    ...       "parallel": {"tp": 2, "pp": 2, "dp": 2, "global_batch_size": 8, "seq_len": 1024}}
    >>> est, sim = estimate(sc)["step_time_s"], run(sc).metrics["step_time_s"]
    >>> abs(est / sim - 1) < 0.05
    True
    """
    sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    return Estimator(sc.cluster, calibration).estimate(sc)


# -- the estimator against the engine ---------------------------------------------------------
#: The estimator's step time against the engine's, on scenarios :func:`estimate_applies` to:
#: |estimate / engine - 1| at most this (measured spread in docs/reliability.md).
ESTIMATE_TOL = 0.10
#: Zero-bubble schedules: left out of the checked domain for want of a larger sample (on the
#: 15 fuzz draws of seeds 0-3 and 12 that would otherwise be in it: ZB-H1 -0.4..+2.4 %,
#: ZB-V -0.3..+8.8 %; docs/reliability.md).
_ESTIMATE_SCHEDULES_OFF = ("zb_h1", "zb_v")


def estimate_applies(sc) -> bool:
    """Whether ``sc`` (a loaded Scenario) is one where the estimator and the engine model the
    same things: every GPU on one host (no fabric, so no flows that contend across jobs of the
    step), no data, context or expert parallelism (no gradient buckets, rings or all-to-alls
    running beside compute), no what-if, a host that launches whole graphs or costs nothing
    (``cuda_graphs`` or ``none``), no overlapped pipeline p2p and no TP communication overlap,
    and not a zero-bubble schedule.  Outside, the estimate's known gaps on small fuzz draws:
    an eager host that must wait at blocking receives and recomputation (the estimator lets
    it run ahead across actions: -16 to -22 %); overlapped p2p freeing the host to run ahead
    (+31 %); TP overlap on latency-bound toy layers (+34 %).  The zero-bubble schedules are
    left out for want of a larger sample (:data:`_ESTIMATE_SCHEDULES_OFF`)."""
    p = sc.parallel
    return (sc.cluster.num_hosts == 1 and p.dp == 1 and p.cp == 1 and p.ep == 1
            and sc.whatif.empty and sc.host in ("none", "cuda_graphs")
            and not sc.overlap.get("p2p", False) and not sc.overlap.get("tp_comm", False)
            and p.schedule not in _ESTIMATE_SCHEDULES_OFF)


def check_estimate(res) -> float | None:
    """On a scenario :func:`estimate_applies` to, the estimate's step time must lie within
    :data:`ESTIMATE_TOL` of the engine's run ``res``; returns the relative difference (None
    where the check does not apply); raises :class:`~simulator.engine.invariants.InvariantError`.
    The fuzz driver checks every draw it applies to (docs/reliability.md)."""
    sc = res.scenario
    if res.network is None or not estimate_applies(sc):     # free_comm runs have no network
        return None
    est = float(estimate(sc)["step_time_s"])
    eng = float(res.metrics["step_time_s"])
    rel = est / eng - 1.0
    if not abs(rel) <= ESTIMATE_TOL:
        raise InvariantError(f"invariant 'estimate within tolerance' broken: estimate {est:.6g} s against the "
                             f"engine's {eng:.6g} s ({rel:+.1%}; tolerance {ESTIMATE_TOL:.0%})")
    return rel
