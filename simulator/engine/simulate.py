"""`run(scenario)`: execute a training step's program on simpy over the flow network.

Rank classes and cells
----------------------
A *rank class* (:class:`workloads.program.RankClass`) is a set of ranks with the same op
list.  A *cell* (:class:`~simulator.engine.fold.Folding`) is a set of ranks that also
behave the same on the network: folding splits classes into cells wherever placement, a
what-if or routing makes members differ (``fold=False``: one cell per rank).

Actors
------
One simpy process per cell runs its class's op list once for all of its ranks.  Its
collectives are issued for every group cell its members belong to, each call counting the
cell's members in it (the arrival latch of :class:`~simulator.collectives.CollectiveEngine`
needs the whole group), so the traffic of all groups, axes and cells shares the network and
contends on its links.  Pipeline send/recv is issued per transfer cell.

Streams and overlap (docs/design.md, "Streams and overlap"; each rule an ``overlap`` switch)
--------------------------------------------------------------------------------------------
* compute ops run back to back on the compute stream;
* TP / SP, CP and EP collectives block compute until they complete (Megatron default);
  with ``tp_comm`` (Transformer Engine's userbuffer overlap) a TP collective instead runs
  while the next compute op (the GEMM block it feeds or follows) computes, and that op
  then waits for it -- an approximation of TE's chunked ring overlap.  Without it, the
  backward's re-gather of a column-parallel input (``sp_ag_input``) still runs alongside
  the next compute op (:data:`workloads.ops.TE_ASYNC`: TE issues it asynchronously and
  computes the dgrad meanwhile), and slows that op only while it is in flight;
* PP send/recv are rendezvous: a rank posts its transfers in batches where the schedule's
  implementation does (:mod:`workloads.schedules.comm`: Megatron's paired calls for 1F1B
  and interleaved 1F1B, DualPipe's per-chunk commits), and a batch completes once every
  peer has posted its side, so a slow stage holds up its neighbours; with ``p2p``
  (Megatron's ``overlap_p2p_comm``) sends do not block;
* DualPipe's F&B pairs (``fb_overlap``): the forward and backward halves run as two
  threads; compute ops take turns on the compute stream and a collective blocks only its
  own half, so one half's EP all-to-all runs while the other half computes;
* gradient buckets (``grad_*``) are issued on the DP stream without blocking when
  ``grad_reduce`` is on; the stream runs its collectives in order; the grad-norm
  all-reduce waits for all of them;
* the distributed optimizer's parameter all-gathers (``param_gather_*``, buckets in forward
  layer order) run on the DP stream after the optimizer step without blocking when
  ``param_gather`` is on; the next step's forward of a layer waits for the bucket holding
  its parameters (Megatron's forward pre-hook), any other compute for all of them;
* step-end collectives (tied embedding, grad norm) block;
* context parallelism (``parallel.cp_comm_type``): each ring-attention hop (``p2p`` and
  the ring of ``a2a+p2p``) runs while the next core-attention block computes
  (``cp_comm``: Transformer Engine posts hop i+1 before computing block i, double
  buffered); the block then waits for it.  The ``all_gather`` variant's K/V all-gather
  and dK/dV reduce-scatter and the ``a2a`` all-to-alls block, as TE runs them;
* ZeRO-3 / FSDP parameter gathers are prefetched one layer ahead (``fsdp_prefetch``): the
  gather a layer needs is issued before the preceding compute op;
* a compute op that starts while a non-blocking collective of its rank is in flight runs
  slower by :data:`COMM_SLOWDOWN` (``comm_slowdown``): NCCL's kernels take SMs, memory bandwidth and power.
  When the only collectives in flight are CP ring hops, the op is slowed only until they
  have landed (a hop is short beside the core-attention block it overlaps).

The host issues a rank's ops in program order (``scenario.host``, ``Op.host_s``): a compute
op starts no earlier than the issue of its first kernel and ends no earlier than the issue
of its last plus that kernel's share of the run time; a collective or a batch of transfers
starts no earlier than its issue.  The host runs ahead of the GPU and waits for it only
after a batch of pipeline transfers (Megatron's ``batch_p2p_sync``; not with ``overlap.p2p``),
at a host-sync op (a dropless MoE dispatcher reading its token counts: the host resumes
when the compute stream reaches the op, less the op's lag) and at the step end.  The GPU's
wait is ``host_issue`` in the breakdown.

``num_steps`` steps run back to back; the last is reported, so carry-over (parameter
gathers running into the next step) sits where it runs.  A program that cannot finish
raises :class:`DeadlockError` naming the cells and ops left waiting.

With ``free_comm=True`` every collective and transfer takes no time and sends never
block: the step is then the schedule's longest path (a test compares the two exactly).
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import simpy

from topologies import ConfigError
from workloads import build_program
from workloads.ops import (COLL_ALL_TO_ALL, KIND_COLLECTIVE, KIND_COMPUTE, KIND_HOST_SYNC,
                           KIND_SEND, PHASE_F, STREAM_COMPUTE, STREAM_PP, Group, Issue, Op, ep_a2a_matrix,
                           is_grad_bucket, is_grad_norm, is_p2p, is_step_sync)
from workloads.program import Program

ISSUE_BESIDE_NEXT, ISSUE_DP_STREAM, ISSUE_PREFETCH = Issue.BESIDE_NEXT, Issue.DP_STREAM, Issue.PREFETCH
_ALONGSIDE_NEXT = frozenset({Issue.BESIDE_NEXT, Issue.OVERLAP_NEXT})
"""Issue modes of collectives that run while the next compute op computes."""

from ..collectives import CollectiveEngine
from ..collectives.ep_dispatch import flex_compute_slowdown, flex_pair_scale
from ..network import FlowNetwork, NetworkSnapshot
from ..scenario import Scenario, WhatIf, load_scenario
from . import limits
from .fold import Folding, fold as fold_program
from .perturb import JobStopped, Perturbation

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["run", "Result", "DeadlockError", "SimulationError", "JobStopped", "TIMELINE_COLUMNS", "COMM_SLOWDOWN"]

#: Compute slowdown while a communication kernel shares the GPU, measured: Lee et al.,
#: "Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep
#: Learning" (arXiv 2507.03114, 2025) find compute kernels 18.9 % slower on average (40 %
#: at most) while NCCL collectives overlap them, on A100, H100, MI250 and MI210.  One
#: figure for every generation: the paper gives no per-GPU breakdown we could use.  (The
#: SM share alone -- 16 NCCL channels' CTAs of 132 SMs on H100 -- would give 1.14; the
#: measurement adds memory-bandwidth and power contention.)
COMM_SLOWDOWN = {"ampere": 1.189, "hopper": 1.189, "blackwell": 1.189}

TIMELINE_COLUMNS = ("rank", "node", "stream", "kind", "name", "layer", "microbatch", "chunk", "phase", "axis",
                    "start_s", "end_s", "flops", "size_bytes")


class SimulationError(RuntimeError):
    """The simulation could not produce a result (runaway, internal inconsistency)."""


class DeadlockError(SimulationError):
    """The program cannot finish: some ranks wait for ops that never come."""


@dataclass
class Result:
    """What a run returns: the timeline, the metrics, the program and the scenario."""

    timeline: "pd.DataFrame"
    """One row per executed op of each cell: :data:`TIMELINE_COLUMNS`, ``step`` and ``cell``."""
    metrics: dict
    """:func:`~simulator.engine.metrics.summarize` plus the simulator's effort (wall time, events, flows, solves, fold)."""
    program: Program
    scenario: Scenario
    step_bounds: list[tuple[float, float]]
    """(start_s, end_s) of every step."""
    waits: dict[int, list]
    """Cell -> [(start_s, end_s, axis)]: the intervals it was blocked, and on what."""
    network: "_PhysicalView | None" = None
    """The run's network seen per physical link (link bytes and busy time, snapshots)."""
    wall_time_s: float = 0.0
    memory: list = field(default_factory=list)
    """The memory model's estimate per pipeline stage (:class:`workloads.MemoryEstimate`)."""
    folding: Folding | None = None
    """The rank cells the run simulated once each (the timeline's ``cell`` column)."""
    profile: dict = field(default_factory=dict)
    """Where the wall time went, seconds: ``load`` (scenario and cluster graph, when ``run``
    loaded it), ``program``, ``fold``, ``event_loop`` (of which ``solver``: max-min
    re-solves), ``timeline_metrics``; and two counts: ``solves`` (re-solves) and
    ``solve_cache_hits`` (those answered from the network's cache of flow sets already
    solved)."""

    def rank_timeline(self, ranks=None):
        """The timeline with one row per op *per rank*: each cell's rows repeated for its
        members (``ranks``: only these), with their own ``rank`` and ``node``."""
        import pandas as pd
        tl = self.timeline
        grid, cluster = self.program.grid, self.scenario.cluster
        wanted = None if ranks is None else set(int(r) for r in ranks)
        parts = []
        for cid, members in enumerate(self.folding.cells):
            rows = tl[tl["cell"] == cid]
            for r in members:
                if wanted is not None and r not in wanted:
                    continue
                part = rows.copy()
                part["rank"] = r
                part["node"] = cluster.host_of(grid.gpu_of(r))
                parts.append(part)
        return pd.concat(parts, ignore_index=True) if parts else tl.iloc[0:0]

    def save(self, out_dir) -> None:
        """Write metrics JSON and the timeline CSV into ``out_dir``."""
        import json
        from pathlib import Path
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.json").write_text(json.dumps(self.metrics, indent=1, default=float))
        self.timeline.to_csv(out / "timeline.csv", index=False)


