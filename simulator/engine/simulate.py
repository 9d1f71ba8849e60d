"""`run(scenario)`: execute a training step's program on simpy over the flow network.

Rank classes and cells
----------------------
A *rank class* (:class:`workloads.program.RankClass`) is a set of ranks with the same op
list.  A *cell* (:class:`~simulator.engine.fold.Folding`) is a set of ranks that also
behave the same on the network: folding splits classes into cells wherever placement, a
what-if or routing makes members differ (``fold=False``: one cell per rank).

Actors
------
One simpy process per cell (:class:`~simulator.engine.actor.CellActor`) runs its class's
op list once for all of its ranks, each op by its issue mode (``op.issue``, set by the kernel
stack).  Its
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
after a batch of pipeline transfers (Megatron's ``batch_p2p_sync``; not with ``overlap.p2p``,
nor under DualPipe or the zero-bubble schedules, whose runtimes only make the stream wait),
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

import dataclasses
import heapq
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import simpy

from topologies import ConfigError
from topologies.constants import DEFAULT, Constants, active, using
from workloads import build_program
from workloads.ops import Op
from workloads.program import Program, few_gc_passes

from ..collectives import CollectiveEngine
from ..collectives.ep_dispatch import flex_compute_slowdown, flex_pair_scale
from ..network import FlowNetwork, NetworkSnapshot
from ..scenario import Scenario, WhatIf, load_scenario
from . import limits
from .actor import CellActor, RunState, SimulationError, _pair_turns  # noqa: F401 (_pair_turns: re-exported)
from .fold import Folding, fold as fold_program
from .perturb import JobStopped, Perturbation

if TYPE_CHECKING:
    import pandas as pd

    from .stream import StreamRecorder

__all__ = ["run", "Result", "DeadlockError", "SimulationError", "JobStopped", "TIMELINE_COLUMNS", "COMM_SLOWDOWN"]

#: Compute slowdown while a communication kernel shares the GPU, measured: Lee et al.,
#: "Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep
#: Learning" (arXiv 2507.03114, 2025) find compute kernels 18.9 % slower on average (40 %
#: at most) while NCCL collectives overlap them, on A100, H100, MI250 and MI210.  One
#: figure for every generation: the paper gives no per-GPU breakdown we could use.  (The
#: SM share alone -- 16 NCCL channels' CTAs of 132 SMs on H100 -- would give 1.14; the
#: measurement adds memory-bandwidth and power contention.)  The documented default: a run
#: reads the value of its constants (``run(..., constants=...)``, :mod:`topologies.constants`).
COMM_SLOWDOWN = {"ampere": 1.189, "hopper": 1.189, "blackwell": 1.189}

TIMELINE_COLUMNS = ("rank", "node", "stream", "kind", "name", "layer", "microbatch", "chunk", "phase", "axis",
                    "start_s", "end_s", "flops", "size_bytes")


class DeadlockError(SimulationError):
    """The program cannot finish: some ranks wait for ops that never come."""


@dataclass
class Result:
    """What a run returns: the timeline, the metrics, the program and the scenario."""

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
    stream: "StreamRecorder | None" = None
    """Set when the timeline was streamed (``run(..., timeline="stream")``): the per-cell
    summaries the metrics came from; :attr:`timeline` then holds only the cells of the ranks
    asked for, and :attr:`waits` only those that reach into the last step."""
    _frame: "pd.DataFrame | None" = field(default=None, repr=False)
    _recorder: "_Recorder | StreamRecorder | None" = field(default=None, repr=False)

    @property
    def timeline(self) -> "pd.DataFrame":
        """One row per executed op of each cell: :data:`TIMELINE_COLUMNS`, ``step`` and ``cell``
        (built from the run's recorder when first asked for: a run that only reports its
        metrics never builds it)."""
        if self._frame is None and self._recorder is not None:
            self._frame, self._recorder = self._recorder.frame(), None
        return self._frame

    @timeline.setter
    def timeline(self, frame: "pd.DataFrame") -> None:
        self._frame, self._recorder = frame, None

    def timeline_rows(self) -> "list[tuple] | None":
        """The full timeline's rows as recorded (:class:`_Recorder`), while its frame is not
        built; None otherwise."""
        rec = self._recorder
        return rec.rows if self._frame is None and isinstance(rec, _Recorder) and rec.rows else None

    def rank_summary(self, ranks=None):
        """Per rank, its compute stream over the last step: compute, recompute, exposed
        communication per axis, host issue and bubble seconds, and when its step ended
        (:func:`simulator.engine.stream.rank_summary`); the same whether streamed or not."""
        from .stream import rank_summary
        return rank_summary(self, ranks)

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
        self.rank_summary().to_csv(out / "rank_summary.csv", index=False)


class _Recorder:
    """Timeline rows as tuples (op, rank, node, stream, axis, start, end, step, cell); the
    op's own columns are filled in once, when the frame is built."""

    def __init__(self):
        self.rows: list[tuple] = []

    def add(self, rank, node, stream, op, axis, start, end, step, cid):
        self.rows.append((op, rank, node, stream, axis, start, end, step, cid))

    def step_done(self, cid, step, now):
        """A cell ended a step (a streamed timeline drops what it no longer needs)."""

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
        return pd.DataFrame({k: list(v) if k in _TEXT_COLUMNS else _numeric_column(v) for k, v in cols.items()})


