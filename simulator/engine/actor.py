"""The cell actor: one simpy process per rank cell, running its class's op list.

:class:`CellActor` holds a cell's state by name (the host cursor, the collectives in
flight, the exchanges the next compute op overlaps, the buckets outstanding on the DP
stream) and runs its ops through a table: each op of a class gets, once per class
(:class:`ClassPlan`), the method that runs it -- by kind for compute ops, host syncs,
pipeline batches and DualPipe F&B pairs, and for a collective by its issue mode
(:class:`workloads.ops.Issue`, set by the kernel stack), :data:`ISSUE_HANDLERS`.  The
actor never re-derives how an op is issued from its name or the overlap switches.

The rules it implements are those of :mod:`simulator.engine.simulate` (its docstring,
"Streams and overlap"); :class:`RunState` is what the cells of one run share.
"""

from __future__ import annotations

import itertools

import simpy

from simulator.network.flows import next_now, succeed_in_order
from workloads.ops import (COLL_ALL_TO_ALL, FSDP2_COPIES, KIND_COLLECTIVE, KIND_COMPUTE, KIND_HOST_SYNC, KIND_SEND, PHASE_F, STREAM_COMPUTE,
                           STREAM_PP, Group, Issue, ep_a2a_matrix, is_grad_bucket, is_grad_norm, is_p2p,
                           is_step_sync)

__all__ = ["CellActor", "ClassPlan", "RunState", "ISSUE_HANDLERS", "issue_modes", "AXIS"]


class SimulationError(RuntimeError):
    """The simulation could not produce a result (runaway, internal inconsistency)."""


AXIS = {Group.TP: "tp", Group.SP: "tp", Group.ETP: "tp", Group.CP: "cp", Group.EP: "ep", Group.DP: "dp",
        Group.DP_CP: "dp", Group.EDP: "dp", Group.EMBEDDING: "pp", Group.WORLD: "dp", Group.TP_CP: "tp"}
"""The timeline axis (and breakdown term ``exposed_<axis>``) of a collective, by its group."""


class _Latch:
    """Succeeds ``event`` when ``n`` hits have come (no AllOf in hot paths): calls of
    :meth:`hit`, or the processing of the events given to :meth:`on`."""

    __slots__ = ("n", "event", "env", "waits")

    def __init__(self, env, n):
        self.n = n
        self.env = env
        self.event = env.event()
        self.waits = []
        """(event, its callback list) per :meth:`on`."""
        if n == 0:
            self.event.succeed()

    def hit(self, _ev=None):
        # (a plain succeed: the step latch's hit comes from a cell's process, which goes on)
        self.n -= 1
        if self.n == 0:
            self.event.succeed()

    def on(self, ev) -> None:
        """Hit when ``ev`` (not processed yet) is processed."""
        cbs = ev.callbacks
        cbs.append(self._on_done)
        self.waits.append((ev, cbs))

    def _on_done(self, ev) -> None:
        # ``ev``'s callback (:meth:`on`).  The latch's event is a relay: if this is the last
        # callback of ``ev``'s list (the list simpy is running, the one :meth:`on` appended
        # to), nothing runs after it in ``ev``'s processing, which is itself the last act of
        # the processing of the event being processed (a heap event, or one processed in
        # order by :func:`succeed_in_order`, whose callers do nothing after), so it succeeds
        # in order.  (The hit that brings ``n`` to 0 is the last of the hits on ``ev`` in its
        # list; the events given to :meth:`on` of one latch are distinct, or, where one can
        # come twice -- a transfer a cell both sends and receives -- counted twice.)
        self.n -= 1
        if self.n == 0:
            waits, self.waits = self.waits, None      # (a reference cycle through the lists: dropped)
            for e, cbs in waits:
                if e is ev:
                    if cbs[-1] == self._on_done:
                        succeed_in_order(self.env, self.event)
                        return
                    break
            self.event.succeed()