class _Latch:
    """Succeeds ``event`` when ``n`` callbacks have fired (no AllOf in hot paths)."""

    __slots__ = ("n", "event")

    def __init__(self, env, n):
        self.n = n
        self.event = env.event()
        if n == 0:
            self.event.succeed()

    def hit(self, _ev=None):
        self.n -= 1
        if self.n == 0:
            self.event.succeed()


class _Recorder:
    """Timeline rows as tuples (op, rank, node, stream, axis, start, end, step, cell); the
    op's own columns are filled in once, when the frame is built."""

    def __init__(self):
        self.rows: list[tuple] = []

    def add(self, rank, node, stream, op, axis, start, end, step, cid):
        self.rows.append((op, rank, node, stream, axis, start, end, step, cid))

    def frame(self):
        import pandas as pd
        rows = self.rows
        if not rows:
            return pd.DataFrame({k: [] for k in ("rank", "node", "stream", "kind", "name", "layer", "microbatch",
                                                 "chunk", "phase", "axis", "start_s", "end_s", "flops", "size_bytes",
                                                 "step", "cell")})
        # the rows, then the ops' fields, transposed in one go each (zip: no per-row Python code)
        ops, rank, node, stream, axis, start, end, step, cell = zip(*rows)
        f = dict(zip(Op._fields, zip(*ops)))
        cols = {"rank": rank, "node": node, "stream": stream, "kind": f["kind"], "name": f["name"],
                "layer": f["layer"], "microbatch": f["microbatch"], "chunk": f["chunk"], "phase": f["phase"],
                "axis": axis, "start_s": start, "end_s": end, "flops": f["flops"], "size_bytes": f["size_bytes"],
                "step": step, "cell": cell}
        return pd.DataFrame({k: list(v) for k, v in cols.items()})


_AXIS = {Group.TP: "tp", Group.SP: "tp", Group.ETP: "tp", Group.CP: "cp", Group.EP: "ep", Group.DP: "dp",
         Group.DP_CP: "dp", Group.EDP: "dp", Group.EMBEDDING: "pp", Group.WORLD: "dp", Group.TP_CP: "tp"}
"""The timeline axis (and breakdown term ``exposed_<axis>``) of a collective, by its group."""