_TEXT_COLUMNS = frozenset({"stream", "kind", "name", "phase", "axis"})
_INTS = frozenset({int, np.int64})
_NUMBERS = frozenset({int, float, np.int64, np.float64})


def _numeric_column(values: tuple):
    """A timeline column for pandas: an int64 or float64 array where every value is an int,
    or a number with a float among them -- the dtype and values pandas infers from the plain
    list, without its per-element inference (half the frame's cost) -- else the list."""
    types = set(map(type, values))
    try:
        if types <= _INTS:
            return np.array(values, dtype=np.int64)
        if types <= _NUMBERS:
            return np.array(values, dtype=np.float64)
    except OverflowError:           # an int beyond int64: pandas decides
        pass
    return list(values)


def run(scenario, *, free_comm: bool = False, calibration=None, max_sim_time_s: float = 1e7,
        fold: "bool | Folding" = True, compute_scale: dict | None = None, whatif=None,
        progress: "bool | float" = False, constants: Constants | None = None, timeline: str = "auto",
        timeline_ranks=None) -> Result:
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
    after; :attr:`Result.profile` says where the wall time went.  ``constants`` (a
    :class:`~topologies.constants.Constants`; default: the active ones) are the run's
    constants: the engine reads :data:`COMM_SLOWDOWN` from them and hands them to the
    collective engine, and they are the active constants while the scenario, cluster,
    program and cost models are built (:mod:`topologies.constants`).

    ``timeline``: ``"full"`` records a row per op of every cell (:attr:`Result.timeline`);
    ``"stream"`` keeps full rows only for the cells holding ``timeline_ranks`` and per-cell
    summaries of the rest (:mod:`simulator.engine.stream`: the metrics and
    :meth:`Result.rank_summary` are bit for bit those of the full timeline); ``"auto"``
    (default) streams only when the full timeline would not fit the memory budget
    (:func:`check_work_budget`).

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
    constants = active() if constants is None else constants
    with few_gc_passes(), using(constants):   # (the run's events, closures and rows)
        return _run(scenario, free_comm, calibration, max_sim_time_s, fold, compute_scale, whatif,
                    3.0 if progress is True else float(progress or 0.0), constants,
                    _TimelineSpec(timeline, timeline_ranks))