class _FirstOf:
    """``env.timeout(delay) | env.any_of(events)`` (``events`` not processed yet), as simpy's
    conditions run it -- the same events scheduled at the same points -- less the relays
    that provably change nothing.  In simpy the first event of ``events`` processed
    schedules the AnyOf A; A's processing schedules the Condition C (unless the timeout
    came first); C's processing resumes the waiting process.  Or the timeout D's processing
    schedules C.  Here :attr:`event` is C (what the process yields), A is scheduled only
    when it is not the next event popped anyway, and each relay that is the last act of
    an event's processing succeeds in order (:func:`succeed_in_order`): A's and D's sole
    callbacks are private, and a hop's completion is checked to be the last callback of
    its list.  Once A or C is triggered the callbacks on the events are dropped, as
    simpy drops its checks when it processes them: before that they only do nothing, or
    trigger an A nothing waits for."""

    __slots__ = ("env", "events", "lists", "event", "timed_out", "a_fired", "c_fired")

    def __init__(self, env, delay, events):
        if delay < 0:
            raise ValueError(f"Negative delay {delay}")      # (as env.timeout)
        self.env = env
        d = simpy.Event(env)                # D, scheduled as env.timeout(delay) is
        d._ok, d._value = True, None
        d.callbacks.append(self._timer)
        env.schedule(d, simpy.core.NORMAL, delay)
        self.events = events
        self.lists = lists = [e.callbacks for e in events]
        for cbs in lists:
            cbs.append(self._hit)
        self.event = simpy.Event(env)       # C
        self.timed_out = False
        """Whether D has been processed (``done.processed``)."""
        self.a_fired = self.c_fired = False
        """Whether A, C have been triggered."""

    def _unhook(self) -> None:
        # (not from a list simpy is running: that of an event being processed is None)
        for e in self.events:
            cbs = e.callbacks
            if cbs is not None and self._hit in cbs:
                cbs.remove(self._hit)

    def _hit(self, ev) -> None:
        # A's check, on ``ev``'s processing (once C is triggered, A would be triggered for
        # nothing: no callback waits for it any more)
        if self.a_fired or self.c_fired:
            return
        self.a_fired = True
        self._unhook()
        env = self.env
        lists, self.lists = self.lists, None          # (a reference cycle: dropped once used)
        for e, cbs in zip(self.events, lists):
            if e is ev:
                if cbs[-1] == self._hit and next_now(env):
                    self._a_done()          # A's processing, in order
                    return
                break
        a = simpy.Event(env)
        a.callbacks.append(self._a_done)
        a.succeed()

    def _a_done(self, _a=None) -> None:
        # A's processing (its sole callback): C succeeds, last, unless D triggered it first
        if not self.c_fired:
            self.c_fired = True
            succeed_in_order(self.env, self.event)

    def _timer(self, _d) -> None:
        # D's processing (its sole callback)
        self.timed_out = True
        if not self.c_fired:
            self.c_fired = True
            self._unhook()
            self.lists = None
            succeed_in_order(self.env, self.event)


def _wait(env, events, wait_log, axis, last=False):
    """Wait for ``events``.  ``last``: the process runs as the last act of the processing of
    the event that resumed it (a private event whose sole callback is its resume, processed
    from the heap or in order), so when every event is done already and the latch's event
    would be the next one popped (:func:`next_now`), the process goes on at once, as it
    would when that event is processed: nothing runs in between."""
    t0 = env.now
    if last and next_now(env):
        for e in events:
            if not e.processed:
                break
        else:
            return
    latch = _Latch(env, sum(1 for e in events if not e.processed))
    for e in events:
        if not e.processed:
            latch.on(e)
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
        latch.on(coll.issue(g, seq, op.coll, op.size_bytes, count=n, sizes=sizes))
    return latch.event


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


class RunState:
    """What the cells of one run share: the simulation, the network's collectives, the
    folding, the recorder and the per-cell books, and the run's switches."""

    def __init__(self, env, coll, prog, folding, pert, cluster, rec, n_steps, *, free_comm, slowdown, flex,
                 fb_overlap, nonblocking_sends, p2p_host_sync):
        self.env, self.coll, self.prog, self.folding = env, coll, prog, folding
        self.pert, self.cluster, self.rec, self.n_steps = pert, cluster, rec, n_steps
        self.free_comm = free_comm
        self.slowdown = slowdown
        """Compute slowdown while a non-blocking collective is in flight (1.0: none)."""
        self.flex = flex
        """(per-pair bytes scale, compute slowdown) of the flex MoE dispatcher, or None."""
        self.fb_overlap = fb_overlap
        self.nonblocking_sends = nonblocking_sends
        self.p2p_host_sync = p2p_host_sync
        """Whether the host waits for the device after each batch of transfers."""
        n = folding.num_cells
        self.left = n
        """Cells still running."""
        self.done_flags = [False] * n
        self.current: dict = {}
        """Cell -> (step, op) it is at (for a deadlock's message)."""
        self.waits: dict[int, list] = {c: [] for c in range(n)}
        self.step_end: list[list[float]] = [[0.0] * n for _ in range(n_steps)]
        self.step_latch = [_Latch(env, n) for _ in range(n_steps)]
        self.mailbox: dict = {}
        """P2P mailboxes for free communication (a send never blocks; a recv waits for the data)."""
        self.plans: dict = {}
        """Class id -> its :class:`ClassPlan`."""
        self.net = None
        """The run's network per physical link (set by the run)."""
        self.snaps: list = []
        """Network snapshots: the start, then as each step ends."""
        self.procs: list = []
        """Cell -> its simpy process."""
        self.stopped = None
        """The exception that stopped the job (:meth:`stop`), or None."""
        self.stopped_at: dict = {}
        """Cell -> (step, op) where :meth:`stop` interrupted it."""

    def stop(self, exc: BaseException) -> None:
        """Stop the job (a failed NIC a transfer needs: :class:`~simulator.engine.JobStopped`):
        every cell's process still running is interrupted, at this instant, with ``exc`` as
        the cause; the run then raises ``exc`` (the first, if several come).  The interrupts
        go out from an event of their own: a network callback may run inside a cell's
        process, which simpy does not let interrupt itself."""
        if self.stopped is not None:
            return
        self.stopped = exc

        def interrupt(_e):
            for p in self.procs:
                if p.is_alive:
                    p.interrupt(exc)

        ev = self.env.event()
        ev.callbacks.append(interrupt)
        ev.succeed()

    def plan(self, cls) -> "ClassPlan":
        p = self.plans.get(cls.class_id)
        if p is None:
            p = self.plans[cls.class_id] = ClassPlan(cls.ops, self.fb_overlap, self.flex is not None,
                                                     self.prog.a2a_sizes)
        return p