def run(scenario, *, free_comm: bool = False, calibration=None, max_sim_time_s: float = 1e7,
        fold: "bool | Folding" = True, compute_scale: dict | None = None, whatif=None,
        progress: "bool | float" = False) -> Result:
    """Simulate ``scenario`` (a :class:`Scenario`, a mapping or a YAML path).

    ``fold`` (default) simulates each cell of interchangeable ranks once on the quotient
    network (:mod:`simulator.engine.fold`: exact); ``fold=False`` runs every rank as its own actor
    and every flow on the physical links (the reference; slow at scale).  A
    :class:`~simulator.engine.fold.Folding` is used as given, unchecked (tests use that to show a
    wrong partition gives a wrong answer).  ``compute_scale`` maps ranks to a factor on
    their compute durations (a straggler: 1.2); folding splits only the cells it touches.
    ``whatif`` (a mapping in the ``whatif:`` YAML form, or a :class:`~simulator.scenario.whatif.WhatIf`)
    replaces the scenario's what-ifs (:mod:`simulator.scenario.whatif`); a failed NIC without
    failover raises :class:`~simulator.engine.JobStopped`.  ``progress`` prints where the
    simulation is on stderr once it has run for that many seconds (True: 3), every 5 s
    after; :attr:`Result.profile` says where the wall time went.

    Eight GPUs in TP 2 x PP 2 x DP 2 fold to one cell per pipeline stage; slowing GPU 5
    splits the cells around it (here every rank shares a group or a transfer with it, or
    with a rank that does, so all eight behave differently) and slows the step:

    >>> sc = {"model": "tiny-dense", "cluster": {"preset": "dgx-h100", "num_nodes": 1}, "host": "none",
    ...       "parallel": {"tp": 2, "pp": 2, "dp": 2, "global_batch_size": 8, "seq_len": 1024}}
    >>> res = run(sc)
    >>> res.folding.cells
    [(0, 1, 2, 3), (4, 5, 6, 7)]
    >>> slow = run(sc, whatif={"slow_gpus": {5: 1.5}})
    >>> len(slow.folding.cells), slow.metrics["step_time_s"] > res.metrics["step_time_s"]
    (8, True)
    """
    with _gc_tuned():
        return _run(scenario, free_comm, calibration, max_sim_time_s, fold, compute_scale, whatif,
                    3.0 if progress is True else float(progress or 0.0))


@contextlib.contextmanager
def _gc_tuned():
    """Collect cyclic garbage less often while simulating: a run allocates millions of small
    objects (events, closures, timeline rows) that mostly die young or live to the end, and
    the default thresholds rescan the long-lived ones thousands of times (25-35 % of a
    16k-GPU run's time, measured).  The thresholds are restored afterwards."""
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], 50_000), max(old[1], 20), max(old[2], 20))
    try:
        yield
    finally:
        gc.set_threshold(*old)