def _run(scenario, free_comm, calibration, max_sim_time_s, fold, compute_scale, whatif=None,
         progress_after_s: float = 0.0, constants: Constants = DEFAULT, spec: "_TimelineSpec | None" = None) -> Result:
    t_wall = time.perf_counter()
    clock = _Clock()
    sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    clock.lap("load")
    prog, pert = _program(sc, compute_scale, whatif)
    if whatif is not None:              # the summary and the result describe the what-ifs run
        sc = dataclasses.replace(sc, whatif=pert.wi)
    clock.lap("program")
    env = simpy.Environment()
    coll = CollectiveEngine(env, pert.cluster, calibration, constants=constants)
    coll.coupled_all_to_all = "coupled_all_to_all" in sc.approximations
    spec = spec or _TimelineSpec()
    spec.check(prog.grid.world_size)
    folding = _folding(sc, prog, pert, coll, fold, free_comm, spec)
    clock.lap("fold")
    state = _state(sc, prog, pert, coll, folding, free_comm, constants, spec)
    _loop(state, max_sim_time_s, progress_after_s)
    clock.lap("event_loop")
    return _result(state, sc, clock, t_wall)


def _program(sc, compute_scale, whatif):
    """The scenario's program, and the perturbation of its what-ifs and ``compute_scale``."""
    wi = WhatIf.from_dict(sc.whatif if whatif is None else whatif)
    prog = build_program(sc.model, sc.parallel, sc.cluster.gpu, precision=sc.recipe_or_name,
                         moe_routing=sc.moe_routing, seed=sc.seed, grad_reduce_dtype=sc.grad_reduce_dtype,
                         p2p_overlap=sc.overlap.get("p2p", False), moe_ep_overlap=sc.overlap.get("moe_ep_comm", False),
                         grad_reduce_overlap=sc.overlap.get("grad_reduce", True), host=sc.host,
                         overlap=sc.overlap, framework=sc.framework, stack_options=sc.stack_options, cp_mla_latent=wi.cp_mla_latent)
    grid = prog.grid
    scale = {int(r): float(f) for r, f in (compute_scale or {}).items()}
    for r, f in scale.items():
        if not 0 <= r < grid.world_size or not f > 0:
            raise ConfigError("compute_scale", {r: f}, f"ranks must be in [0, {grid.world_size}), factors > 0")
    # what-ifs: a perturbed cluster (links, NICs) and per-rank compute hooks and colours
    if whatif is not None:
        wi.check(sc.cluster, grid.world_size, sc.num_steps)
    if wi.placement is not None:
        grid.placement = tuple(wi.placement)
    return prog, Perturbation(wi, sc.cluster, grid.world_size, grid.gpu_of, sc.seed, sc.num_steps, scale)


def _folding(sc, prog, pert, coll, fold, free_comm, spec: "_TimelineSpec | None" = None) -> Folding:
    """The rank cells (``fold``: a :class:`Folding` as given, True: folded, False: one per
    rank), checked against the work budget (which settles ``spec.stream``), and the
    collectives' groups registered."""
    grid, spec = prog.grid, spec or _TimelineSpec()
    colors = pert.rank_colors(grid.world_size)
    plain = all(c == (1.0,) for c in colors)
    if fold and not isinstance(fold, Folding):
        # ranks of different classes or colours never share a cell: a lower bound on the cells,
        # known before folding (per-GPU jitter: every rank its own cell); checked again after
        check_work_budget(np.unique(prog.class_of_rank).tolist() if plain else
                          [c for c, _ in {(int(prog.class_of_rank[r]), colors[r]) for r in range(grid.world_size)}],
                          prog, sc.num_steps, spec.mode)
    if isinstance(fold, Folding):
        folding = fold
    elif fold:
        folding = fold_program(prog, coll, network=not free_comm, rank_colors=None if plain else colors,
                               link_colors=pert.link_colors())
    else:
        folding = Folding.identity(prog, pert.cluster)
    for c, members in enumerate(folding.cells if not plain else ()):
        if len({colors[r] for r in members}) > 1:
            raise ConfigError("fold", c, "a rank cell mixes ranks with different compute_scale or what-ifs")
    coll.set_folding(folding if folding.link_cell is not None else None)
    keep = spec.cells(folding)
    spec.stream = check_work_budget(folding.cell_class, prog, sc.num_steps, spec.mode,
                                    [folding.cell_class[c] for c in keep])
    return folding