def issue_modes(ops, fb_overlap: bool = True) -> list:
    """How the engine runs each op of a class: the name of the :class:`CellActor` method, by
    kind for compute, host sync, pipeline transfers and F&B pairs, and for a collective the
    :data:`ISSUE_HANDLERS` entry of its ``op.issue``; None for an op run by the batch or pair
    its first op starts."""
    return [f.__name__ if f is not None else None for f in ClassPlan(ops, fb_overlap, False, {}).handler_at]


class ClassPlan:
    """What the actor reads of a class's ops, worked out once per class: per op its handler
    (:class:`CellActor` method), the index of the op after it (after a whole pipeline batch
    or F&B pair) and its flags."""

    def __init__(self, ops, fb_overlap: bool, flex: bool, a2a_sizes):
        n = len(ops)
        self.axis_of = [AXIS.get(op.group, op.stream) for op in ops]
        self.issue_at = [op.issue for op in ops]
        self.grad_norm_at = [is_grad_norm(o) for o in ops]
        self.grad_bucket_at = [is_grad_bucket(o) for o in ops]
        # a collective's waits before it is issued: the overlapped exchanges (step-end
        # collectives), the gradient buckets (the grad-norm all-reduce)
        self.step_sync_at = [is_step_sync(o) for o in ops]
        self.prep_at = [s or g for s, g in zip(self.step_sync_at, self.grad_norm_at)]
        self.flex_a2a_at = [flex and o.coll == COLL_ALL_TO_ALL and o.group == Group.EP and o.tag in a2a_sizes
                            for o in ops]
        self.per_kind = _per_kind(ops)
        self.first_layer = min((o.layer for o in ops if o.kind == KIND_COMPUTE and o.layer >= 0), default=0)
        self.handler_at: list = [None] * n
        self.next_at = list(range(1, n + 1))
        self.prefetch_after: list = [()] * n
        has_fsdp = any(o.issue == Issue.PREFETCH for o in ops)
        i = 0
        while i < n:
            op = ops[i]
            if op.lane and fb_overlap:
                hi = i + 1
                while hi < n and ops[hi].lane:
                    hi += 1
                self.handler_at[i], self.next_at[i] = CellActor._fb_pair, hi
                i = hi
                continue
            if op.kind == KIND_COMPUTE:
                self.handler_at[i] = CellActor._compute_op
                if has_fsdp:
                    # the ZeRO-3 gathers issued before this compute op (not into an F&B pair), looking
                    # past FSDP2's copies (workloads.ops.FSDP2_COPIES) to the layer after them
                    j, pre = i + 1, []
                    while j < n and (ops[j].kind != KIND_COMPUTE or ops[j].name in FSDP2_COPIES) \
                            and not (ops[j].lane and fb_overlap):
                        if ops[j].issue == Issue.PREFETCH:
                            pre.append(j)
                        j += 1
                    self.prefetch_after[i] = tuple(pre)
            elif op.kind == KIND_HOST_SYNC:
                self.handler_at[i] = CellActor._host_sync
            elif is_p2p(op):
                # consecutive send/recv ops form one batch, as Megatron's send_forward_recv_backward
                hi = i + 1
                while hi < n and is_p2p(ops[hi]):
                    hi += 1
                self.handler_at[i], self.next_at[i] = CellActor._p2p_batch, hi
                i = hi
                continue
            else:
                self.handler_at[i] = ISSUE_HANDLERS[op.issue]
            i += 1


def _per_kind(ops) -> dict:
    """Collectives per group kind in one step (a collective's sequence number is per step)."""
    per_kind: dict = {}
    for op in ops:
        if op.kind == KIND_COLLECTIVE:
            per_kind[op.group] = per_kind.get(op.group, 0) + 1
    return per_kind