def _run(scenario, free_comm, calibration, max_sim_time_s, fold, compute_scale, whatif=None,
         progress_after_s: float = 0.0) -> Result:
    t_wall = time.perf_counter()
    clock = _Clock()
    sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    clock.lap("load")
    prog = build_program(sc.model, sc.parallel, sc.cluster.gpu, precision=sc.recipe_or_name,
                         moe_routing=sc.moe_routing, seed=sc.seed, grad_reduce_dtype=sc.grad_reduce_dtype,
                         p2p_overlap=sc.overlap.get("p2p", False), moe_ep_overlap=sc.overlap.get("moe_ep_comm", False),
                         grad_reduce_overlap=sc.overlap.get("grad_reduce", True), host=sc.host,
                         overlap=sc.overlap, framework=sc.framework)
    grid = prog.grid
    scale = {int(r): float(f) for r, f in (compute_scale or {}).items()}
    for r, f in scale.items():
        if not 0 <= r < grid.world_size or not f > 0:
            raise ConfigError("compute_scale", {r: f}, f"ranks must be in [0, {grid.world_size}), factors > 0")
    # what-ifs: a perturbed cluster (links, NICs) and per-rank compute hooks and colours
    wi = WhatIf.from_dict(sc.whatif if whatif is None else whatif)
    if whatif is not None:
        wi.check(sc.cluster, grid.world_size, sc.num_steps)
    if wi.placement is not None:
        grid.placement = tuple(wi.placement)
    pert = Perturbation(wi, sc.cluster, grid.world_size, grid.gpu_of, sc.seed, sc.num_steps, scale)
    cluster = pert.cluster
    clock.lap("program")
    env = simpy.Environment()
    coll = CollectiveEngine(env, cluster, calibration)
    coll.coupled_all_to_all = "coupled_all_to_all" in sc.approximations
    colors = pert.rank_colors(grid.world_size)
    plain = all(c == (1.0,) for c in colors)
    if fold and not isinstance(fold, Folding):
        # ranks of different classes or colours never share a cell: a lower bound on the cells,
        # known before folding (per-GPU jitter: every rank its own cell); checked again after
        check_work_budget(np.unique(prog.class_of_rank).tolist() if plain else
                          [c for c, _ in {(int(prog.class_of_rank[r]), colors[r]) for r in range(grid.world_size)}],
                          prog, sc.num_steps)
    if isinstance(fold, Folding):
        folding = fold
    elif fold:
        folding = fold_program(prog, coll, network=not free_comm, rank_colors=None if plain else colors,
                               link_colors=pert.link_colors())
    else:
        folding = Folding.identity(prog, cluster)
    for c, members in enumerate(folding.cells if not plain else ()):
        if len({colors[r] for r in members}) > 1:
            raise ConfigError("fold", c, "a rank cell mixes ranks with different compute_scale or what-ifs")
    coll.set_folding(folding if folding.link_cell is not None else None)
    check_work_budget(folding.cell_class, prog, sc.num_steps)
    clock.lap("fold")
    if pert.watch and not free_comm:
        _watch_failed_nics(coll.net, folding, pert.watch)
    for gc_id, cell in enumerate(folding.group_cells):
        coll.register_group(cell.rep_gpus, group_id=gc_id, multiplicity=cell.size)
    net = _PhysicalView(coll.net, folding, coll.capacity)
    rec = _Recorder()
    n_cells = folding.num_cells

    n_steps = sc.num_steps
    step_end: list[list[float]] = [[0.0] * n_cells for _ in range(n_steps)]
    waits: dict[int, list] = {c: [] for c in range(n_cells)}
    done_flags = [False] * n_cells
    left = [n_cells]
    current: dict[int, str] = {}
    step_latch = [_Latch(env, n_cells) for _ in range(n_steps)]
    snaps = [None] * (n_steps + 1)
    snaps[0] = net.snapshot()
    for k in range(n_steps):
        step_latch[k].event.callbacks.append(lambda _e, k=k: snaps.__setitem__(k + 1, net.snapshot()))
    # p2p mailboxes for free communication (send never blocks; recv waits for the data)
    mailbox: dict = {}

    slowdown = COMM_SLOWDOWN[cluster.gpu.generation] if sc.overlap.get("comm_slowdown", True) and not free_comm else 1.0
    fb_overlap = sc.overlap.get("fb_overlap", True)
    flex = None if free_comm else _flex_dispatch(sc, prog, cluster, coll)   # (bytes scale, compute slowdown)
    # Sends are rendezvous: a batch of transfers completes once every peer has posted its side
    # (workloads.schedules.comm places the batches as Megatron-Core and DualPipe do); with
    # overlap.p2p sends never block, nor do they under a runtime that posts them asynchronously
    # (Program.async_sends: PyTorch pipelining's, for ZB-V).
    nonblocking_sends = sc.overlap.get("p2p", False) or prog.async_sends

    op_meta: dict = {}              # class id -> what the actor reads of its ops (_op_meta and flags)

    def actor(cid):
        cls = prog.classes[folding.cell_class[cid]]
        rep = folding.cells[cid][0]
        factor, jit, therm = pert.hooks(rep, cls.ops)
        node = cluster.host_of(grid.gpu_of(rep))
        # per group kind: the group cells of the members' groups, with the members in each
        groups_of: dict[str, list] = {}
        for op in cls.ops:
            if op.kind == KIND_COLLECTIVE and op.group not in groups_of:
                groups_of[op.group] = folding.groups_of[(cid, op.group)]
        per_kind = {}
        for op in cls.ops:
            if op.kind == KIND_COLLECTIVE:
                per_kind[op.group] = per_kind.get(op.group, 0) + 1
        stream_tail: dict[str, simpy.Event] = {}
        outstanding: dict[str, list] = {"grad": [], "param": []}
        inflight: list = []          # non-blocking collectives of this class (for the SM slowdown)
        flex_inflight: list = []     # flex-dispatcher all-to-alls among them (their SMs)
        overlapped: list = []        # CP K/V exchanges (and TP collectives with tp_comm) the next compute overlaps
        overlapped_axis = ["cp"]
        hop_fins: set = set()        # completion events of this class's CP ring hops in flight
        prefetched: dict = {}        # op index -> (issue time, event) of prefetched FSDP gathers
        ops = cls.ops
        n_ops = len(ops)
        first_layer = min((o.layer for o in ops if o.kind == KIND_COMPUTE and o.layer >= 0), default=0)
        # what the loop asks of each op by its name: once per class, not per op and step
        meta = op_meta.get(cls.class_id)
        if meta is None:
            meta = op_meta[cls.class_id] = (*_op_meta(cls), any(o.issue == ISSUE_PREFETCH for o in ops),
                                            [is_p2p(o) for o in ops], [is_grad_norm(o) for o in ops],
                                            [o.issue for o in ops])
        axis_of, nonblocking_of, has_fsdp, p2p_at, grad_norm_at, issue_at = meta
        pair_turns: dict = {}        # F&B pair's first op -> its collectives' order per stream (_pair_turns)

        def compute_time(op, step=0, idx=0):
            # the op's time on this rank, slower while a collective of the rank is in flight;
            # what-ifs: jitter (factor, stall) and thermal throttling (simulator.scenario.whatif)
            dur = op.duration_s * factor
            if jit is not None:
                dur = jit(dur, step, idx)
            inflight[:] = [e for e in inflight if not e.processed]
            hops = None
            if flex_inflight:
                # the flex dispatcher's kernels hold SMs (simulator.collectives.ep_dispatch): compute
                # runs on the rest, or slower still if an NCCL collective runs too
                flex_inflight[:] = [e for e in flex_inflight if not e.processed]
                nccl = slowdown != 1.0 and len(inflight) > len(flex_inflight)
                if flex_inflight and dur > 0:
                    dur *= max(flex[1], slowdown if nccl else 1.0)
                elif nccl and dur > 0:
                    dur *= slowdown
            elif slowdown != 1.0 and dur > 0 and inflight:
                if all(e in hop_fins for e in inflight):
                    hops = list(inflight)        # CP ring hops only: slowed while they last (compute())
                else:
                    dur *= slowdown
            if therm is not None:
                dur = therm(dur, step, env.now)
            return dur, hops

        hc = [0.0]                   # host cursor: when the host has issued everything so far

        def host_wait(until):
            # (callers check ``until > env.now`` first: most ops find the host ahead, and a
            # generator made for nothing costs as much as the check)
            t_h = env.now
            yield env.timeout(until - t_h)
            waits[cid].append((t_h, env.now, "host_issue"))

        def host_issue(op):
            # the host issues ops in program order; the GPU cannot start one before the host
            # has issued it (a compute op: its first kernel, its share of op.host_s)
            if op.host_s > 0.0:
                first = hc[0] + op.host_s / max(op.host_ops, 1)
                hc[0] += op.host_s
                if first > env.now:
                    yield from host_wait(first)

        def compute(op, step, idx):
            # one compute op: issued, run, and not done before its last kernel (issued at
            # the cursor) has run its share (host_issue, inline: one generator fewer per op)
            if op.host_s > 0.0:
                first = hc[0] + op.host_s / max(op.host_ops, 1)
                hc[0] += op.host_s
                if first > env.now:
                    yield from host_wait(first)
            t0 = env.now
            dur, hops = compute_time(op, step, idx)
            if hops:
                # a ring-attention hop is short beside the block it overlaps: the block runs
                # slower only while a hop is in flight, at full speed once they have landed
                left = dur
                while True:
                    live = [e for e in hops if not e.processed]
                    if not live:
                        yield env.timeout(left)
                        break
                    t = env.now
                    done = env.timeout(left * slowdown)
                    yield done | env.any_of(live)
                    if done.processed:
                        break
                    left -= (env.now - t) / slowdown
                hop_fins.difference_update([e for e in hops if e.processed])
                dur = env.now - t0
            elif dur > 0:
                yield env.timeout(dur)
            rec.add(rep, node, STREAM_COMPUTE, op, "", t0, env.now, step, cid)
            if op.host_s > 0.0:
                last = hc[0] + dur / max(op.host_ops, 1)
                if last > env.now:
                    yield from host_wait(last)

        def sizes_of(op):
            if op.coll == COLL_ALL_TO_ALL and op.tag in prog.a2a_sizes:
                sizes = prog.a2a_sizes[op.tag]            # dispatch: [src, dst] by EP coordinate
                if op.group != Group.EP:              # a CP exchange (ring hop, a2a+p2p block)
                    return sizes
                sizes = ep_a2a_matrix(op, sizes)
                # (the pair scale follows the matrix: the combine's is the dispatch's, transposed)
                return sizes if flex is None else sizes * ep_a2a_matrix(op, flex[0])
            return None

        def on_stream(op, step, seq, axis):
            # issue ``op`` without blocking, after the collectives already queued on its
            # stream; returns the event of its completion
            tail = stream_tail.get(op.stream)
            fin = env.event()
            start_box = [env.now]
            groups, sizes = groups_of[op.group], sizes_of(op)

            def launch(_e=None):
                start_box[0] = env.now
                ev = _issue(env, coll, groups, seq, op, free_comm, sizes)
                ev.callbacks.append(lambda _x: (rec.add(rep, node, op.stream, op, axis, start_box[0], env.now, step,
                                                        cid), fin.succeed()))

            if tail is not None and not tail.processed:
                tail.callbacks.append(launch)
            else:
                launch()
            stream_tail[op.stream] = fin
            return fin

        def fb_pair(step, lo, hi):
            # A DualPipe F&B pair (ops lo..hi-1): the forward half (lane 1) and the backward
            # half (lane 2) run as two threads on one GPU.  Their compute ops take turns on
            # the compute stream; a collective blocks only its own half, so the other half
            # computes meanwhile -- DeepSeek-V3's overlap of one chunk's all-to-all (and
            # TP / PP communication) with the other chunk's computation (arXiv 2412.19437,
            # §3.2.1, Fig. 4).  Collectives of both halves queue on one stream per kind.
            lanes = ([j for j in range(lo, hi) if ops[j].lane == 1], [j for j in range(lo, hi) if ops[j].lane == 2])
            pos = [0, 0]
            blocked = [None, None]       # (completion event, axis) of the collective a half waits for
            # The halves issue the collectives of one stream in a fixed order, whichever half is
            # ready first: every rank runs the same pair code, so the peers of a group make
            # their calls in the same order.  Issued in order of readiness instead, a slower
            # peer would queue its halves' calls the other way round on a shared stream, and two
            # ranks would each wait for a call the other has queued behind the one it waits for.
            turn = pair_turns.get(lo)
            if turn is None:
                turn = pair_turns[lo] = _pair_turns(ops, lanes)
            issued = dict.fromkeys(turn, 0)     # per stream: its calls issued so far

            def may_issue(j):
                o = ops[j]
                return o.kind == KIND_COMPUTE or o.kind == KIND_HOST_SYNC or turn[o.stream][issued[o.stream]] == j

            cur = 0
            while pos[0] < len(lanes[0]) or pos[1] < len(lanes[1]) or any(blocked):
                ready = [h for h in (cur, 1 - cur) if pos[h] < len(lanes[h])
                         and (blocked[h] is None or blocked[h][0].processed) and may_issue(lanes[h][pos[h]])]
                if not ready:
                    waiting = [b for b in blocked if b is not None and not b[0].processed]
                    if waiting:
                        t0 = env.now
                        first = _Latch(env, 1)
                        for ev, _axis in waiting:
                            ev.callbacks.append(first.hit)
                        yield first.event
                        waits[cid].append((t0, env.now, waiting[0][1]))
                    elif not any(blocked):      # cannot happen: _pair_turns's order is always followable
                        raise SimulationError(f"cell {cid}: the F&B pair at op {lo} cannot go on")
                    blocked = [b if b is not None and not b[0].processed else None for b in blocked]
                    continue
                h = cur = ready[0]
                blocked[h] = None
                j = lanes[h][pos[h]]
                pos[h] += 1
                op = ops[j]
                current[cid] = (step, op)
                if op.kind == KIND_COMPUTE:
                    yield from compute(op, step, j)
                    continue
                if op.kind == KIND_HOST_SYNC:
                    # one host thread drives both halves: it waits here for the compute stream
                    hc[0] = max(hc[0], env.now - op.duration_s * factor)
                    continue
                issued[op.stream] += 1
                yield from host_issue(op)
                fin = on_stream(op, step, step * per_kind[op.group] + op.seq, axis_of[j])
                inflight.append(fin)
                if flex is not None and op.coll == COLL_ALL_TO_ALL and op.group == Group.EP and op.tag in prog.a2a_sizes:
                    flex_inflight.append(fin)
                if nonblocking_of[j]:
                    outstanding["grad"].append(fin)
                else:
                    blocked[h] = (fin, axis_of[j])
                    cur = 1 - h
        for step in range(n_steps):
            i = 0
            hc[0] = max(hc[0], env.now)      # the previous step ended in a host sync (loss, grad norm)
            while i < n_ops:
                op = ops[i]
                i += 1
                current[cid] = (step, op)
                if op.lane and fb_overlap:
                    hi = i
                    while hi < n_ops and ops[hi].lane:
                        hi += 1
                    if outstanding["param"]:
                        yield from _wait(env, [e for _, e in outstanding["param"]], waits[cid], "dp")
                        outstanding["param"] = []
                    yield from fb_pair(step, i - 1, hi)
                    i = hi
                    continue
                if op.kind == KIND_COMPUTE:
                    if has_fsdp:
                        # issue the next layer's ZeRO-3 parameter gather before this compute op
                        # (not into a DualPipe F&B pair: its halves issue their own gathers)
                        j = i
                        while j < n_ops and ops[j].kind != KIND_COMPUTE and not (ops[j].lane and fb_overlap):
                            nxt = ops[j]
                            if nxt.issue == ISSUE_PREFETCH and j not in prefetched:
                                hc[0] += nxt.host_s        # the host issues it now, ahead of its turn
                                seq_j = step * per_kind[nxt.group] + nxt.seq
                                prefetched[j] = (env.now, _issue(env, coll, groups_of[nxt.group], seq_j, nxt,
                                                                free_comm))
                                inflight.append(prefetched[j][1])
                            j += 1
                    if outstanding["param"]:
                        # a forward waits for the bucket holding its layer's parameters (the
                        # embedding and output layer: the first bucket); anything else waits for all
                        if op.phase == PHASE_F:
                            layer = op.layer if op.layer >= 0 else first_layer
                            need = [e for (a, b), e in outstanding["param"] if a <= layer <= b or
                                    (op.layer < 0 and a == first_layer)]
                        else:
                            need = [e for _, e in outstanding["param"]]
                        if need:
                            yield from _wait(env, need, waits[cid], "dp")
                            outstanding["param"] = [(r, e) for r, e in outstanding["param"] if not e.processed]
                    yield from compute(op, step, i - 1)
                    if overlapped:
                        yield from _wait(env, list(overlapped), waits[cid], _AXIS.get(overlapped_axis[0], "cp"))
                        overlapped.clear()
                    continue
                if op.kind == KIND_HOST_SYNC:
                    # the host waits until the compute stream has reached this point (the
                    # preceding op, less the lag of its work that lies after the point)
                    hc[0] = max(hc[0], env.now - op.duration_s * factor)
                    continue
                if p2p_at[i - 1]:
                    # consecutive send/recv ops form one batch, as Megatron's
                    # send_forward_recv_backward: all are posted, then all are awaited
                    batch = [op]
                    while i < n_ops and p2p_at[i]:
                        batch.append(ops[i])
                        i += 1
                    yield from host_issue(op)           # one batch_isend_irecv call (its first op)
                    yield from _p2p(env, coll, folding, batch, step, rec, rep, node, cid, waits, free_comm,
                                    nonblocking_sends,
                                    mailbox)
                    if not nonblocking_sends:
                        # Megatron synchronises the device after a batch of transfers
                        # (batch_p2p_sync): the host issues the next work from here
                        hc[0] = max(hc[0], env.now)
                    continue
                axis = axis_of[i - 1]
                if (i - 1) in prefetched:
                    t_issue, ev = prefetched.pop(i - 1)
                    t_wait = env.now
                    if not ev.processed:
                        yield ev
                    rec.add(rep, node, op.stream, op, "dp", t_issue, env.now, step, cid)
                    if env.now > t_wait:
                        waits[cid].append((t_wait, env.now, "dp"))
                    continue
                if op.host_s > 0.0:         # host_issue, inline
                    t_host = hc[0] + op.host_s / max(op.host_ops, 1)
                    hc[0] += op.host_s
                    if t_host > env.now:
                        yield from host_wait(t_host)
                if overlapped and is_step_sync(op):
                    yield from _wait(env, list(overlapped), waits[cid], _AXIS.get(overlapped_axis[0], "cp"))
                    overlapped.clear()
                if grad_norm_at[i - 1]:
                    pend = outstanding["grad"]
                    if pend:
                        yield from _wait(env, pend, waits[cid], "dp")
                        outstanding["grad"] = []
                seq = step * per_kind[op.group] + op.seq
                nonblocking = nonblocking_of[i - 1]
                sizes = sizes_of(op)
                groups = groups_of[op.group]
                t_issue = env.now
                if issue_at[i - 1] in _ALONGSIDE_NEXT:
                    ev = _issue(env, coll, groups, seq, op, free_comm, sizes)
                    fin = env.event()
                    ev.callbacks.append(lambda _x, op=op, t_issue=t_issue, step=step, fin=fin, axis=axis: (
                        rec.add(rep, node, op.stream, op, axis, t_issue, env.now, step, cid), fin.succeed()))
                    overlapped.append(fin)
                    overlapped_axis[0] = op.group
                    inflight.append(fin)
                    if issue_at[i - 1] == ISSUE_BESIDE_NEXT:
                        hop_fins.add(fin)        # short beside the op it overlaps: slows it while in flight
                    continue
                if nonblocking:
                    fin = on_stream(op, step, seq, axis)
                    if is_grad_bucket(op):
                        outstanding["grad"].append(fin)
                    else:
                        outstanding["param"].append((op.tag or (-1, 1 << 30), fin))
                    inflight.append(fin)
                    continue
                ev = _issue(env, coll, groups, seq, op, free_comm, sizes)
                if not ev.processed:
                    yield ev
                rec.add(rep, node, op.stream, op, axis, t_issue, env.now, step, cid)
                if env.now > t_issue:
                    # waiting for the other members to arrive is a dependency (bubble, load
                    # imbalance); only the time after the call started is communication
                    t_start = max([t_issue] + [coll.call_start.get((g, seq), t_issue) for g, _ in groups_of[op.group]])
                    if t_start > t_issue:
                        waits[cid].append((t_issue, t_start, "bubble"))
                    if env.now > t_start:
                        waits[cid].append((t_start, env.now, axis))
            if overlapped:
                yield from _wait(env, list(overlapped), waits[cid], _AXIS.get(overlapped_axis[0], "cp"))
                overlapped.clear()
            step_end[step][cid] = env.now
            step_latch[step].hit()
        if outstanding["param"]:
            yield from _wait(env, [e for _, e in outstanding["param"]], waits[cid], "dp")
        done_flags[cid] = True
        left[0] -= 1

    for cid in range(n_cells):
        env.process(actor(cid))
    # step until every actor is done or the queue empties (simpy's run(until=T) would move the
    # clock to T even when nothing is left, hiding a deadlock behind a runaway)
    step_event = env.step
    if progress_after_s > 0 or limits.armed():
        _loop_in_chunks(env, left, max_sim_time_s, step_latch, n_cells, progress_after_s)
    while left[0] and env.peek() <= max_sim_time_s:
        step_event()
    clock.lap("event_loop")
    runaway = env.peek() != float("inf")
    if not all(done_flags):
        stuck = [f"cell {c} (ranks {m[0]}..{m[-1]}): at {_where(current.get(c))}"
                 for c, m in enumerate(folding.cells) if not done_flags[c]]
        if runaway:
            raise SimulationError(f"simulated time passed {max_sim_time_s:g} s; stuck: " + "; ".join(stuck[:4]))
        raise DeadlockError("the program cannot finish: " + "; ".join(stuck[:6])
                            + ("; pending: " + "; ".join(coll.pending()[:6]) if coll.pending() else ""))
    tl = rec.frame()
    bounds = []
    prev = 0.0
    for k in range(n_steps):
        end = max(step_end[k])
        bounds.append((prev, end))
        prev = end
    from .metrics import summarize
    res = Result(tl, {}, prog, sc, bounds, waits, net, folding=folding)
    res.memory = sc.memory_estimates()
    res.metrics = summarize(res, snaps[-2], snaps[-1])
    clock.lap("timeline_metrics")
    res.profile = clock.laps
    res.profile["solver"] = coll.net.solve_wall_s
    res.profile["solves"] = coll.net.num_solves
    res.profile["solve_cache_hits"] = coll.net.num_solve_hits
    res.wall_time_s = time.perf_counter() - t_wall
    res.metrics["wall_time_s"] = res.wall_time_s
    res.metrics["num_events"] = int(len(tl) + coll.net.num_solves)
    res.metrics["num_flows"] = int(coll.net.num_flows)
    res.metrics["num_solves"] = int(coll.net.num_solves)
    res.metrics["fold"] = dict(folding.stats)
    if sc.approximations:
        res.metrics["approximations"] = list(sc.approximations)
    return res


