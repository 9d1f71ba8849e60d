"""Flow-level fluid network on simpy.

What is modelled
----------------
Every live flow has a route (link ids with per-link coefficients, see
:class:`topologies.routing.Route`), remaining bytes, a weight (the number of identical
member flows it stands for) and an optional rate cap.  Live flows share link
capacities max-min fairly (:mod:`simulator.network.maxmin`); a flow's rate is constant between
two re-solves, so its remaining bytes fall linearly and its finishing instant is exact.

A *coupled* flow -- one ring, tree or chain channel of a collective -- has the union of
its edges' links as its route: it moves at the rate of its slowest edge, and a link its
channel crosses twice is charged twice.  Independent per-edge flows would let
uncontended edges finish early and hand bandwidth to others that the real ring still
uses, so collectives never do that.

Event discipline
----------------
* Rates are re-solved at most once per simulated instant: a flow start or finish only
  marks the network dirty and schedules one zero-delay "solve" event; that event defers
  itself while other events of the same instant are still queued, so all starts and
  finishes of an instant (including processes woken by those finishes) share one solve.
* One versioned "next completion" timer replaces per-flow timers: after a solve the
  network schedules a single timeout at the earliest finishing instant; a later solve
  bumps the version and the stale timer does nothing when it fires.
* Flows live in preallocated numpy arrays (grown by doubling); routes live in one
  link/coefficient pool, compacted when mostly garbage.  Flows that start at the same
  instant on the same route with the same size and cap merge into one weighted flow.
* Isolated groups skip the solver: max-min rates decompose over connected components of
  the flow/link graph, so a group whose links no live flow uses gets its rates from a
  solve of the group alone (cached by route), and finishes on its own timer without
  touching anyone else's rates.  If a later flow needs one of its links, the group is
  turned into ordinary live flows with the bytes it has left, and the network re-solves.
  (This is what makes an NVLink-island TP collective a closed-form delay exactly while
  nothing else uses the island, and a flow as soon as something does.)

Accounting: bytes carried and busy time per link (weighted by flow multiplicity and
route coefficient), and :meth:`FlowNetwork.snapshot` for utilisation over a window.

Not modelled: packet-level effects (congestion control dynamics, head-of-line blocking,
incast collapse); propagation latency is added by the callers (collectives, p2p) as a
delay before the bytes flow.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from heapq import heappush
import math
import time

import numpy as np
import simpy

from .allocator import tune_allocator
from .maxmin import max_min_rates

__all__ = ["FlowNetwork", "NetworkSnapshot"]

_SOLVE_CACHE_ENTRIES = 1 << 14      # distinct live flow sets remembered (each a few arrays of its size)
# ... and at most this many bytes of them: skewed all-to-alls re-solve thousands of flows at every
# pair's finish and rarely meet a set again; by entries alone the cache grew to about 2 GB there
_SOLVE_CACHE_BYTES = 256 << 20
# Up to this many live flows, per-event updates loop over them in Python: numpy costs 1-3 us
# per call on tiny arrays, an element ~0.1 us; the same float64 operations in the same order
# give the same bits either way.
_FEW = 32
# Networks with up to this many links keep their per-link byte and busy-time counters in Python
# lists: the counters are updated a few links at a time at every event, where a list element
# costs a quarter of a numpy one; the same additions in the same order give the same bits.
# Larger networks keep numpy arrays (their updates can touch thousands of links at once).
_LIST_LINKS = 1024
# simpy's priorities are URGENT (0) and NORMAL (1): the network's solve runs after both
_AFTER_INSTANT = 2
_NO_SLOTS = np.empty(0, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class NetworkSnapshot:
    """Counters at one simulated instant (for utilisation over a window)."""

    time_s: float
    link_bytes: np.ndarray
    link_busy_s: np.ndarray


def next_now(env: simpy.Environment) -> bool:
    """Whether an event scheduled now at NORMAL priority (a plain ``succeed``) would be the
    next one simpy pops: it would go in the heap as ``(now, NORMAL, eid)`` with an ``eid``
    above every queued one, so it comes first unless an event is queued at this instant
    with priority URGENT or NORMAL (one queued at it with a lower priority -- the network's
    solve, ``_AFTER_INSTANT`` -- comes after it)."""
    q = env._queue
    return not (q and q[0][0] <= env._now and q[0][1] <= simpy.core.NORMAL)


def succeed_in_order(env: simpy.Environment, ev: simpy.Event, value=None) -> None:
    """``ev.succeed(value)`` as the last act of an event's processing, in the order simpy
    would process it but without the heap: when it would be the next event popped
    (:func:`next_now`), its callbacks run at once instead (the same actions in the same
    order, one scheduled event fewer).  Otherwise, or if anything runs after this call
    (in this callback, in a later callback of the event being processed, or in a caller),
    it must be a plain ``succeed``."""
    q = env._queue
    if q and q[0][0] <= env._now and q[0][1] <= simpy.core.NORMAL:      # (not next_now(env), inline)
        ev.succeed(value)
        return
    if ev._value is not simpy.events.PENDING:
        raise RuntimeError(f"{ev} has already been triggered")
    ev._ok, ev._value = True, value
    callbacks, ev.callbacks = ev.callbacks, None
    for callback in callbacks:
        callback(ev)


class FlowNetwork:
    """Live fluid flows over links with capacities ``capacity`` (bytes/s, per link id).

    Parameters
    ----------
    env : simpy.Environment
    capacity : numpy.ndarray
        Effective capacity per link id, bytes/s.

    Two flows share link 0 (100 GB/s); the second also crosses link 1 (50 GB/s), which caps
    it at 50 GB/s, so max-min fairness gives each 50 GB/s.  The second's 50 GB finish at
    1 s; the first then has link 0 alone and moves its last 50 GB in 0.5 s:

    >>> import numpy as np, simpy
    >>> env = simpy.Environment()
    >>> net = FlowNetwork(env, np.array([100e9, 50e9]))
    >>> a = net.transfer(np.array([0]), 100e9)
    >>> b = net.transfer(np.array([0, 1]), 50e9)
    >>> env.run()
    >>> a.value, b.value
    (1.5, 1.0)
    """

    def __init__(self, env: simpy.Environment, capacity: np.ndarray, initial_flows: int = 1024,
                 isolate: bool = True):
        tune_allocator()            # solves allocate many large temporaries: see simulator.network.allocator
        self.env = env
        self.capacity = np.asarray(capacity, dtype=float)
        self.num_links = self.capacity.size
        n = max(16, initial_flows)
        self._rem = np.zeros(n)
        self._rate = np.zeros(n)
        self._weight = np.ones(n)
        self._cap = np.full(n, np.inf)
        self._size = np.zeros(n)
        # rem, rate and size per slot as Python lists too: while a few flows are live
        # (_few_mode, see _act_few) the lists hold their rem and rate, else the arrays do
        self._rem_l, self._rate_l, self._size_l = [0.0] * n, [0.0] * n, [0.0] * n
        self._few_mode = False
        self._off = np.zeros(n, dtype=np.int64)
        self._len = np.zeros(n, dtype=np.int64)
        self._group = np.zeros(n, dtype=np.int64)
        self._rid = np.zeros(n, dtype=np.int64)     # interned route id per slot (the solve cache's key)
        # per slot (route id, weight, cap) as Python values: the cache key of a solve of a few
        # flows (weights and caps are positive or inf, where equal values are equal bits)
        self._slot_key: list = [None] * n
        self._free = list(range(n - 1, -1, -1))
        # live ordinary flows' slots, in admission order (the solver's sums run in this order):
        # an array, with the slots admitted since it was last read appended as a list
        # (:meth:`_act`), so per-event updates over thousands of flows convert nothing
        self._act_arr = _NO_SLOTS
        self._act_tail: list[int] = []
        self._pool_links = np.empty(4096, dtype=np.int64)
        self._pool_coefs = np.empty(4096)
        self._pool_top = 0
        self._pool_live = 0
        self._groups: dict[int, list] = {}      # group id -> [remaining flows, event]
        self._next_group = 0
        self._merge: dict[tuple, int] = {}      # identical flows of one group -> slot
        self._last = env.now
        self._stale = False                     # rem may hold a finished flow not yet retired: see _finish_done
        self._pending = False
        self._version = 0
        # per-link counters: Python lists on small networks (_LIST_LINKS), else numpy arrays
        self._list_links = self.num_links <= _LIST_LINKS
        if self._list_links:
            self._link_bytes = [0.0] * self.num_links
            self._link_busy_s = [0.0] * self.num_links
        else:
            self._link_bytes = np.zeros(self.num_links)
            self._link_busy_s = np.zeros(self.num_links)
        self._route_lists: list = []            # route id -> (links, coefs) as lists (_retire_few)
        self._load_links = [] if self._list_links else np.empty(0, dtype=np.int64)    # links in use, and
        self._load = [] if self._list_links else np.empty(0)        # bytes/s on them, at the last solve
        # templates with finished isolated runs not yet accounted, in the order they finished (a
        # dict, not a set: a set iterates by object address, which made the bytes' summation
        # order, and so link utilisation's last digit, differ from run to run)
        self._done_templates: dict = {}
        # the isolated group that last reserved each link (stale once it finished: check _iso)
        # (both per-link counters are Python lists: they are read and written a few links at a
        # time, once or twice per event, where a numpy call costs ten times an element)
        self._iso_owner = [-1] * self.num_links
        self._occ = [0] * self.num_links        # live flows + reservations per link
        self._iso: dict[int, tuple] = {}        # isolated group id -> (template, start, event)
        self._templates: dict = {}
        # every template started at least once, in first-start order, with its start count on
        # it (Template.admitted): what the flows were asked to carry, for byte_balance()
        self._admitted: dict = {}
        self._route_ids: dict = {}              # (links, coefs) bytes -> route id
        self._solved: dict = {}                 # live flow set -> (rates, loaded links, load): see _solve_rates
        self._solved_bytes = 0                  # what its keys and arrays hold
        self.isolate = isolate                  # False: every group goes through the solver (tests)
        self.num_solves = 0
        self.num_solve_hits = 0                 # solves answered by the cache (counted in num_solves too)
        self.solve_wall_s = 0.0                 # wall time in _solve (Result.profile's "solver")
        self.num_flows = 0
        self._watch = None                      # what-ifs: links whose use stops the job (watch_links)

    # -- public ------------------------------------------------------------------------------
    def watch_links(self, mask: np.ndarray, at_s: float, on_use) -> None:
        """Call ``on_use(time_s, links)`` when a transfer crosses a link of ``mask`` at or
        after ``at_s`` (a failed NIC, :mod:`simulator.scenario.whatif`): at its start, or at ``at_s``
        for transfers live then.  ``on_use`` may raise to stop the run."""
        self._watch = (np.asarray(mask, dtype=bool), float(at_s), on_use)
        if at_s > self.env.now:
            def check(_e):
                hit = np.flatnonzero(self._watch[0] & (np.asarray(self._occ) > 0))
                if hit.size:
                    on_use(self.env.now, hit.tolist())
            self.env.timeout(at_s - self.env.now).callbacks.append(check)

    def transfer(self, links: np.ndarray, size_bytes: float, *, coefs: np.ndarray | None = None,
                 weight: float = 1.0, cap: float = np.inf) -> simpy.Event:
        """Start one flow now; the event succeeds when its last byte arrives."""
        return self.transfer_group([(links, coefs, size_bytes, weight, cap)])

    def transfer_group(self, flows, key=None, delay: float = 0.0, event: simpy.Event | None = None) -> simpy.Event:
        """Start several flows (after ``delay`` seconds); the event succeeds when all of them
        have finished.

        ``flows`` is an iterable of ``(links, coefs | None, size_bytes, weight, cap)``.
        ``key`` (hashable, optional) names this exact list of flows: callers that start
        the same group again and again (a collective call) pass it to skip re-parsing, and
        may pass the ``event`` to succeed.  A group that is isolated now reserves its links from now on and needs no event
        until it finishes; if anything claims them before it starts, it starts as ordinary
        flows after the delay.
        """
        ev = self.env.event() if event is None else event
        return self.start_template(self.template(flows, key), delay, ev)

    def template(self, flows, key=None) -> "_Template":
        """``flows`` parsed (see :meth:`transfer_group`), kept under ``key`` when given: a
        caller that starts the same group again and again may keep it and pass it to
        :meth:`start_template` (on this network only)."""
        t = self._templates.get(key) if key is not None else None
        if t is None:
            t = _Template(flows)
            t.rids = [self._route_id(it[0], it[1]) for it in t.items]
            if key is not None:
                self._templates[key] = t
        return t

    def start_template(self, t: "_Template", delay: float, ev: simpy.Event) -> simpy.Event:
        """:meth:`transfer_group` of a template of this network (:meth:`template`): start its
        flows after ``delay`` seconds, completing ``ev``."""
        gid = self._next_group
        self._next_group = gid + 1
        if self._watch is not None and t.items:
            mask, at_s, on_use = self._watch
            if self.env.now + delay >= at_s:
                hit = t.uniq[mask[t.uniq]]
                if hit.size:
                    on_use(self.env.now + delay, hit.tolist())
        if delay > 0:
            if not (t.items and self._try_isolated(gid, t, ev, self.env._now + delay)):
                self._call_in(delay, partial(self._admit, gid, t, ev))
            return ev
        self._admit(gid, t, ev)
        return ev

    def _call_in(self, delay: float, callback) -> None:
        """``env.timeout(delay)`` with ``callback`` as its callback, scheduled the same way
        (NORMAL priority, value None) without a Timeout object."""
        env = self.env
        e = simpy.Event(env)
        e._ok, e._value = True, None
        e.callbacks.append(callback)
        heappush(env._queue, (env._now + delay, simpy.core.NORMAL, next(env._eid), e))

    def _admit(self, gid: int, t: "_Template", ev, _e=None) -> None:
        """Start template ``t``'s flows now as group ``gid``, completing ``ev``."""
        self._advance()
        now = self.env.now
        items = t.items
        if items:
            if self._try_isolated(gid, t, ev, now):
                return
            if self._iso:
                # isolated groups holding one of these links become ordinary flows
                iso = self._iso
                owner = self._iso_owner
                for o in sorted({owner[i] for i in t.links if owner[i] in iso}):
                    self._materialize(o)
        if items:
            t.admitted += 1
            self._admitted[t] = None
        if len(items) > _FEW:
            count = self._add_batch(gid, t)
        else:
            count = 0
            for (links, coefs, size, weight, cap), rid in zip(items, t.rids):
                key = (rid, size, cap)
                slot = self._merge.get(key)
                if slot is not None:
                    self._weight[slot] += weight
                    self._slot_key[slot] = (rid, float(self._weight[slot]), cap)
                    continue
                self._merge[key] = self._add_flow(gid, rid, links, coefs, size, size, weight, cap)
                count += 1
            self._merge.clear()
        self.num_flows += count
        if count == 0:
            # (a plain succeed: from start_template this runs inside an issuing process)
            ev.succeed(now)
            return
        self._groups[gid] = [count, ev]
        self._kick()

    def snapshot(self) -> NetworkSnapshot:
        """Counters now (bytes and busy time per link), for utilisation over a window."""
        self._advance()
        b, busy = self.link_bytes.copy(), self.link_busy_s.copy()       # (flushes finished isolated runs)
        now = self.env.now
        for t, t0, _ev in self._iso.values():       # isolated groups' progress so far
            if now > t0:
                b[t.uniq] += t.per_s * (now - t0)
                busy[t.uniq] += now - t0
        return NetworkSnapshot(now, b, busy)

    @property
    def link_bytes(self) -> np.ndarray:
        """Bytes carried so far per link (flows still running: up to the last event)."""
        self._flush_isolated()
        return np.array(self._link_bytes) if self._list_links else self._link_bytes

    @property
    def link_busy_s(self) -> np.ndarray:
        """Seconds each link has carried traffic."""
        self._flush_isolated()
        return np.array(self._link_busy_s) if self._list_links else self._link_busy_s

    def _add_links(self, links: list, idx: np.ndarray, values: np.ndarray, busy) -> None:
        """Add ``values`` to the byte counters of ``links`` (distinct; ``idx``: the same as an
        array) and ``busy`` (seconds, a scalar) to their busy time, in either storage."""
        if self._list_links:
            b, t = self._link_bytes, self._link_busy_s
            for i, x in zip(links, values.tolist()):
                b[i] += x
                t[i] += busy
        else:
            self._link_bytes[idx] += values
            self._link_busy_s[idx] += busy

    def _add_bytes_at(self, links: np.ndarray, values: np.ndarray) -> None:
        """``np.add.at(link bytes, links, values)`` (links may repeat: added in order)."""
        if self._list_links:
            b = self._link_bytes
            for i, x in zip(links.tolist(), values.tolist()):
                b[i] += x
        else:
            np.add.at(self._link_bytes, links, values)

    def byte_balance(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per link: (bytes carried so far, bytes still to carry for flows started and not
        finished, bytes the started flows were asked to carry).  Bytes are conserved when the
        first two add up to the third (to rounding): the links' counters integrate rates over
        time, and the asked-for side is each started flow's size times its weight and link
        coefficient, so a solver or accounting error shows up as a difference.  Brings the
        counters up to now."""
        self._advance()
        self._leave_few()
        now = self.env.now
        carried = self.link_bytes.copy()
        left = np.zeros(self.num_links)
        act = self._act()
        if act.size:
            links, coefs = self._gather(act)
            lens = self._len[act]
            np.add.at(left, links, np.repeat(self._rem[act] * self._weight[act], lens) * coefs)
        for t, t0, _ev in self._iso.values():       # isolated groups running or about to
            done = t.per_s * max(now - t0, 0.0)
            carried[t.uniq] += done
            left[t.uniq] += t.expected_bytes() - done
        asked = np.zeros(self.num_links)
        for t in self._admitted:
            if t.admitted:
                asked[t.uniq] += t.admitted * t.expected_bytes()
        return carried, left, asked

    def _flush_isolated(self) -> None:
        for t in self._done_templates:
            self._add_links(t.links, t.uniq, t.total_bytes * t.done_runs, t.done_busy_s)
            t.done_runs = 0
            t.done_busy_s = 0.0
        self._done_templates.clear()

    # -- isolated groups ---------------------------------------------------------------------
    def _try_isolated(self, gid: int, t: "_Template", ev, start: float) -> bool:
        """Run a group alone from ``start`` on links nobody else uses or has reserved;
        False if they are in use or its flows would not all finish together (the ordinary
        path then handles it)."""
        if not self.isolate:
            return False
        occ = self._occ
        links = t.links
        for i in links:
            if occ[i]:
                return False
        if t.rate is None:
            t.solve_alone(self.capacity)
        if not t.isolatable:
            return False
        owner = self._iso_owner
        for i in links:
            occ[i] += 1
            owner[i] = gid
        self._iso[gid] = (t, start, ev)
        self.num_flows += len(t.items)
        t.admitted += 1
        self._admitted[t] = None
        # env.timeout(start - now + duration) with _finish_isolated(gid) as its callback,
        # scheduled the same way (NORMAL priority, value None) without a Timeout object
        env = self.env
        fin = simpy.Event(env)
        fin._ok, fin._value = True, None
        fin.callbacks.append(partial(self._finish_isolated, gid))
        env.schedule(fin, simpy.core.NORMAL, start - env._now + t.duration)
        return True

    def _finish_isolated(self, gid: int, _ev=None) -> None:
        rec = self._iso.pop(gid, None)
        if rec is None:
            return                      # materialized meanwhile: its flows finish as ordinary ones
        t, t0, ev = rec
        # exact bytes (every flow carried its whole size), added to the links when read
        now = self.env._now
        t.done_runs += 1
        t.done_busy_s += now - t0
        self._done_templates[t] = None
        occ = self._occ                 # (_release, inline)
        for i in t.links:
            occ[i] -= 1
        succeed_in_order(self.env, ev, now)

    def _release(self, t: "_Template") -> None:
        """Drop an isolated group's reservation of its links."""
        occ = self._occ
        for i in t.links:
            occ[i] -= 1

    def _materialize(self, gid: int) -> None:
        """Turn an isolated group into ordinary live flows with the bytes it has left (or,
        if it has not started yet, start it as ordinary flows when it would have)."""
        t, t0, ev = self._iso.pop(gid)
        now = self.env.now
        self._release(t)
        if now < t0:
            self.num_flows -= len(t.items)          # counted again when they start
            t.admitted -= 1
            self.env.timeout(t0 - now).callbacks.append(lambda _e: self._admit(gid, t, ev))
            return
        el = now - t0
        if self._list_links:            # (_add_links of per_s * el, from the lists)
            b, busy = self._link_bytes, self._link_busy_s
            for i, x in zip(t.links, t.per_s_list):
                b[i] += x * el
                busy[i] += el
        else:
            self._add_links(t.links, t.uniq, t.per_s * el, el)
        for (lk, cf, size, weight, cap), rid, r in zip(t.items, t.rids, t.rate_list):
            self._add_flow(gid, rid, lk, cf, size, max(size - r * el, 0.0), weight, cap)
        self._stale = True          # a flow may have (about) nothing left
        self._groups[gid] = [len(t.items), ev]
        self._kick()

    def _route_id(self, links: np.ndarray, coefs: np.ndarray) -> int:
        """One small integer per distinct route (links and coefficients), for this run."""
        key = (links.tobytes(), coefs.tobytes())
        rid = self._route_ids.get(key)
        if rid is None:
            rid = self._route_ids[key] = len(self._route_ids)
            self._route_lists.append((links.tolist(), coefs.tolist()))
        return rid

    def _add_flow(self, gid: int, rid: int, links, coefs, size: float, remaining: float, weight: float,
                  cap: float) -> int:
        """A live ordinary flow of group ``gid`` on route ``rid`` in a fresh slot (returned)."""
        slot = self._alloc()
        self._rem[slot] = self._rem_l[slot] = remaining
        self._size[slot] = self._size_l[slot] = size
        self._rate[slot] = self._rate_l[slot] = 0.0
        self._weight[slot] = weight
        self._cap[slot] = cap
        self._group[slot] = gid
        self._rid[slot] = rid
        self._slot_key[slot] = (rid, weight, cap)
        self._store_route(slot, links, coefs)
        occ = self._occ
        for i in links.tolist():
            occ[i] += 1
        self._act_tail.append(slot)
        return slot

    def _add_batch(self, gid: int, t: "_Template") -> int:
        """:meth:`_admit`'s loop over a large group in a few array operations: the same
        flows, merged the same way (:meth:`_Template.batch`), with the same weights, in the
        same admission order; returns how many live flows it added."""
        rids, sizes, weights, caps, lens, links, coefs, link_list = t.batch()
        n = sizes.size
        if self._pool_top + links.size > self._pool_links.size:
            self._compact(links.size)
        slots = [self._alloc() for _ in range(n)]
        sl = np.array(slots, dtype=np.int64)
        self._rem[sl] = sizes
        self._size[sl] = sizes
        self._rate[sl] = 0.0
        rem_l, rate_l, size_l = self._rem_l, self._rate_l, self._size_l
        for s, x in zip(slots, sizes.tolist()):
            rem_l[s] = size_l[s] = x
            rate_l[s] = 0.0
        self._weight[sl] = weights
        self._cap[sl] = caps
        self._group[sl] = gid
        self._rid[sl] = rids
        slot_key = self._slot_key
        for s, k in zip(slots, zip(rids.tolist(), weights.tolist(), caps.tolist())):
            slot_key[s] = k
        top = self._pool_top
        self._pool_links[top:top + links.size] = links
        self._pool_coefs[top:top + links.size] = coefs
        offs = np.zeros(n, dtype=np.int64)
        np.cumsum(lens[:-1], out=offs[1:])
        self._off[sl] = offs + top
        self._len[sl] = lens
        self._pool_top += links.size
        self._pool_live += links.size
        occ = self._occ
        for i in link_list:
            occ[i] += 1
        self._act_tail.extend(slots)
        return n

    @staticmethod
    def utilization(a: NetworkSnapshot, b: NetworkSnapshot, capacity: np.ndarray) -> np.ndarray:
        """Per-link utilisation between two snapshots: bytes / (capacity x window)."""
        window = b.time_s - a.time_s
        if window <= 0:
            return np.zeros_like(capacity)
        return (b.link_bytes - a.link_bytes) / (capacity * window)

    @staticmethod
    def tier_summary(a: NetworkSnapshot, b: NetworkSnapshot, capacity: np.ndarray, link_tier: np.ndarray,
                     tier_names) -> dict[str, dict[str, float]]:
        """Per tier, between two snapshots: bytes carried, busy link-seconds, and mean
        utilisation (bytes over the tier's total capacity x window)."""
        window = b.time_s - a.time_s
        moved = b.link_bytes - a.link_bytes
        busy = b.link_busy_s - a.link_busy_s
        out = {}
        for i, name in enumerate(tier_names):
            sel = link_tier == i
            if not sel.any():
                continue
            cap = float(capacity[sel].sum())
            out[str(name)] = {"bytes": float(moved[sel].sum()), "busy_link_s": float(busy[sel].sum()),
                              "utilization": float(moved[sel].sum() / (cap * window)) if window > 0 else 0.0}
        return out

    # -- internals ---------------------------------------------------------------------------
    def _alloc(self) -> int:
        if not self._free:
            n = self._rem.size
            for name in ("_rem", "_rate", "_weight", "_cap", "_size", "_off", "_len", "_group", "_rid"):
                old = getattr(self, name)
                new = np.empty(2 * n, dtype=old.dtype)
                new[:n] = old
                setattr(self, name, new)
            self._slot_key.extend([None] * n)
            for lst in (self._rem_l, self._rate_l, self._size_l):
                lst.extend([0.0] * n)
            self._free = list(range(2 * n - 1, n - 1, -1))
        return self._free.pop()

    def _store_route(self, slot: int, links: np.ndarray, coefs: np.ndarray) -> None:
        n = links.size
        if self._pool_top + n > self._pool_links.size:
            self._compact(n)
        top = self._pool_top
        self._pool_links[top:top + n] = links
        self._pool_coefs[top:top + n] = coefs
        self._off[slot] = top
        self._len[slot] = n
        self._pool_top += n
        self._pool_live += n

    def _act(self) -> np.ndarray:
        """The live flows' slots, in admission order."""
        tail = self._act_tail
        if tail:
            if not self._act_arr.size and len(tail) <= _FEW:
                return np.array(tail, dtype=np.int64)      # (a few: the list stays, see _act_few)
            self._leave_few()
            self._act_arr = np.concatenate((self._act_arr, np.array(tail, dtype=np.int64)))
            self._act_tail = []
        return self._act_arr

    def _leave_few(self) -> None:
        """Out of few-flow mode: the live flows' rem and rate back into the arrays."""
        if self._few_mode:
            self._few_mode = False
            rem, rate, rem_l, rate_l = self._rem, self._rate, self._rem_l, self._rate_l
            for s in self._act_arr.tolist() + self._act_tail:
                rem[s] = rem_l[s]
                rate[s] = rate_l[s]

    def _act_few(self) -> list | None:
        """The live flows' slots as a list when there are at most _FEW of them, else None.
        A few live flows are kept as the list alone (``_act_tail``, with an empty array),
        which the per-event loops read as it is."""
        arr = self._act_arr
        if arr.size + len(self._act_tail) > _FEW:
            self._leave_few()
            return None
        if arr.size:
            self._act_tail = arr.tolist() + self._act_tail
            self._act_arr = _NO_SLOTS
        tail = self._act_tail
        if not self._few_mode:          # into few-flow mode: rem and rate into the lists
            self._few_mode = True
            rem, rate, rem_l, rate_l = self._rem, self._rate, self._rem_l, self._rate_l
            for s in tail:
                rem_l[s] = float(rem[s])
                rate_l[s] = float(rate[s])
        return tail

    def _num_active(self) -> int:
        return self._act_arr.size + len(self._act_tail)

    def _compact(self, extra: int) -> None:
        act = self._act()
        need = self._pool_live + extra
        size = self._pool_links.size
        while size < 2 * need:
            size *= 2
        links, coefs = self._gather(act)
        self._pool_links = np.empty(size, dtype=np.int64)
        self._pool_coefs = np.empty(size)
        n = links.size
        self._pool_links[:n] = links
        self._pool_coefs[:n] = coefs
        if act.size:
            lens = self._len[act]
            offs = np.zeros(act.size, dtype=np.int64)
            np.cumsum(lens[:-1], out=offs[1:])
            self._off[act] = offs
        self._pool_top = n
        self._pool_live = n

    def _gather(self, act: np.ndarray):
        """Concatenated routes of slots ``act`` (CSR order), vectorised."""
        if act.size == 0:
            return np.empty(0, dtype=np.int64), np.empty(0)
        lens = self._len[act]
        total = int(lens.sum())
        starts = self._off[act]
        base = np.repeat(starts - np.concatenate(([0], np.cumsum(lens)[:-1])), lens)
        idx = base + np.arange(total)
        return self._pool_links[idx], self._pool_coefs[idx]

    def _advance(self) -> None:
        now = self.env.now
        dt = now - self._last
        if dt > 0 and self._num_active():
            few = self._act_few()
            if few is not None:
                rem, rate = self._rem_l, self._rate_l
                for s in few:
                    rem[s] -= rate[s] * dt
            else:
                act = self._act()
                self._rem[act] -= self._rate[act] * dt
            self._stale = True
            if self._list_links:
                b, t = self._link_bytes, self._link_busy_s
                for i, x in zip(self._load_links, self._load):
                    b[i] += x * dt
                    t[i] += dt
            elif self._load_links.size:
                self._link_bytes[self._load_links] += self._load * dt
                self._link_busy_s[self._load_links] += dt
        self._last = now

    def _kick(self) -> None:
        if not self._pending:
            self._pending = True
            # Scheduled behind every other event of this instant, including those its
            # processing schedules at it (simpy orders an instant's events by priority, then
            # by when they were scheduled): one solve after all of them.
            env = self.env
            ev = simpy.Event(env)
            ev._ok, ev._value = True, None
            ev.callbacks.append(self._on_kick)
            heappush(env._queue, (env._now, _AFTER_INSTANT, next(env._eid), ev))    # env.schedule, inline

    def _on_kick(self, _ev) -> None:
        self._pending = False
        self._advance()
        if not self._finish_done():     # (finishes kick: they wake processes at this instant, solve after them)
            self._solve()

    def _on_timer(self, version: int, _ev=None) -> None:
        if version != self._version:
            return
        self._advance()
        # (the kick first, and _finish_done last: see there; the kick goes behind every
        # event of this instant either way, being the only one queued at _AFTER_INSTANT)
        self._kick()
        self._finish_done()

    def _finish_done(self) -> bool:
        # Only time passing (_advance), new rates (the test below counts a flow finished when
        # it is a rounding error from done at its rate) or an isolated group turned into
        # flows with what it has left (_materialize) can make a flow finished; a flow
        # admitted at full size with rate 0 cannot be.  A second look at the same state
        # finds nothing.
        if not self._stale or not self._num_active():
            return False
        self._stale = False
        now = self.env.now
        tol = abs(now) * 4e-16 + 1e-18
        few = self._act_few()
        if few is not None:
            rem, size, rate = self._rem_l, self._size_l, self._rate_l
            keep, done = [], []
            for s in few:
                r = rem[s]
                (done if r <= size[s] * 1e-12 or r <= rate[s] * tol else keep).append(s)
            if not done:
                return False
            self._act_tail = keep
            self._retire_few(done)
        else:
            act = self._act()
            rem = self._rem[act]
            is_done = (rem <= self._size[act] * 1e-12) | (rem <= self._rate[act] * tol)
            if not is_done.any():
                return False
            finished = act[is_done]
            self._act_arr = act[~is_done]
            done = finished.tolist()
            self._retire(finished)
        # The finished groups' events succeed last: after the slots are freed and the solve
        # behind this instant's events is queued (_kick), which a plain succeed would have
        # done before any of their callbacks ran.  This is the last act of the processing of
        # the event being processed -- the sole callback (_on_kick, _on_timer) of a private
        # event, which do nothing after -- so the last group's event succeeds in order.
        groups, last = self._groups, None
        for slot in done:
            gid = int(self._group[slot])
            g = groups[gid]
            g[0] -= 1
            if g[0] == 0:
                del groups[gid]
                if last is not None:
                    last.succeed(now)
                last = g[1]
        self._free.extend(done)
        self._kick()
        if last is not None:
            succeed_in_order(self.env, last, now)
        return True

    def _retire(self, finished: np.ndarray) -> None:
        """Release finished slots' routes (vectorised), with exact byte accounting: what
        rounding left in rem (about 0) goes to the links."""
        self._pool_live -= int(self._len[finished].sum())
        links, coefs = self._gather(finished)
        occ = self._occ
        for i in links.tolist():
            occ[i] -= 1
        lens = self._len[finished]
        w = np.repeat(self._weight[finished], lens)
        rem_nz = np.repeat(self._rem[finished], lens)
        self._add_bytes_at(links, rem_nz * w * coefs)

    def _retire_few(self, finished: list) -> None:
        """:meth:`_retire` one slot at a time (the same additions in the same order)."""
        rem, weight, rid, occ, routes = self._rem_l, self._weight, self._rid, self._occ, self._route_lists
        lists, b = self._list_links, self._link_bytes
        for s in finished:
            links, coefs = routes[rid[s]]
            for i in links:
                occ[i] -= 1
            x = rem[s] * weight[s]
            if lists:
                if x != 0.0:        # (adding +-0 to a counter, never -0, leaves it as it is)
                    x = float(x)
                    for i, c in zip(links, coefs):
                        b[i] += x * c
            else:
                lo = int(self._off[s])
                np.add.at(b, self._pool_links[lo:lo + len(links)], x * self._pool_coefs[lo:lo + len(links)])
            self._pool_live -= len(links)

    def _solve(self) -> None:
        t0 = time.perf_counter()
        self._solve_rates()
        self.solve_wall_s += time.perf_counter() - t0

    def _solve_rates(self) -> None:
        self._version += 1
        if not self._num_active():
            self._load_links = [] if self._list_links else np.empty(0, dtype=np.int64)
            self._load = [] if self._list_links else np.empty(0)
            return
        few = self._act_few()
        act = None if few is not None else self._act()
        self.num_solves += 1
        # Rates depend only on the live flows' routes, weights and caps, in their order (the
        # solver's sums run in that order), and on the capacities, fixed for the run.  A
        # steady pipeline meets the same few flow sets again and again, so their answers
        # are kept: a hit returns the very arrays the solve returned, bit for bit.
        if few is not None:
            slot_key = self._slot_key
            key = tuple([slot_key[s] for s in few])
        else:
            key = (self._rid[act].tobytes(), self._weight[act].tobytes(), self._cap[act].tobytes())
        hit = self._solved.get(key)
        if hit is None:
            if few is not None:
                hit = self._solve_few(few)
            else:
                hit = self._solve_many(act)
            size = 24 * len(key if few is not None else act) + hit[0].nbytes + 16 * len(hit[2])
            if len(self._solved) >= _SOLVE_CACHE_ENTRIES or self._solved_bytes + size > _SOLVE_CACHE_BYTES:
                self._solved.clear()        # a run that never repeats itself: bound the memory
                self._solved_bytes = 0
            self._solved[key] = hit
            self._solved_bytes += size
        else:
            self.num_solve_hits += 1
        self._retime(few, act, hit)

    def _solve_many(self, act: np.ndarray) -> tuple:
        """Rates of the live flows ``act`` and the load they put on links: (rates, loaded
        links, bytes/s on them, the rates as a list for a few flows else None)."""
        lens = self._len[act]
        ptr = np.zeros(act.size + 1, dtype=np.int64)
        np.cumsum(lens, out=ptr[1:])
        links, coefs = self._gather(act)
        rate = max_min_rates(ptr, links, coefs, self.capacity, self._weight[act], self._cap[act])
        load = np.bincount(links, weights=np.repeat(rate * self._weight[act], lens) * coefs,
                           minlength=self.num_links)
        load_links = np.flatnonzero(load)
        load = load[load_links]
        if self._list_links:
            load_links, load = load_links.tolist(), load.tolist()
        return rate, load_links, load, rate.tolist() if act.size <= _FEW else None

    def _solve_few(self, few: list) -> tuple:
        """:meth:`_solve_many` of a few live flows, from the per-route lists: the same solver
        call, and each link's load summed entry by entry from 0.0 in route order, as
        ``np.bincount`` sums it."""
        routes, slot_key = self._route_lists, self._slot_key
        links, coefs, ptr, weights, caps = [], [], [0], [], []
        for s in few:
            rid, w, cap = slot_key[s]
            lk, cf = routes[rid]
            links += lk
            coefs += cf
            ptr.append(len(links))
            weights.append(w)
            caps.append(cap)
        rate = max_min_rates(np.array(ptr, dtype=np.int64), np.array(links, dtype=np.int64), np.array(coefs),
                             self.capacity, np.array(weights), np.array(caps))
        rates = rate.tolist()
        acc: dict = {}
        for f, (x, w) in enumerate(zip(rates, weights)):
            xw = x * w
            for e in range(ptr[f], ptr[f + 1]):
                acc[links[e]] = acc.get(links[e], 0.0) + xw * coefs[e]
        load_links = sorted(i for i, v in acc.items() if v != 0.0)      # (np.flatnonzero)
        load = [acc[i] for i in load_links]
        if not self._list_links:
            load_links, load = np.array(load_links, dtype=np.int64), np.array(load)
        return rate, load_links, load, rates

    def _retime(self, few, act, hit) -> None:
        """Take the rates of a solve (``hit``, :meth:`_solve_many`) and schedule the next
        completion."""
        rate, self._load_links, self._load, rates = hit
        self._stale = True
        # every live flow has bytes left here (_finish_done retired the rest): 0 rate, no end
        if few is not None:
            rem, rate_of = self._rem_l, self._rate_l
            t_next = math.inf
            for s, r in zip(few, rates):
                rate_of[s] = r
                if r > 0:
                    t = rem[s] / r
                    if t < t_next:
                        t_next = t
            t_next = float(t_next)
        else:
            self._rate[act] = rate
            with np.errstate(divide="ignore"):
                t_next = float(np.min(self._rem[act] / rate))
        if not math.isfinite(t_next):
            return          # nothing can progress (no capacity): the engine's deadlock check reports it
        self._call_in(max(t_next, 0.0), partial(self._on_timer, self._version))


class _Template:
    """A parsed group of flows (routes as arrays), with what running it alone costs: its
    rates from a solve of the group alone, and per distinct link the bytes/s and total
    bytes it puts there (cached: rates depend only on routes and capacities)."""

    __slots__ = ("items", "rids", "uniq", "links", "rate", "rate_list", "per_s_list", "isolatable", "duration",
                 "per_s", "total_bytes", "done_runs", "done_busy_s", "admitted", "expected", "_batch")

    def __init__(self, flows):
        items = []
        for links, coefs, size, weight, cap in flows:
            if size <= 0 or len(links) == 0 and not np.isfinite(cap):
                continue
            links = np.asarray(links, dtype=np.int64)
            coefs = np.ones(links.size) if coefs is None else np.asarray(coefs, dtype=float)
            items.append((links, coefs, float(size), float(weight), float(cap)))
        self.items = items
        self.rids: list[int] = []                   # route ids, given by the network that parses it
        self.uniq = np.unique(np.concatenate([it[0] for it in items])) if items else np.empty(0, dtype=np.int64)
        self.links: list[int] = self.uniq.tolist()     # the same, to loop over
        self.rate = None
        self.isolatable = False
        self.duration = 0.0
        self.per_s = self.total_bytes = None
        self.rate_list = self.per_s_list = None     # rate and per_s as lists, once isolatable
        self.done_runs = 0
        self.done_busy_s = 0.0
        self.admitted = 0                           # times started on a network
        self.expected = None
        self._batch = None

    def batch(self) -> tuple:
        """The live flows one start of the group adds, as arrays (cached): flows with the
        same route, size and cap merge into the first of them, whose weight is the sum of
        theirs taken in order (as :meth:`FlowNetwork._admit` adds them one by one).
        Returns (route ids, sizes, weights, caps, route lengths, concatenated links and
        coefficients, the links as a list)."""
        if self._batch is None:
            first: dict[tuple, int] = {}
            chosen, rids, weights = [], [], []
            for it, rid in zip(self.items, self.rids):
                key = (rid, it[2], it[4])
                k = first.get(key)
                if k is None:
                    first[key] = len(chosen)
                    chosen.append(it)
                    rids.append(rid)
                    weights.append(it[3])
                else:
                    weights[k] += it[3]
            links = np.concatenate([it[0] for it in chosen])
            self._batch = (np.array(rids, dtype=np.int64), np.array([it[2] for it in chosen]), np.array(weights),
                           np.array([it[4] for it in chosen]), np.array([it[0].size for it in chosen], dtype=np.int64),
                           links, np.concatenate([it[1] for it in chosen]), links.tolist())
        return self._batch

    def expected_bytes(self) -> np.ndarray:
        """Per distinct link (``uniq``), the bytes one run of the group puts there:
        sum of size x weight x coefficient over its flows (cached)."""
        if self.expected is None:
            out = np.zeros(self.uniq.size)
            for links, coefs, size, weight, _cap in self.items:
                np.add.at(out, np.searchsorted(self.uniq, links), size * weight * coefs)
            self.expected = out
        return self.expected

    def solve_alone(self, capacity: np.ndarray) -> None:
        items = self.items
        lens = np.array([it[0].size for it in items], dtype=np.int64)
        ptr = np.zeros(lens.size + 1, dtype=np.int64)
        np.cumsum(lens, out=ptr[1:])
        links = np.concatenate([it[0] for it in items])
        coefs = np.concatenate([it[1] for it in items])
        weights = np.array([it[3] for it in items])
        sizes = np.array([it[2] for it in items])
        self.rate = max_min_rates(ptr, links, coefs, capacity, weights, np.array([it[4] for it in items]))
        with np.errstate(divide="ignore"):
            t = sizes / self.rate
        if links.size == 0 or not np.isfinite(t).all() or t.max() - t.min() > 1e-12 * t.max():
            return
        self.isolatable = True
        self.duration = float(t.max())
        pos = np.searchsorted(self.uniq, links)
        self.per_s = np.bincount(pos, weights=np.repeat(weights * self.rate, lens) * coefs, minlength=self.uniq.size)
        self.rate_list, self.per_s_list = self.rate.tolist(), self.per_s.tolist()
        self.total_bytes = np.bincount(pos, weights=np.repeat(weights * sizes, lens) * coefs,
                                       minlength=self.uniq.size)