def _state(sc, prog, pert, coll, folding, free_comm, constants: Constants = DEFAULT,
           spec: "_TimelineSpec | None" = None) -> RunState:
    """The run's shared state, a :class:`CellActor` process per cell, and the network
    snapshots taken as each step ends."""
    cluster = pert.cluster
    if pert.watch and not free_comm:
        # (``state``, bound below, before anything runs)
        _watch_failed_nics(coll.net, folding, pert.watch, lambda exc: state.stop(exc))
    for gc_id, cell in enumerate(folding.group_cells):
        coll.register_group(cell.rep_gpus, group_id=gc_id, multiplicity=cell.size)
    slowdown = (constants.get("simulator.engine.simulate.COMM_SLOWDOWN")[cluster.gpu.generation]
                if sc.overlap.get("comm_slowdown", True) and not free_comm else 1.0)
    # Sends are rendezvous: a batch of transfers completes once every peer has posted its side
    # (workloads.schedules.comm places the batches as Megatron-Core and DualPipe do); with
    # overlap.p2p sends never block, nor do they under a runtime that posts them asynchronously
    # (Program.async_sends: the zero-bubble schedules').  The host waits for the device after
    # a waited-for batch only under Megatron's batch_p2p_sync (Program.host_waits_for_p2p).
    nonblocking = sc.overlap.get("p2p", False) or prog.async_sends
    state = RunState(coll.env, coll, prog, folding, pert, cluster, _Recorder(), sc.num_steps, free_comm=free_comm,
                     slowdown=slowdown, flex=None if free_comm else _flex_dispatch(sc, prog, cluster, coll),
                     fb_overlap=sc.overlap.get("fb_overlap", True),
                     nonblocking_sends=nonblocking,
                     p2p_host_sync=not nonblocking and prog.host_waits_for_p2p)
    if spec is not None and spec.stream:
        from .stream import StreamRecorder
        state.rec = StreamRecorder([len(m) for m in folding.cells], sc.num_steps, spec.cells(folding), state.waits)
        coll.keep_records = False
    net = state.net = _PhysicalView(coll.net, folding, coll.capacity)
    snaps = state.snaps = [None] * (sc.num_steps + 1)
    snaps[0] = net.snapshot()
    for k, latch in enumerate(state.step_latch):
        latch.event.callbacks.append(lambda _e, k=k: snaps.__setitem__(k + 1, net.snapshot()))
    state.procs = [coll.env.process(CellActor(state, cid).run()) for cid in range(folding.num_cells)]
    return state


def _loop(state: RunState, max_sim_time_s: float, progress_after_s: float) -> None:
    """Step until every actor is done or stopped, or the queue empties (simpy's run(until=T)
    would move the clock to T even when nothing is left, hiding a deadlock behind a runaway);
    raise the :class:`JobStopped` that stopped the job (:meth:`RunState.stop`), or
    :class:`DeadlockError` or :class:`SimulationError` if some cell did not finish."""
    env = state.env
    if progress_after_s > 0 or limits.armed():
        _loop_in_chunks(env, state, max_sim_time_s, progress_after_s)
    _steps(env, state, max_sim_time_s, -1)
    if state.stopped is not None:
        exc = state.stopped
        if isinstance(exc, JobStopped):
            exc.steps_completed = min((step for step, _op in state.stopped_at.values()), default=state.n_steps)
            exc.num_steps = state.n_steps
        raise exc
    if all(state.done_flags):
        return
    runaway = env.peek() != float("inf")
    stuck = [f"cell {c} (ranks {m[0]}..{m[-1]}): at {_where(state.current.get(c))}"
             for c, m in enumerate(state.folding.cells) if not state.done_flags[c]]
    if runaway:
        raise SimulationError(f"simulated time passed {max_sim_time_s:g} s; stuck: " + "; ".join(stuck[:4]))
    pending = state.coll.pending()
    raise DeadlockError("the program cannot finish: " + "; ".join(stuck[:6])
                        + ("; pending: " + "; ".join(pending[:6]) if pending else ""))