#: Peak memory per timeline row (one op of one simulated cell), with the events, flows and
#: wait records that go with it: 686 B, the slope of peak RSS over rows between unfolded
#: runs of Llama 3.1 405B (TP8 PP16, per-GPU jitter) on 256 and 1,024 H100 (0.54 M rows,
#: 429 MiB; 2.15 M rows, 1,483 MiB); rounded up.
ROW_BYTES = 700
#: Wall time per row on a 2-core machine: 25-35 us in those runs (per-GPU jitter, nothing
#: folds); folded runs with contended flows take up to 100 us (docs/performance.md).
ROW_SECONDS = 30e-6
_BASE_BYTES = 300 * 2**20        # the interpreter, libraries and the cluster graph of a mid-size run


def memory_budget_bytes() -> float:
    """The memory a run may plan to use: ``CLUSTERSIM_MEMORY_BUDGET_GB`` if set, else three
    quarters of this machine's physical memory."""
    env = os.environ.get("CLUSTERSIM_MEMORY_BUDGET_GB")
    if env:
        try:
            gb = float(env)
        except ValueError:
            gb = -1.0
        if not gb > 0:
            raise ConfigError("CLUSTERSIM_MEMORY_BUDGET_GB", env, "must be a positive number of GB")
        return gb * 2**30
    try:
        return 0.75 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return float("inf")