class _StreamCall:
    """A collective queued on a stream behind the calls before it (:meth:`CellActor._on_stream`)."""

    __slots__ = ("actor", "op", "step", "seq", "axis", "groups", "sizes", "fin", "start", "cbs")

    def __init__(self, actor, op, step, seq, axis, groups, sizes, fin):
        self.actor, self.op, self.step, self.seq, self.axis = actor, op, step, seq, axis
        self.groups, self.sizes, self.fin = groups, sizes, fin
        self.start = actor.env.now

    def launch(self, _e=None):
        a = self.actor
        self.start = a.env.now
        cbs = self.cbs = _issue(a.env, a.coll, self.groups, self.seq, self.op, a.free_comm, self.sizes).callbacks
        cbs.append(self.done)

    def done(self, _e):
        # the call's completion relayed to ``fin``: in order when this is the last callback
        # of the call's event (as :meth:`_Latch._on_done`)
        a = self.actor
        a.rec.add(a.rep, a.node, self.op.stream, self.op, self.axis, self.start, a.env.now, self.step, a.cid)
        cbs, self.cbs = self.cbs, None      # (a reference cycle through the list: dropped)
        if cbs[-1] == self.done:
            succeed_in_order(a.env, self.fin)
        else:
            self.fin.succeed()


class CellActor:
    """One rank cell's process: :meth:`run` is the generator simpy runs."""

    def __init__(self, state: RunState, cid: int):
        folding, prog = state.folding, state.prog
        self.state, self.cid = state, cid
        self.env, self.coll, self.rec = state.env, state.coll, state.rec
        self.free_comm, self.slowdown, self.flex = state.free_comm, state.slowdown, state.flex
        cls = prog.classes[folding.cell_class[cid]]
        self.ops = ops = cls.ops
        self.plan = state.plan(cls)
        self.rep = rep = folding.cells[cid][0]
        self.factor, self.jit, self.therm = state.pert.hooks(rep, ops)
        self.node = state.cluster.host_of(prog.grid.gpu_of(rep))
        self.a2a_sizes = prog.a2a_sizes
        self.wait_log = state.waits[cid]
        # per group kind: the group cells of the members' groups, with the members in each
        self.groups_of = {g: folding.groups_of[(cid, g)] for g in self.plan.per_kind}
        self.hc = 0.0
        """The host cursor: when the host has issued everything so far."""
        self.stream_tail: dict[str, simpy.Event] = {}
        self.grad_pending: list = []       # gradient buckets on the DP stream (the grad norm waits)
        self.param_pending: list = []      # ((first, last) layer, event): parameter gathers on the DP stream
        self.inflight: list = []           # non-blocking collectives (for the SM slowdown)
        self.flex_inflight: list = []      # flex-dispatcher all-to-alls among them (their SMs)
        self.overlapped: list = []         # exchanges the next compute op overlaps, then waits for
        self.overlapped_axis = Group.CP    # the group of the last of them (the wait's axis)
        self.hop_fins: set = set()         # those of them that slow it only while in flight
        self.prefetched: dict = {}         # op index -> (issue time, event) of prefetched FSDP gathers
        self.pair_turns: dict = {}         # F&B pair's first op -> its collectives' order per stream

    # -- the loop -------------------------------------------------------------------------

    def run(self):
        """The cell's process: every step, each op through its handler
        (:attr:`ClassPlan.handler_at`), or up to where the job stops (:meth:`RunState.stop`)."""
        state, env, ops, cid = self.state, self.env, self.ops, self.cid
        handler_at, next_at, n_ops = self.plan.handler_at, self.plan.next_at, len(self.ops)
        current = state.current
        try:
            for step in range(state.n_steps):
                self.hc = max(self.hc, env.now)      # the previous step ended in a host sync (loss, grad norm)
                i = 0
                while i < n_ops:
                    op = ops[i]
                    current[cid] = (step, op)
                    yield from handler_at[i](self, op, i, step)
                    i = next_at[i]
                if self.overlapped:
                    yield from self._wait_overlapped()
                state.step_end[step][cid] = env.now
                self.rec.step_done(cid, step, env.now)
                state.step_latch[step].hit()
            if self.param_pending:
                yield from _wait(env, [e for _, e in self.param_pending], self.wait_log, "dp")
        except simpy.Interrupt:
            state.stopped_at[cid] = current.get(cid)
            state.left -= 1
            return
        state.done_flags[cid] = True
        state.left -= 1

    # -- waits and the host -----------------------------------------------------------------

    def _wait_overlapped(self, last=False):
        yield from _wait(self.env, list(self.overlapped), self.wait_log, AXIS.get(self.overlapped_axis, "cp"), last)
        self.overlapped.clear()

    def _host_wait(self, until):
        # (callers check ``until > env.now`` first: most ops find the host ahead, and a
        # generator made for nothing costs as much as the check)
        env = self.env
        t_h = env.now
        yield env.timeout(until - t_h)
        self.wait_log.append((t_h, env.now, "host_issue"))

    def _host_issue(self, op):
        # the host issues ops in program order; the GPU cannot start one before the host
        # has issued it (a compute op: its first kernel, its share of op.host_s)
        if op.host_s > 0.0:
            first = self.hc + op.host_s / max(op.host_ops, 1)
            self.hc += op.host_s
            if first > self.env.now:
                yield from self._host_wait(first)

    def _host_sync(self, op, i, step):
        # the host waits until the compute stream has reached this point (the preceding op,
        # less the lag of its work that lies after the point)
        self.hc = max(self.hc, self.env.now - op.duration_s * self.factor)
        return ()

    # -- compute ----------------------------------------------------------------------------

    def _compute_time(self, op, step, idx):
        # the op's time on this rank, slower while a collective of the rank is in flight;
        # what-ifs: jitter (factor, stall) and thermal throttling (simulator.scenario.whatif)
        dur = op.duration_s * self.factor
        if self.jit is not None:
            dur = self.jit(dur, step, idx)
        inflight, flex_inflight, slowdown = self.inflight, self.flex_inflight, self.slowdown
        inflight[:] = [e for e in inflight if not e.processed]
        hops = None
        if flex_inflight:
            # the flex dispatcher's kernels hold SMs (simulator.collectives.ep_dispatch): compute
            # runs on the rest, or slower still if an NCCL collective runs too
            flex_inflight[:] = [e for e in flex_inflight if not e.processed]
            nccl = slowdown != 1.0 and len(inflight) > len(flex_inflight)
            if flex_inflight and dur > 0:
                dur *= max(self.flex[1], slowdown if nccl else 1.0)
            elif nccl and dur > 0:
                dur *= slowdown
        elif slowdown != 1.0 and dur > 0 and inflight:
            if all(e in self.hop_fins for e in inflight):
                hops = list(inflight)        # CP ring hops only: slowed while they last (_compute)
            else:
                dur *= slowdown
        if self.therm is not None:
            dur = self.therm(dur, step, self.env.now)
        return dur, hops

    def _compute(self, op, step, idx):
        # one compute op: issued, run, and not done before its last kernel (issued at
        # the cursor) has run its share (host issue inline: one generator fewer per op).
        # Returns whether it waited, and last for a private event whose sole callback is the
        # process's resume (a timeout, _beside_hops's): see _wait's ``last``.
        env = self.env
        private = False
        if op.host_s > 0.0:
            first = self.hc + op.host_s / max(op.host_ops, 1)
            self.hc += op.host_s
            if first > env.now:
                yield from self._host_wait(first)
                private = True
        t0 = env.now
        dur, hops = self._compute_time(op, step, idx)
        if hops:
            yield from self._beside_hops(hops, dur)
            dur = env.now - t0
            private = True
        elif dur > 0:
            yield env.timeout(dur)
            private = True
        self.rec.add(self.rep, self.node, STREAM_COMPUTE, op, "", t0, env.now, step, self.cid)
        if op.host_s > 0.0:
            last = self.hc + dur / max(op.host_ops, 1)
            if last > env.now:
                yield from self._host_wait(last)
                private = True
        return private

    def _beside_hops(self, hops, dur):
        # a ring-attention hop is short beside the block it overlaps: the block runs slower
        # only while a hop is in flight, at full speed once they have landed
        env, slowdown, left = self.env, self.slowdown, dur
        while True:
            live = [e for e in hops if not e.processed]
            if not live:
                yield env.timeout(left)
                break
            t = env.now
            first = _FirstOf(env, left * slowdown, live)      # (done | env.any_of(live))
            yield first.event
            if first.timed_out:
                break
            left -= (env.now - t) / slowdown
        self.hop_fins.difference_update([e for e in hops if e.processed])

    def _compute_op(self, op, i, step):
        """A compute op outside an F&B pair: the ZeRO-3 gathers it prefetches, the parameter
        gathers it needs, the op, then the exchanges it overlapped."""
        pre = self.plan.prefetch_after[i]
        if pre:
            self._prefetch(pre, step)
        if self.param_pending:
            yield from self._wait_params(op)
        private = yield from self._compute(op, step, i)
        if self.overlapped:
            yield from self._wait_overlapped(private)

    def _prefetch(self, js, step):
        # issue the next layer's ZeRO-3 parameter gathers before this compute op
        env, ops, prefetched, per_kind = self.env, self.ops, self.prefetched, self.plan.per_kind
        for j in js:
            if j not in prefetched:
                nxt = ops[j]
                self.hc += nxt.host_s        # the host issues it now, ahead of its turn
                seq_j = step * per_kind[nxt.group] + nxt.seq
                prefetched[j] = (env.now, _issue(env, self.coll, self.groups_of[nxt.group], seq_j, nxt,
                                                 self.free_comm))
                self.inflight.append(prefetched[j][1])

    def _wait_params(self, op):
        # a forward waits for the bucket holding its layer's parameters (the embedding and
        # output layer: the first bucket); anything else waits for all
        pending = self.param_pending
        if op.phase == PHASE_F:
            first_layer = self.plan.first_layer
            layer = op.layer if op.layer >= 0 else first_layer
            need = [e for (a, b), e in pending if a <= layer <= b or (op.layer < 0 and a == first_layer)]
        else:
            need = [e for _, e in pending]
        if need:
            yield from _wait(self.env, need, self.wait_log, "dp")
            self.param_pending = [(r, e) for r, e in self.param_pending if not e.processed]

    # -- collectives, by issue mode ---------------------------------------------------------

    def _prepare(self, op, i):
        # before a collective: its host issue, then the waits it makes (a step-end collective
        # for the overlapped exchanges, the grad norm for the gradient buckets)
        if op.host_s > 0.0:
            t_host = self.hc + op.host_s / max(op.host_ops, 1)
            self.hc += op.host_s
            if t_host > self.env.now:
                yield from self._host_wait(t_host)
        if self.plan.prep_at[i]:
            yield from self._prep_waits(i)

    def _prep_waits(self, i):
        # the waits of _prepare (ops with prep_at[i])
        if self.overlapped and self.plan.step_sync_at[i]:
            yield from self._wait_overlapped()
        if self.plan.grad_norm_at[i] and self.grad_pending:
            yield from _wait(self.env, self.grad_pending, self.wait_log, "dp")
            self.grad_pending = []

    def _sizes_of(self, op):
        if op.coll == COLL_ALL_TO_ALL and op.tag in self.a2a_sizes:
            sizes = self.a2a_sizes[op.tag]            # dispatch: [src, dst] by EP coordinate
            if op.group != Group.EP:                  # a CP exchange (ring hop, a2a+p2p block)
                return sizes
            sizes = ep_a2a_matrix(op, sizes)
            # (the pair scale follows the matrix: the combine's is the dispatch's, transposed)
            return sizes if self.flex is None else sizes * ep_a2a_matrix(op, self.flex[0])
        return None

    def _blocking(self, op, i, step):
        """Issue.BLOCKING: the rank waits for the collective."""
        env, plan = self.env, self.plan
        if op.host_s > 0.0:             # (_prepare, inline: one generator fewer per op)
            t_host = self.hc + op.host_s / max(op.host_ops, 1)
            self.hc += op.host_s
            if t_host > env._now:
                yield from self._host_wait(t_host)
        if plan.prep_at[i]:
            yield from self._prep_waits(i)
        seq = step * plan.per_kind[op.group] + op.seq
        groups = self.groups_of[op.group]
        t_issue = env._now               # (env.now, without the property's call)
        sizes = self._sizes_of(op) if op.coll == COLL_ALL_TO_ALL else None
        if len(groups) == 1 and not self.free_comm and op.size_bytes > 0:
            ev = self.coll.issue(groups[0][0], seq, op.coll, op.size_bytes, count=groups[0][1], sizes=sizes)
        else:
            ev = _issue(env, self.coll, groups, seq, op, self.free_comm, sizes)
        if ev.callbacks is not None:    # (not ev.processed)
            yield ev
        axis = plan.axis_of[i]
        now = env._now
        self.rec.add(self.rep, self.node, op.stream, op, axis, t_issue, now, step, self.cid)
        if now > t_issue:
            # waiting for the other members to arrive is a dependency (bubble, load
            # imbalance); only the time after the call started is communication
            call_start = self.coll.call_start
            if len(groups) == 1:
                t_start = call_start.get((groups[0][0], seq), t_issue)
                if not t_start > t_issue:       # max([t_issue, t_start]): t_issue on a tie
                    t_start = t_issue
            else:
                t_start = max([t_issue] + [call_start.get((g, seq), t_issue) for g, _ in groups])
            if t_start > t_issue:
                self.wait_log.append((t_issue, t_start, "bubble"))
            if now > t_start:
                self.wait_log.append((t_start, now, axis))

    def _alongside(self, op, i, step):
        # issue a collective that runs while the next compute op computes; that op waits for it
        env = self.env
        seq = step * self.plan.per_kind[op.group] + op.seq
        groups = self.groups_of[op.group]
        if len(groups) == 1 and not self.free_comm and op.size_bytes > 0:     # (_issue's call, inline)
            ev = self.coll.issue(groups[0][0], seq, op.coll, op.size_bytes, count=groups[0][1],
                                 sizes=self._sizes_of(op) if op.coll == COLL_ALL_TO_ALL else None)
        else:
            ev = _issue(env, self.coll, groups, seq, op, self.free_comm, self._sizes_of(op))
        fin = env.event()
        rec, rep, node, cid, axis, t_issue = self.rec, self.rep, self.node, self.cid, self.plan.axis_of[i], env.now
        cbs = ev.callbacks

        def landed(_x):
            # the completion relayed to ``fin``: in order when this is the last callback of
            # ``ev`` (as :meth:`_Latch._on_done`)
            nonlocal cbs, landed
            rec.add(rep, node, op.stream, op, axis, t_issue, env._now, step, cid)
            # (the list and this function's own name close reference cycles: dropped)
            last, cbs, landed = cbs[-1] is landed, None, None
            if last:
                succeed_in_order(env, fin)
            else:
                fin.succeed()

        cbs.append(landed)
        self.overlapped.append(fin)
        self.overlapped_axis = op.group
        self.inflight.append(fin)
        return fin

    def _overlap_next(self, op, i, step):
        """Issue.OVERLAP_NEXT: alongside the next compute op, slowing it all along."""
        if op.host_s > 0.0 or self.plan.prep_at[i]:
            yield from self._prepare(op, i)
        self._alongside(op, i, step)

    def _beside_next(self, op, i, step):
        """Issue.BESIDE_NEXT: alongside the next compute op, slowing it only while in flight."""
        if op.host_s > 0.0 or self.plan.prep_at[i]:
            yield from self._prepare(op, i)
        self.hop_fins.add(self._alongside(op, i, step))

    def _dp_stream(self, op, i, step):
        """Issue.DP_STREAM: queued on its stream without blocking; waited for where needed."""
        if op.host_s > 0.0 or self.plan.prep_at[i]:
            yield from self._prepare(op, i)
        fin = self._on_stream(op, step, step * self.plan.per_kind[op.group] + op.seq, self.plan.axis_of[i])
        if self.plan.grad_bucket_at[i]:
            self.grad_pending.append(fin)
        else:
            self.param_pending.append((op.tag or (-1, 1 << 30), fin))
        self.inflight.append(fin)

    def _prefetched(self, op, i, step):
        """Issue.PREFETCH: wait for the gather issued before the preceding compute op (if
        none was, as :meth:`_blocking`)."""
        got = self.prefetched.pop(i, None)
        if got is None:
            yield from self._blocking(op, i, step)
            return
        env = self.env
        t_issue, ev = got
        t_wait = env.now
        if not ev.processed:
            yield ev
        self.rec.add(self.rep, self.node, op.stream, op, "dp", t_issue, env.now, step, self.cid)
        if env.now > t_wait:
            self.wait_log.append((t_wait, env.now, "dp"))

    def _on_stream(self, op, step, seq, axis):
        # issue ``op`` without blocking, after the collectives already queued on its stream;
        # returns the event of its completion
        tail = self.stream_tail.get(op.stream)
        fin = self.env.event()
        call = _StreamCall(self, op, step, seq, axis, self.groups_of[op.group], self._sizes_of(op), fin)
        if tail is not None and not tail.processed:
            tail.callbacks.append(call.launch)
        else:
            call.launch()
        self.stream_tail[op.stream] = fin
        return fin

    # -- pipeline transfers -------------------------------------------------------------------

    def _p2p_batch(self, op, i, step):
        """A batch of consecutive sends/recvs (Megatron's send_forward_recv_backward): all
        posted, then all awaited."""
        yield from self._host_issue(op)           # one batch_isend_irecv call (its first op)
        yield from self._p2p(self.ops[i:self.plan.next_at[i]], step)
        if self.state.p2p_host_sync:
            # Megatron synchronises the device after a batch of transfers (batch_p2p_sync):
            # the host issues the next work from here
            self.hc = max(self.hc, self.env.now)

    def _p2p(self, batch, step):
        env, coll, state, cid = self.env, self.coll, self.state, self.cid
        folding, free_comm, mailbox = state.folding, self.free_comm, state.mailbox
        nonblocking_send = state.nonblocking_sends
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
                latch.on(e)
            yield latch.event
        for op, _ in waited:
            self.rec.add(self.rep, self.node, STREAM_PP, op, "pp", t0, env.now, step, cid)
        if env.now > t0:
            # waiting for the peer to post its side is a pipeline dependency (bubble); only the
            # transfer after both sides posted is pipeline communication
            starts = [coll.p2p_start.pop(key, t0) for key in keys]
            t_xfer = max([t0] + starts) if not free_comm else env.now
            if t_xfer > t0:
                self.wait_log.append((t0, t_xfer, "bubble"))
            if env.now > t_xfer:
                self.wait_log.append((t_xfer, env.now, "pp"))

    # -- DualPipe F&B pairs -------------------------------------------------------------------

    def _fb_pair(self, op, lo, step):
        """A DualPipe F&B pair (ops lo .. next_at[lo] - 1): the forward half (lane 1) and the
        backward half (lane 2) run as two threads on one GPU.  Their compute ops take turns on
        the compute stream; a collective blocks only its own half, so the other half computes
        meanwhile -- DeepSeek-V3's overlap of one chunk's all-to-all (and TP / PP
        communication) with the other chunk's computation (arXiv 2412.19437, §3.2.1, Fig. 4).
        Collectives of both halves queue on one stream per kind."""
        if self.param_pending:
            yield from _wait(self.env, [e for _, e in self.param_pending], self.wait_log, "dp")
            self.param_pending = []
        ops, hi = self.ops, self.plan.next_at[lo]
        lanes = ([j for j in range(lo, hi) if ops[j].lane == 1], [j for j in range(lo, hi) if ops[j].lane == 2])
        # The halves issue the collectives of one stream in a fixed order, whichever half is
        # ready first: every rank runs the same pair code, so the peers of a group make
        # their calls in the same order.  Issued in order of readiness instead, a slower
        # peer would queue its halves' calls the other way round on a shared stream, and two
        # ranks would each wait for a call the other has queued behind the one it waits for.
        turn = self.pair_turns.get(lo)
        if turn is None:
            turn = self.pair_turns[lo] = _pair_turns(ops, lanes)
        yield from self._pair_threads(step, lo, lanes, turn)

    def _pair_threads(self, step, lo, lanes, turn):
        ops, current, cid = self.ops, self.state.current, self.cid
        pos = [0, 0]
        blocked = [None, None]       # (completion event, axis) of the collective a half waits for
        issued = dict.fromkeys(turn, 0)     # per stream: its calls issued so far

        def may_issue(j):
            o = ops[j]
            return o.kind == KIND_COMPUTE or o.kind == KIND_HOST_SYNC or turn[o.stream][issued[o.stream]] == j

        cur = 0
        while pos[0] < len(lanes[0]) or pos[1] < len(lanes[1]) or any(blocked):
            ready = [h for h in (cur, 1 - cur) if pos[h] < len(lanes[h])
                     and (blocked[h] is None or blocked[h][0].processed) and may_issue(lanes[h][pos[h]])]
            if not ready:
                yield from self._pair_wait(blocked, lo)
                blocked = [b if b is not None and not b[0].processed else None for b in blocked]
                continue
            h = cur = ready[0]
            blocked[h] = None
            j = lanes[h][pos[h]]
            pos[h] += 1
            op = ops[j]
            current[cid] = (step, op)
            if op.kind == KIND_COMPUTE:
                yield from self._compute(op, step, j)
            elif op.kind == KIND_HOST_SYNC:
                self._host_sync(op, j, step)       # one host thread drives both halves
            else:
                issued[op.stream] += 1
                fin = yield from self._pair_collective(op, j, step)
                if fin is not None:
                    blocked[h] = fin
                    cur = 1 - h

    def _pair_wait(self, blocked, lo):
        # neither half can go on: wait for the first of their collectives to land
        waiting = [b for b in blocked if b is not None and not b[0].processed]
        if waiting:
            env = self.env
            t0 = env.now
            first = _Latch(env, 1)
            for ev, _axis in waiting:
                first.on(ev)
            yield first.event
            self.wait_log.append((t0, env.now, waiting[0][1]))
        elif not any(blocked):      # cannot happen: _pair_turns's order is always followable
            raise SimulationError(f"cell {self.cid}: the F&B pair at op {lo} cannot go on")

    def _pair_collective(self, op, j, step):
        # a half's collective, on its stream; returns (event, axis) when it blocks its half
        yield from self._host_issue(op)
        plan = self.plan
        fin = self._on_stream(op, step, step * plan.per_kind[op.group] + op.seq, plan.axis_of[j])
        self.inflight.append(fin)
        if plan.flex_a2a_at[j]:
            self.flex_inflight.append(fin)
        if plan.issue_at[j] == Issue.DP_STREAM:
            self.grad_pending.append(fin)
            return None
        return (fin, plan.axis_of[j])


ISSUE_HANDLERS = {
    Issue.BLOCKING: CellActor._blocking,
    Issue.BESIDE_NEXT: CellActor._beside_next,
    Issue.OVERLAP_NEXT: CellActor._overlap_next,
    Issue.DP_STREAM: CellActor._dp_stream,
    Issue.PREFETCH: CellActor._prefetched,
}
"""How a collective is run, by its issue mode (:class:`workloads.ops.Issue`)."""