def _result(state: RunState, sc, clock, t_wall) -> Result:
    """The :class:`Result`: the timeline, the step bounds, the metrics and the profile."""
    from .metrics import summarize
    coll, folding = state.coll, state.folding
    bounds, prev = [], 0.0
    for k in range(state.n_steps):
        end = max(state.step_end[k])
        bounds.append((prev, end))
        prev = end
    res = Result({}, state.prog, sc, bounds, state.waits, state.net, folding=folding, _recorder=state.rec)
    if not isinstance(state.rec, _Recorder):
        res.stream = state.rec
    res.memory = sc.memory_estimates()
    res.metrics = summarize(res, state.snaps[-2], state.snaps[-1])
    clock.lap("timeline_metrics")
    res.profile = clock.laps
    res.profile["solver"] = coll.net.solve_wall_s
    res.profile["solves"] = coll.net.num_solves
    res.profile["solve_cache_hits"] = coll.net.num_solve_hits
    res.wall_time_s = time.perf_counter() - t_wall
    m = res.metrics
    m["wall_time_s"] = res.wall_time_s
    m["num_events"] = int((len(state.rec.rows) if res.stream is None else res.stream.n_rows) + coll.net.num_solves)
    m["num_flows"] = int(coll.net.num_flows)
    m["num_solves"] = int(coll.net.num_solves)
    m["fold"] = dict(folding.stats)
    if sc.approximations:
        m["approximations"] = list(sc.approximations)
    return res


#: Peak memory per timeline row (one op of one simulated cell), with the events, flows and
#: wait records that go with it: 686 B, the slope of peak RSS over rows between unfolded
#: runs of Llama 3.1 405B (TP8 PP16, per-GPU jitter) on 256 and 1,024 H100 (0.54 M rows,
#: 429 MiB; 2.15 M rows, 1,483 MiB); 790 B measured again with 16 micro-batches per
#: pipeline (1.08 M rows, 981-991 MiB; 4.30 M rows, 3,413 MiB; pandas 3); rounded up.
ROW_BYTES = 800
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


#: Peak memory per timeline row when the timeline is streamed (:mod:`.stream`): the events,
#: flows and waits still live, the summaries kept and the collectives' start times: 53.5 B,
#: the slope of peak RSS between the streamed runs of the jobs of :data:`ROW_BYTES` (1.08 M
#: rows, 142.0-142.4 MiB; 4.30 M rows, 306.8 MiB); rounded up.
STREAM_ROW_BYTES = 60


def check_work_budget(cell_classes, prog, num_steps: int, mode: str = "full", kept_classes=()) -> bool:
    """Whether to stream the timeline (``mode``: "full", "stream" or "auto", see :func:`run`);
    refuse, before simulating, a run that would not fit in memory: every simulated cell
    records one row per op of its class per step, :data:`ROW_BYTES` each kept in full
    (``mode="full"``, or ``kept_classes``: the classes of the cells kept in full when
    streamed), :data:`STREAM_ROW_BYTES` each streamed.  Only runs where little folds get
    near it -- per-GPU jitter or a straggler on thousands of GPUs, where every rank is its
    own cell."""
    per_class = [len(c.ops) for c in prog.classes]
    rows = num_steps * sum(per_class[int(c)] for c in cell_classes)
    kept = num_steps * sum(per_class[int(c)] for c in kept_classes)
    full = _BASE_BYTES + rows * ROW_BYTES
    budget = memory_budget_bytes()
    if mode == "full" or (mode == "auto" and full <= budget):
        if full > budget:
            _refuse(len(cell_classes), rows, num_steps, full, budget, "")
        return False
    need = _BASE_BYTES + rows * STREAM_ROW_BYTES + kept * ROW_BYTES
    if need > budget:
        _refuse(len(cell_classes), rows, num_steps, need, budget, f" streamed, {kept / 1e6:,.1f} M of them kept")
    return True