def check_work_budget(cell_classes, prog, num_steps: int) -> None:
    """Refuse, before simulating, a run whose timeline would not fit in memory: every
    simulated cell records one row per op of its class per step (:data:`ROW_BYTES` each).
    Only runs where little folds get near it -- per-GPU jitter or a straggler on thousands of
    GPUs, where every rank is its own cell."""
    per_class = [len(c.ops) for c in prog.classes]
    rows = num_steps * sum(per_class[int(c)] for c in cell_classes)
    need = _BASE_BYTES + rows * ROW_BYTES
    budget = memory_budget_bytes()
    if need > budget:
        n = len(cell_classes)
        raise ConfigError(
            "run", f"{n:,} simulated cells x {rows / max(n * num_steps, 1):,.0f} ops x {num_steps} steps",
            f"about {rows / 1e6:,.1f} M timeline rows, {need / 2**30:,.1f} GB and {rows * ROW_SECONDS / 60:,.0f} "
            f"minutes: over the memory budget of {budget / 2**30:,.1f} GB (CLUSTERSIM_MEMORY_BUDGET_GB; default "
            f"3/4 of this machine's memory). Per-GPU what-ifs (jitter, slow GPUs) keep every rank its own cell; "
            f"fewer steps, fewer GPUs, or what-ifs shared by whole groups fold")


class _Clock:
    """Wall time per phase of a run (:attr:`Result.profile`)."""

    def __init__(self):
        self.laps: dict[str, float] = {}
        self._t = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = now - self._t
        self._t = now


def _loop_in_chunks(env, left, max_sim_time_s, step_latch, n_cells, after_s) -> None:
    """The event loop in chunks of 4,096 events, between which it checks this thread's
    wall-clock limit (:mod:`.limits`) and, when ``after_s > 0``, tells stderr where it is once
    it has run ``after_s`` seconds and every 5 s after (the simulated instant, the step, the
    cells still running it, events): redrawn with ``\r`` on a terminal, as a whole line every
    30 s anywhere else.  It stops at the same event as the plain loop, which then
    finds nothing left to do."""
    import sys
    # redrawn in place on a terminal; whole lines, one every 30 s, in a log
    tty = bool(getattr(sys.stderr, "isatty", lambda: False)())
    t0 = time.perf_counter()
    next_report = t0 + after_s if after_s > 0 else float("inf")
    step_event, events, printed = env.step, 0, False
    while left[0] and env.peek() <= max_sim_time_s:
        for _ in range(4096):
            if not left[0] or env.peek() > max_sim_time_s:
                break
            step_event()
        events += 4096
        limits.check()
        now = time.perf_counter()
        if now >= next_report:
            step = next((k for k, latch in enumerate(step_latch) if not latch.event.triggered), len(step_latch) - 1)
            running = step_latch[step].n
            print(("\r" if tty else "") + f"clustersim: {now - t0:5.0f} s: simulated t = {env.now:.4g} s, step "
                  f"{step + 1} of {len(step_latch)} ({running} of {n_cells} cells still in it), ~{events:,} events",
                  end="" if tty else "\n", file=sys.stderr, flush=True)
            printed = tty
            next_report = now + (5.0 if tty else 30.0)
    if printed:
        print(file=sys.stderr, flush=True)


def _watch_failed_nics(net: FlowNetwork, folding: Folding, watch: list) -> None:
    """Stop the job (JobStopped) when a transfer needs a failed NIC (see simulator.scenario.whatif):
    the network reports transfers over the NICs' links (quotient links when folded: failed
    NIC links are coloured apart, so they form cells of their own)."""
    n = net.num_links
    owner = np.full(n, -1, dtype=np.int64)
    for k, (_name, _gpus, links, _at) in enumerate(watch):
        q = np.asarray(links) if folding.link_cell is None else folding.link_cell[np.asarray(links)]
        owner[q] = k
    at_s = min(w[3] for w in watch)

    def stop(time_s, links):
        ks = sorted({int(owner[x]) for x in links if owner[x] >= 0 and watch[int(owner[x])][3] <= time_s})
        if not ks:
            return
        name, gpus, _, _ = watch[ks[0]]
        raise JobStopped(time_s, name, gpus)

    net.watch_links(owner >= 0, at_s, stop)


class _PhysicalView:
    """The run's network seen per physical link: a folded run's quotient counters expanded
    to every member link (each carries what its quotient link carries)."""

    def __init__(self, net: FlowNetwork, folding: Folding, capacity):
        self._net = net
        self._folding = folding
        self.capacity = capacity

    def __getattr__(self, name):
        return getattr(self._net, name)

    @property
    def link_bytes(self):
        return self._folding.expand_links(self._net.link_bytes)

    @property
    def link_busy_s(self):
        return self._folding.expand_links(self._net.link_busy_s)

    @property
    def num_links(self) -> int:
        return int(self.capacity.size)

    def snapshot(self) -> NetworkSnapshot:
        s = self._net.snapshot()
        return NetworkSnapshot(s.time_s, self._folding.expand_links(s.link_bytes),
                               self._folding.expand_links(s.link_busy_s))

    tier_summary = staticmethod(FlowNetwork.tier_summary)
    utilization = staticmethod(FlowNetwork.utilization)