def _refuse(n: int, rows: int, num_steps: int, need: float, budget: float, how: str) -> None:
    raise ConfigError(
        "run", f"{n:,} simulated cells x {rows / max(n * num_steps, 1):,.0f} ops x {num_steps} steps",
        f"about {rows / 1e6:,.1f} M timeline rows{how}, {need / 2**30:,.1f} GB and {rows * ROW_SECONDS / 60:,.0f} "
        f"minutes: over the memory budget of {budget / 2**30:,.1f} GB (CLUSTERSIM_MEMORY_BUDGET_GB; default "
        f"3/4 of this machine's memory). Per-GPU what-ifs (jitter, slow GPUs) keep every rank its own cell; "
        f"fewer steps, fewer GPUs, or what-ifs shared by whole groups fold")


class _TimelineSpec:
    """What the run records (:func:`run`'s ``timeline`` and ``timeline_ranks``); ``stream``
    is settled against the memory budget once the cells are known."""

    MODES = ("auto", "full", "stream")

    def __init__(self, mode: str = "auto", ranks=None):
        if mode not in self.MODES:
            raise ConfigError("timeline", mode, f"must be one of {', '.join(self.MODES)}")
        self.mode = mode
        self.ranks = None if ranks is None else sorted({int(r) for r in ranks})
        self.stream = False

    def check(self, world_size: int) -> None:
        bad = [r for r in self.ranks or () if not 0 <= r < world_size]
        if bad:
            raise ConfigError("timeline_ranks", bad[0], f"must be a rank in [0, {world_size})")

    def cells(self, folding: Folding) -> list[int]:
        """The cells kept in full when streamed: those holding a rank asked for."""
        wanted = set(self.ranks or ())
        return [c for c, members in enumerate(folding.cells) if wanted.intersection(members)]


class _Clock:
    """Wall time per phase of a run (:attr:`Result.profile`)."""

    def __init__(self):
        self.laps: dict[str, float] = {}
        self._t = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = now - self._t
        self._t = now


def _steps(env: simpy.Environment, state: RunState, max_sim_time_s: float, limit: int) -> None:
    """simpy's ``Environment.step`` (simpy 4), inlined, while cells are left and the next
    event is not past ``max_sim_time_s``, at most ``limit`` times (-1: no limit).  Runs
    take millions of steps, and the call and ``peek`` per step were a few percent of them."""
    queue, pop = env._queue, heapq.heappop
    while limit and state.left:
        if not queue:
            if max_sim_time_s == float("inf"):
                env.step()          # raises simpy's EmptySchedule, as the plain loop did
            return
        if queue[0][0] > max_sim_time_s:
            return
        limit -= 1
        env._now, _, _, event = pop(queue)
        callbacks, event.callbacks = event.callbacks, None
        for callback in callbacks:
            callback(event)
        if not event._ok and not hasattr(event, "_defused"):
            exc = type(event._value)(*event._value.args)        # as simpy: a failed event nobody handled
            exc.__cause__ = event._value
            raise exc


def _loop_in_chunks(env, state, max_sim_time_s, after_s) -> None:
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
    events, printed = 0, False
    step_latch, n_cells = state.step_latch, len(state.done_flags)
    while state.left and env.peek() <= max_sim_time_s:
        _steps(env, state, max_sim_time_s, 4096)
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


def _watch_failed_nics(net: FlowNetwork, folding: Folding, watch: list, on_stop) -> None:
    """Stop the job (``on_stop(JobStopped)``: :meth:`RunState.stop`) when a transfer needs a
    failed NIC (see simulator.scenario.whatif): the network reports transfers over the NICs'
    links (quotient links when folded: failed NIC links are coloured apart, so they form
    cells of their own)."""
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
        on_stop(JobStopped(time_s, name, gpus))

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