def _where(at) -> str:
    if at is None:
        return "start"
    step, op = at
    return f"step {step} {op.name} (layer {op.layer}, mb {op.microbatch})"


def _flex_dispatch(sc, prog, cluster, coll):
    """(per-pair bytes scale, compute slowdown) of the flex MoE dispatcher, or None
    (:mod:`simulator.collectives.ep_dispatch`): its kernels' "nodes" are NVLink domains."""
    moe = sc.model.moe
    if moe is None or moe.token_dispatcher != "flex" or sc.parallel.ep == 1:
        return None
    grid = prog.grid
    domains = np.array([cluster.domain_of(grid.gpu_of(r)) for r in grid.group("ep", 0)])
    multi = len(set(domains.tolist())) > 1
    return (flex_pair_scale(coll.cal.tier_efficiency, domains, moe.num_experts, moe.top_k),
            flex_compute_slowdown(moe, cluster.gpu.generation, multi))


def _op_meta(cls) -> tuple[list, list]:
    """Per op of a class: its timeline axis, and whether it runs on the DP stream without
    blocking (its issue mode, set by the kernel stack from the overlap switches)."""
    axes, nonblocking = [], []
    for op in cls.ops:
        axes.append(_AXIS.get(op.group, op.stream))
        nonblocking.append(op.issue == ISSUE_DP_STREAM)
    return axes, nonblocking


def _pair_turns(ops, lanes) -> dict:
    """The order in which an F&B pair's two halves (``lanes``: op indices of each) issue the
    collectives of each stream: alternately, the forward half's first, as the two threads
    take turns.  An order the halves could not both follow (a half would need a call of
    the other that comes after one it has not reached) is mended where it sticks: the
    halves are walked through it, and when neither can go on, the call that comes first
    in the program is issued next on its stream.  The result depends only on the ops, so
    every rank of a group uses the same, and some interleaving of the halves always
    follows it: the engine can never stall on it."""
    per_lane: dict = {}
    for h in (0, 1):
        for j in lanes[h]:
            if ops[j].kind != KIND_COMPUTE and ops[j].kind != KIND_HOST_SYNC:
                per_lane.setdefault(ops[j].stream, ([], []))[h].append(j)
    turn = {st: [j for pair in itertools.zip_longest(*ls) for j in pair if j is not None]
            for st, ls in per_lane.items()}
    nxt = dict.fromkeys(turn, 0)
    pos = [0, 0]
    while pos[0] < len(lanes[0]) or pos[1] < len(lanes[1]):
        moved = False
        for h in (0, 1):
            while pos[h] < len(lanes[h]):
                o = ops[lanes[h][pos[h]]]
                if o.kind != KIND_COMPUTE and o.kind != KIND_HOST_SYNC:
                    if turn[o.stream][nxt[o.stream]] != lanes[h][pos[h]]:
                        break
                    nxt[o.stream] += 1
                pos[h] += 1
                moved = True
        if not moved:
            # both halves wait for a call of the other: the earlier one in the program goes next
            h = min((h for h in (0, 1) if pos[h] < len(lanes[h])), key=lambda h: lanes[h][pos[h]])
            j = lanes[h][pos[h]]
            order = turn[ops[j].stream]
            order.remove(j)
            order.insert(nxt[ops[j].stream], j)
    return turn


def _wait(env, events, wait_log, axis):
    t0 = env.now
    latch = _Latch(env, sum(1 for e in events if not e.processed))
    for e in events:
        if not e.processed:
            e.callbacks.append(latch.hit)
    if not latch.event.processed:
        yield latch.event
    if env.now > t0:
        wait_log.append((t0, env.now, axis))


def _issue(env, coll, groups, seq, op, free_comm, sizes=None):
    """Issue ``op`` on every group cell of the class (``groups``: (cell, members in it));
    returns the completion event."""
    if free_comm or op.size_bytes <= 0:
        ev = env.event()
        ev.succeed()
        return ev
    if len(groups) == 1:
        return coll.issue(groups[0][0], seq, op.coll, op.size_bytes, count=groups[0][1], sizes=sizes)
    latch = _Latch(env, len(groups))
    for g, n in groups:
        coll.issue(g, seq, op.coll, op.size_bytes, count=n, sizes=sizes).callbacks.append(latch.hit)
    return latch.event


def _p2p(env, coll, folding, batch, step, rec, rep, node, cid, waits, free_comm, nonblocking_send, mailbox):
    t0 = env.now
    waited = []          # (op, events)
    keys = []
    for op in batch:
        evs = []
        for pc, _n in folding.p2p_of[(cid, op.peer, op.kind)]:
            cell = folding.p2p_cells[pc]
            key = (step, pc, op.tag)
            keys.append(key)
            if free_comm:
                ev = mailbox.get(key)
                if ev is None:
                    ev = mailbox[key] = env.event()
                if op.kind == KIND_SEND:
                    if not ev.triggered:
                        ev.succeed()
                else:
                    evs.append(ev)
                continue
            ev = coll.send_recv(key, cell.src_gpu, cell.dst_gpu, op.size_bytes, op.kind, multiplicity=cell.size)
            if not (op.kind == KIND_SEND and nonblocking_send):
                evs.append(ev)
        waited.append((op, evs))
    pending = [e for _, evs in waited for e in evs if not e.processed]
    if pending:
        latch = _Latch(env, len(pending))
        for e in pending:
            e.callbacks.append(latch.hit)
        yield latch.event
    for op, _ in waited:
        rec.add(rep, node, STREAM_PP, op, "pp", t0, env.now, step, cid)
    if env.now > t0:
        # waiting for the peer to post its side is a pipeline dependency (bubble); only the
        # transfer after both sides posted is pipeline communication
        starts = [coll.p2p_start.pop(key, t0) for key in keys]
        t_xfer = max([t0] + starts) if not free_comm else env.now
        if t_xfer > t0:
            waits[cid].append((t0, t_xfer, "bubble"))
        if env.now > t_xfer:
            waits[cid].append((t_xfer, env.now, "pp"))
