"""Collectives on the flow network: rendezvous, algorithm choice, latency, flows.

Semantics (NCCL's): every member of a group issues the call; it starts when the last
member arrives and completes for all members together.  Calls match by
``(group_id, seq)`` -- the per-group sequence number -- and a member that issues a
different kind or size under the same number is an error.  Point-to-point transfers
match by a key both sides give (docs/design.md: source stage, destination stage, chunk,
micro-batch, phase).

A started call waits its NCCL latency (:func:`.nccl.latency_us`; a fixed per-step
alpha with the ideal calibration), then puts its plan's channel flows on the network;
it completes when the last flow finishes.  Algorithm and protocol are chosen per call
by least predicted time among those NCCL would enable (:func:`.nccl.enabled_algorithms`),
unless forced.  The prediction is the same model without contention: latency plus the
uncontended transfer time of the plan's flows, divided by NCCL's protocol/algorithm
bandwidth factor; for the tree, whose bandwidth NCCL models as half the ring bus
bandwidth, the prediction follows NCCL's formula.

Everything is callbacks on simpy events: no process per collective, no ``AllOf``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import simpy

from topologies import Cluster, ConfigError
from topologies.constants import Constants, active
from topologies.specs import TIERS

from ..network import FlowNetwork, max_min_rates
from ..network.flows import succeed_in_order
from . import nccl
from .algorithms import ALGORITHMS, PROTOCOLS, CollectiveAlgorithm, Protocol
from .calibration import Calibration, get_calibration
from .plans import ChannelFlow, Plan, alltoall_plan, node_blocks, p2p_plan

__all__ = ["CollectiveEngine", "CollectiveRecord", "CollectiveError", "KINDS", "TINY_CALL_BYTES", "effective_capacity"]

#: Calls of at most this many payload bytes (a grad-norm or loss all-reduce of a few
#: scalars) take their predicted time -- NCCL's latency plus the uncontended bandwidth
#: term -- and put no flows on the network.  Their bandwidth term is below 1 % of their
#: latency on every fabric modelled (4 KiB at 25 GB/s: 0.16 us against >= 10 us of
#: latency), and a world-spanning tree of a few bytes would otherwise mark every host's
#: links with its position in the tree and keep folding from merging them.  The documented
#: default; an engine reads its run's value (:attr:`CollectiveEngine.tiny_call_bytes`).
TINY_CALL_BYTES = 4096

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")


#: Algorithms whose plan on a group inside one NVLink domain crosses only the members'
#: NVLink ports (CollNet's goes through the NICs and the switch fabric).
PORT_ALGOS = frozenset(name for name, a in ALGORITHMS.items() if a.port_local)


def _moved(plan: Plan, ports: np.ndarray, to: np.ndarray) -> Plan:
    """``plan`` with each link ``ports[i]`` replaced by ``to[i]`` (both sorted, the plan's
    links among ``ports``)."""
    # the constructors, not dataclasses.replace: a 131k-GPU job moves 32,768 TP plans
    flows = [ChannelFlow(to[np.searchsorted(ports, f.links)], f.coefs, f.bytes_per_byte, f.inter_node)
             for f in plan.flows]
    return Plan(plan.algo, flows, plan.n_ranks, plan.n_nodes, plan.n_channels, plan.latency_inter_s, plan.intra_hw)


class CollectiveError(RuntimeError):
    """A program issued mismatched collectives (different kind or size at one sequence number)."""


def effective_capacity(cluster: Cluster, cal: Calibration) -> np.ndarray:
    """Link capacities derated by the calibration's per-tier efficiency."""
    eff = np.array([cal.tier_efficiency.get(t.value, 1.0) for t in TIERS])
    return cluster.link_capacity * eff[cluster.link_tier]


@dataclass(slots=True)
class CollectiveRecord:
    """One completed call (for tests, timelines and reports)."""

    group_id: int
    seq: int
    kind: str
    size_bytes: float
    algo: str
    proto: str
    arrive_s: float
    start_s: float
    end_s: float
    latency_s: float


@dataclass(slots=True)
class _Call:
    kind: str
    size: float
    expected: int
    algo: str | None
    proto: str | None
    sizes: np.ndarray | None
    root: int | None
    arrived: int = 0
    first_s: float = 0.0
    event: simpy.Event | None = None


class CollectiveEngine:
    """Runs collectives of registered groups over a :class:`FlowNetwork`.

    Parameters
    ----------
    env : simpy.Environment
    cluster : Cluster
    calibration : Calibration or name, optional
        Defaults to the cluster GPU's generation.
    network : FlowNetwork, optional
        Share one network between several engines or other traffic; by default the
        engine builds one on the calibrated link capacities.
    constants : Constants, optional
        The :class:`~topologies.constants.Constants` of the run (default: the active ones):
        the default calibrations (``CALIBRATIONS``), NCCL's tables (:attr:`nccl`) and
        :data:`TINY_CALL_BYTES` (:attr:`tiny_call_bytes`) are read from it once, here.
    """

    def __init__(self, env: simpy.Environment, cluster: Cluster, calibration: "Calibration | str | None" = None,
                 network: FlowNetwork | None = None, constants: Constants | None = None):
        self.env = env
        self.cluster = cluster
        c = self.constants = active() if constants is None else constants
        cals = c.get("simulator.collectives.calibration.CALIBRATIONS")
        self.cal = (get_calibration(calibration, cals) if calibration is not None
                    else cals[cluster.gpu.calibration or cluster.gpu.generation])
        self.nccl = nccl.tables(c)
        self.tiny_call_bytes = c.get("simulator.collectives.engine.TINY_CALL_BYTES")
        self.capacity = effective_capacity(cluster, self.cal)
        self.net = network if network is not None else FlowNetwork(env, self.capacity)
        self.groups: dict[int, tuple[int, ...]] = {}
        self._calls: dict[tuple[int, int], _Call] = {}
        self._p2p: dict[tuple, list] = {}
        self.p2p_start: dict = {}
        self.call_start: dict = {}
        """When each collective call started (its last member arrived), by (group id, seq)."""
        """When each matched transfer started (both sides posted), by key."""
        self._stretch: dict = {}            # concurrent_s: (groups, kind, algo) -> slowdown together
        self._plan_cache: dict[tuple, tuple[Plan, float]] = {}
        self._forms: dict[tuple, tuple[tuple, np.ndarray] | None] = {}
        self._form_plans: dict[tuple, tuple[Plan, float, np.ndarray]] = {}
        self._form_predictions: dict[tuple, dict] = {}
        self._shapes: dict[tuple, tuple] = {}
        self.records: list[CollectiveRecord] = []
        self.keep_records = True
        """Whether to append a :class:`CollectiveRecord` per call to :attr:`records` (a
        streamed timeline keeps none: simulator.engine.stream)."""
        self.generation = cluster.gpu.generation
        self.nvls_capable = (cluster.gpu.nvls and cluster.spec.nvls and cluster.nvlink_domain_size > 2
                             and cluster.spec.scaleup_topology == "switch")
        self.folding = None
        self._mult: dict[int, int] = {}
        self._qcache: dict[tuple, list] = {}
        self._p2p_plans: dict[tuple, tuple] = {}       # (src, dst, bytes) -> (plan, latency): send_recv
        self._prepared: dict[tuple, tuple] = {}
        # all-at-once calls by signature (group, kind, size, count, algo, proto, root): what
        # _start prepared for them and the network's template of their flows (_issue_whole)
        self._whole: dict[tuple, tuple] = {}
        self.coupled_all_to_all = False
        """Approximation (opt-in): an all-to-all moves as one coupled flow, see :meth:`_coupled`."""

    def set_folding(self, folding) -> None:
        """Run on the quotient network of a :class:`~simulator.engine.fold.Folding`: a registered
        group then stands for ``multiplicity`` groups of its cell, a transfer for its cell's,
        and flows cross quotient links (a fresh network on the quotient capacities)."""
        self.folding = folding
        if folding is not None and folding.link_cell is not None:
            self.net = FlowNetwork(self.env, folding.capacity(self.capacity))
        self._qcache.clear()
        self._prepared.clear()
        self._whole.clear()

    def _quotient(self, routes: list, mult: int) -> list:
        """``(links, coefs)`` routes on the network the engine runs on (see set_folding)."""
        return routes if self.folding is None else self.folding.quotient_routes(routes, mult)

    # -- groups ------------------------------------------------------------------------------
    def register_group(self, members, group_id: int | None = None, multiplicity: int = 1) -> int:
        """Register a group of GPUs; with folding, it stands for ``multiplicity`` groups of
        its cell (a call then expects ``multiplicity x len(members)`` arrivals)."""
        members = tuple(int(m) for m in members)
        if len(set(members)) != len(members):
            raise ConfigError("group", members, "a GPU appears twice in one group")
        for m in members:
            if not 0 <= m < self.cluster.num_gpus:
                raise ConfigError("group", m, f"GPU ids must be in [0, {self.cluster.num_gpus})")
        gid = len(self.groups) if group_id is None else group_id
        if gid in self.groups and self.groups[gid] != members:
            raise ConfigError("group_id", gid, "already registered with other members")
        self.groups[gid] = members
        self._mult[gid] = int(multiplicity)
        self._whole.clear()             # (a signature's expected count may have changed)
        return gid

    # -- plans and prediction ----------------------------------------------------------------
    def _domain_form(self, members: tuple[int, ...]) -> tuple[tuple, np.ndarray] | None:
        """What the plans and predictions of a group inside one NVLink domain depend on, and
        its ports sorted; None for a group that spans domains (cached per group).

        Such a group's routes cross only its members' NVLink ports
        (:meth:`~topologies.routing.Router.domain_ports`), so its plans are functions of
        its size and of those port ids as labels: their order, member by member, and their
        capacities.  Groups of one form -- a TP group on every node, translations of one
        another -- have the same plans up to the order-preserving map between their sorted
        ports, and bit-identical max-min rates and predictions (the solver reads link ids
        only through order and capacity).  A group naming a GPU twice gets no form."""
        form = self._forms.get(members, False)
        if form is False:
            form = self._forms[members] = self._find_form(members)
        return form

    def _find_form(self, members: tuple[int, ...]) -> tuple[tuple, np.ndarray] | None:
        ports = self.cluster.router.domain_ports(members)
        if ports is None:
            return None
        order = np.argsort(ports, kind="stable")
        sorted_ports = ports[order]
        if (sorted_ports[1:] == sorted_ports[:-1]).any():
            return None
        return (len(members), order.tobytes(), self.capacity[ports].tobytes()), sorted_ports

    def domain_forms(self, gpus: np.ndarray) -> tuple[np.ndarray, list, np.ndarray]:
        """:meth:`_domain_form` of many groups of one size at once (``gpus``: a row per
        group): whether each has a form, the distinct forms in order of first occurrence,
        each group's form (an index into them; -1 for none) and each group's sorted ports
        (a row per group).  The same forms, bit for bit, as one group at a time."""
        gpus = np.asarray(gpus, dtype=np.int64)
        m, k = gpus.shape
        ports = self.cluster.router.domain_ports_many(gpus)
        ok = np.zeros(m, dtype=bool) if ports is None else (ports >= 0).all(axis=1)
        if ports is None or not ok.any():
            return [], np.full(m, -1, dtype=np.int64), np.empty((m, 2 * k), dtype=np.int64)
        order = np.argsort(ports, axis=1, kind="stable")
        sorted_ports = np.take_along_axis(ports, order, axis=1)
        ok &= ~(sorted_ports[:, 1:] == sorted_ports[:, :-1]).any(axis=1)
        caps = self.capacity[np.where(ports >= 0, ports, 0)]
        key = np.concatenate([order.astype(np.int64), caps.view(np.int64)], axis=1)
        rows = np.flatnonzero(ok)
        _, first, inv = np.unique(key[rows], axis=0, return_index=True, return_inverse=True)
        rank = np.empty(first.size, dtype=np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(first.size)
        form_of = np.full(m, -1, dtype=np.int64)
        form_of[rows] = rank[inv.ravel()]
        firsts = rows[np.sort(first)]
        forms = [(k, order[i].tobytes(), self.capacity[ports[i]].tobytes()) for i in firsts.tolist()]
        return forms, form_of, sorted_ports

    def form_plan(self, form: tuple, kind: str, algo: str):
        """The plan kept for groups of ``form`` (``(plan, seconds per byte, its sorted ports)``,
        see :meth:`plan`), or None when none has been built yet."""
        return self._form_plans.get((form, kind, algo, None))

    def domain_form(self, members) -> tuple | None:
        """The form of a group inside one NVLink domain (:meth:`_domain_form`): groups of one
        form get the same predictions, hence the same choices, and the same plans of the
        :data:`PORT_ALGOS` up to moving them onto each group's ports; None for a group that
        spans domains."""
        form = self._domain_form(tuple(members))
        return None if form is None else form[0]

    def plan(self, members: tuple[int, ...], kind: str, algo: str, root: int | None = None) -> tuple[Plan, float]:
        """The plan and its uncontended seconds per payload byte (cached; within one NVLink
        domain, built once per form and moved onto each group's ports, see :meth:`_domain_form`)."""
        key = (members, kind, algo, root)
        hit = self._plan_cache.get(key)
        if hit is not None:
            return hit
        a = ALGORITHMS.get(algo)
        form = (self._domain_form(members) if a is not None and a.port_local and (root is None or root in members)
                else None)
        fkey = None if form is None else (form[0], kind, algo, None if root is None else members.index(root))
        ref = None if fkey is None else self._form_plans.get(fkey)
        if ref is not None:
            p, spb, ports = ref
            hit = (_moved(p, ports, form[1]), spb)
        else:
            hit = self._build_plan(members, kind, algo, root)
            if fkey is not None:
                self._form_plans[fkey] = (*hit, form[1])
        self._plan_cache[key] = hit
        return hit

    def _build_plan(self, members, kind: str, algo: str, root: int | None) -> tuple[Plan, float]:
        a = ALGORITHMS.get(algo)
        if a is None:
            raise ConfigError("algo", algo, f"unknown algorithm; known: {', '.join(nccl.ALGORITHMS)}")
        p = a.build_plan(self.cluster, members, kind, root, self.nccl)
        return p, self._seconds_per_byte(p)

    def _seconds_per_byte(self, p: Plan) -> float:
        """Uncontended transfer time per payload byte: max over flows of bytes / rate."""
        return self._spb(p.flows)

    def _spb(self, flows) -> float:
        """Time per payload byte of ``flows`` running together at max-min rates."""
        if not flows:
            return 0.0
        lens = [f.links.size for f in flows]
        ptr = np.zeros(len(lens) + 1, dtype=np.int64)
        ptr[1:] = np.cumsum(lens)
        links = np.concatenate([f.links for f in flows])
        coefs = np.concatenate([f.coefs for f in flows])
        rate = max_min_rates(ptr, links, coefs, self.capacity)
        bpb = np.array([f.bytes_per_byte for f in flows])
        return float(np.max(bpb / rate))

    def bandwidth_factor(self, kind: str, algo: str, proto: str, n_nodes: int, size: float,
                         n_ranks: int = 0) -> float:
        """Fraction of the plan's uncontended bandwidth a call reaches: NCCL's factor for the
        (algorithm, protocol) times the calibration's (1 with the ideal calibration)."""
        return self._bandwidth_factor(kind, ALGORITHMS[algo], PROTOCOLS[proto], n_nodes, size, n_ranks)

    def _bandwidth_factor(self, kind: str, a: CollectiveAlgorithm, p: Protocol, n_nodes: int, size: float,
                          n_ranks: int = 0) -> float:
        if self.cal.ideal:
            return 1.0
        f = a.nccl_bandwidth_factor(kind, p, n_nodes, size, self.nccl) * a.efficiency(self.cal, self.generation)
        return a.size_scaled(f, self.cal, n_nodes, n_ranks)

    def ll_cap(self, algo: str, proto: str, n_nodes: int) -> float | None:
        """NCCL's cap on LL bus bandwidth (bytes/s), or None."""
        return self._ll_cap(ALGORITHMS[algo], PROTOCOLS[proto], n_nodes)

    def _ll_cap(self, a: CollectiveAlgorithm, p: Protocol, n_nodes: int) -> float | None:
        if self.cal.ideal or not p.ll_capped or not a.ll_capped:
            return None
        row = self.nccl.ll_max_bw_gbps[self.generation]
        return row[min(n_nodes, 3) - 1] * 1e9

    @staticmethod
    def _bus_per_alg(kind: str, plan: Plan) -> float:
        """Bus bandwidth per unit algorithm bandwidth, for comparing with bus-bandwidth caps."""
        n = plan.n_ranks
        return {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n,
                "reduce_scatter": (n - 1) / n}.get(kind, 1.0)

    def latency_s(self, kind: str, plan: Plan, proto: str, size: float) -> float:
        """Latency of one call with this plan and protocol (seconds)."""
        return self._latency_s(kind, plan, ALGORITHMS[plan.algo], PROTOCOLS[proto], size)

    def _latency_s(self, kind: str, plan: Plan, a: CollectiveAlgorithm, p: Protocol, size: float) -> float:
        cal = self.cal
        if cal.ideal:
            return a.ideal_latency_s(kind, plan.n_ranks, plan.n_nodes, cal.step_latency_s)
        lat_inter_us = plan.latency_inter_s * 1e6 if cal.link_latency else 0.0
        lat = a.latency_us(kind, p, plan.n_ranks, plan.n_nodes, plan.intra_hw, lat_inter_us,
                           cal.intra_latency_scale, cal.inter_latency_scale, self.nccl)
        lat = a.plateau(lat, cal, self.generation, kind, p, plan, size, self.nccl)
        return (lat + cal.call_latency_us) * 1e-6

    def predict(self, members, kind: str, size: float) -> dict[tuple[str, str], float]:
        """Predicted time (s) of every enabled (algorithm, protocol) for one call (within one
        NVLink domain, computed once per form: see :meth:`_domain_form`)."""
        members = tuple(members)
        form = self._domain_form(members)
        if form is None:
            return self._predict(members, kind, size)
        fkey = (form[0], kind, size)
        hit = self._form_predictions.get(fkey)
        if hit is None:
            hit = self._form_predictions[fkey] = self._predict(members, kind, size)
        return dict(hit)

    def _shape(self, members: tuple[int, ...]) -> tuple[list[list[int]], int, bool]:
        """A group's members by node, members per node, and whether every node has as many
        (cached: a data-parallel group's calls of several sizes are predicted on one group)."""
        hit = self._shapes.get(members)
        if hit is None:
            blocks = node_blocks(self.cluster, members)
            ppn = len(members) // len(blocks)
            hit = self._shapes[members] = (blocks, ppn, set(map(len, blocks)) == {ppn})
        return hit

    def _predict(self, members: tuple[int, ...], kind: str, size: float) -> dict[tuple[str, str], float]:
        blocks, ppn, equal = self._shape(members)
        N = len(blocks)
        out = {}
        sharp = self.cluster.spec.sharp
        tiny = size <= self.tiny_call_bytes and N > 1
        for algo, proto in nccl.enabled_algorithms(kind, N, self.nvls_capable and equal, ppn, sharp):
            a, p = ALGORITHMS[algo], PROTOCOLS[proto]
            if a.equal_nodes and not equal:
                continue
            if tiny:
                # latency only (the bandwidth term is negligible, see TINY_CALL_BYTES): no
                # flows to build, which matters for world-wide calls on 10^4 GPUs
                out[(algo, proto)] = self._latency_s(kind, self._shell(members, blocks, algo), a, p, size)
                continue
            plan, spb = a.predicted_plan(self, members, kind)
            f = self._bandwidth_factor(kind, a, p, N, size, len(members))
            t_bw = size * spb / f
            cap = self._ll_cap(a, p, N)
            if cap is not None:      # LL bus bandwidth is capped at llMaxBw
                t_bw = max(t_bw, size * self._bus_per_alg(kind, plan) / cap)
            lat = self._latency_s(kind, plan, a, p, size)
            out[(algo, proto)] = lat + t_bw
        return out

    def uncontended_s(self, members, kind: str, size: float) -> float:
        """One call's time on an idle network: NCCL's choice (the least predicted time), or
        for an all-to-all (``size`` bytes per rank, equal shares to every rank) its latency
        plus the slowest pair at max-min rates."""
        members = tuple(members)
        if len(members) < 2 or size <= 0:
            return 0.0
        if kind == "all_to_all":
            plan = self.alltoall_routes(members)
            key = (members, "a2a spb")
            spb = self._plan_cache.get(key)
            if spb is None:
                spb = self._plan_cache[key] = self._seconds_per_byte(plan)
            return self.latency_s(kind, plan, "Simple", size) + size / len(members) * spb
        if kind == "send_recv":
            plan = p2p_plan(self.cluster, members[0], members[1])
            return self.latency_s(kind, plan, "Simple", size) + size * self._seconds_per_byte(plan)
        return min(self.predict(members, kind, size).values())

    def concurrent_s(self, groups, kind: str, size: float) -> float:
        """One call's time when every group of ``groups`` makes the same call at once (the
        DP reductions of a stage's TP peers, every EP group of a stage): each group uses the
        plan NCCL picks for it alone (:meth:`uncontended_s`), and the bandwidth part
        stretches by how much slower the groups' flows run together, at max-min rates,
        than the first group's alone.  Latency is unchanged."""
        groups = [tuple(g) for g in groups]
        first = groups[0]
        alone = self.uncontended_s(first, kind, size)
        if len(groups) == 1 or alone == 0.0 or size <= self.tiny_call_bytes:
            return alone
        if kind == "all_to_all":
            lat = self.latency_s(kind, self.alltoall_routes(first), "Simple", size)
            ref_kind, ref_algo = kind, "a2a"
        else:
            algo, proto = self.choose(first, kind, size)
            ref_kind, ref_algo = ALGORITHMS[algo].stretch_reference(kind)
            lat = self.latency_s(kind, self.plan(first, kind, algo)[0], proto, size)
        key = (tuple(groups), ref_kind, ref_algo)
        stretch = self._stretch.get(key)
        if stretch is None:
            if kind == "all_to_all":
                plans = [self.alltoall_routes(g) for g in groups]
            else:
                plans = [self.plan(g, ref_kind, ref_algo)[0] for g in groups]
            flows = [f for p in plans for f in p.flows]
            spb_alone = self._spb(plans[0].flows) if flows else 0.0
            stretch = self._spb(flows) / spb_alone if spb_alone > 0 else 1.0
            self._stretch[key] = stretch
        return lat + (alone - lat) * stretch

    def _shell(self, members, blocks, algo: str) -> Plan:
        """A flowless plan with the shape the latency model needs (ranks, nodes, the largest
        inter-node route latency between consecutive nodes)."""
        key = (members, "shell")
        lat = self._plan_cache.get(key)
        if lat is None:
            r = self.cluster.router
            heads = np.array([b[0] for b in blocks], dtype=np.int64)
            lat = float(r.path_latencies(*r.routes_flat(heads, np.roll(heads, -1))).max(initial=0.0))
            self._plan_cache[key] = lat
        return Plan(algo, [], len(members), len(blocks), 1, lat)

    def choose(self, members, kind: str, size: float, algo: str | None = None,
               proto: str | None = None) -> tuple[str, str]:
        """NCCL's choice: least predicted time, optionally restricted to ``algo``/``proto``."""
        if algo is not None and proto is not None:
            return algo, proto
        pred = self.predict(members, kind, size)
        cands = [(t, a, p) for (a, p), t in pred.items()
                 if (algo is None or a == algo) and (proto is None or p == proto)]
        if not cands:
            raise ConfigError("algo", (algo, proto), f"not enabled for {kind} on this group; enabled: {sorted(pred)}")
        t, a, p = min(cands, key=lambda x: (x[0], ALGORITHMS[x[1]].index, PROTOCOLS[x[2]].index))
        return a, p

    # -- issuing -----------------------------------------------------------------------------
    def issue(self, group_id: int, seq: int, kind: str, size_bytes: float, *, count: int = 1,
              algo: str | None = None, proto: str | None = None, sizes: np.ndarray | None = None,
              root: int | None = None) -> simpy.Event:
        """One member (or ``count`` folded members) arrives at call ``seq`` of ``group_id``.

        ``size_bytes`` follows nccl-tests: the all-reduce/broadcast buffer, the full
        (gathered / unscattered) buffer for all-gather and reduce-scatter, and for
        all-to-all the bytes each member sends in total (split evenly), unless
        ``sizes[i, j]`` gives every pair.  Returns the completion event (shared by all
        members).
        """
        if sizes is None:
            whole = self._whole.get((group_id, kind, size_bytes, count, algo, proto, root))
            if whole is not None and whole[5] is self.net:
                key = (group_id, seq)
                if key not in self.call_start and key not in self._calls:
                    return self._issue_whole(key, whole)
        return self._issue(group_id, seq, kind, size_bytes, count, algo, proto, sizes, root)

    def _issue_whole(self, key: tuple, whole: tuple) -> simpy.Event:
        """:meth:`issue` of a call every member of which arrives at once (a folded cell holding
        the whole group cell) whose call signature has been issued before: the same events,
        scheduled in the same order at the same times, and the same records, as
        :meth:`_start` then :meth:`_launch` would give, from what they computed then."""
        env = self.env
        now = env._now                 # (env.now, without the property's call)
        ev = simpy.Event(env)
        self.call_start[key] = now
        kind, size, algo, proto, lat, _net, t, asked = whole
        if t is None:                   # a tiny call: _launch's timer on a fresh _Call
            count, forced_algo, forced_proto, root = asked
            self._launch(_Call(kind, size, count, forced_algo, forced_proto, None, root, count, now, ev),
                         key[0], key[1], algo, proto, lat, None)
            return ev
        if self.keep_records:
            ev.callbacks.append(partial(self._record_whole, key[0], key[1], kind, size, algo, proto, now, lat))
        return self.net.start_template(t, lat, ev)

    def _record_whole(self, group_id, seq, kind, size, algo, proto, start, lat, _ev) -> None:
        self.records.append(CollectiveRecord(group_id, seq, kind, size, algo, proto, start, start, self.env._now, lat))

    def _issue(self, group_id, seq, kind, size_bytes, count, algo, proto, sizes, root) -> simpy.Event:
        if kind not in KINDS or kind == "send_recv":
            raise ConfigError("kind", kind, f"must be one of {', '.join(k for k in KINDS if k != 'send_recv')}")
        members = self.groups.get(group_id)
        if members is None:
            raise ConfigError("group_id", group_id, "not registered")
        key = (group_id, seq)
        call = self._calls.get(key)
        if call is None and key in self.call_start:
            # the call has completed with every member: one more arrival is a rank issuing into
            # a group it is not in (or issuing one call twice), which would otherwise start a
            # second, phantom call under the same number
            raise CollectiveError(f"group {group_id} call {seq}: {kind} issued after the call completed with all "
                                  f"{len(members)} members (a rank outside the group, or one call issued twice)")
        mult = self._mult[group_id]
        expected = len(members) * mult
        if call is None and count == expected:
            # every member arrives at once (a folded cell holding the whole group cell)
            call = _Call(kind, float(size_bytes), count, algo, proto, sizes, root, count, self.env.now,
                         self.env.event())
            self.call_start[key] = self.env.now
            self._start(group_id, seq, members, call, mult)
            if sizes is None and kind != "all_to_all" and len(members) > 1:
                self._keep_whole(group_id, kind, size_bytes, count, call, mult)
            return call.event
        if call is None:
            call = _Call(kind, float(size_bytes), expected, algo, proto, sizes, root,
                         first_s=self.env.now, event=self.env.event())
            self._calls[key] = call
        elif call.kind != kind or call.size != float(size_bytes):
            raise CollectiveError(f"group {group_id} call {seq}: {kind} of {size_bytes} bytes does not match "
                                  f"the {call.kind} of {call.size} bytes its other members issued")
        call.arrived += count
        if call.arrived > call.expected:
            raise CollectiveError(f"group {group_id} call {seq}: more arrivals than members")
        if call.arrived == call.expected:
            del self._calls[key]
            self.call_start[key] = self.env.now
            self._start(group_id, seq, members, call, mult)
        return call.event

    def _keep_whole(self, group_id: int, kind: str, size_bytes, count: int, call: _Call, mult: int) -> None:
        """Keep what :meth:`_start` prepared for this all-at-once call, for
        :meth:`_issue_whole` to reuse on the group's later calls of the same signature."""
        ckey = (group_id, kind, call.size, call.algo, call.proto, call.root, mult)
        algo, proto, lat, flows = self._prepared[ckey]
        t = None if flows is None else self.net.template(flows, ckey)
        self._whole[(group_id, kind, size_bytes, count, call.algo, call.proto, call.root)] = (
            kind, call.size, algo, proto, lat, self.net, t, (count, call.algo, call.proto, call.root))

    def pending(self) -> list[str]:
        """Calls and transfers still waiting for members (for deadlock reports)."""
        out = [f"group {g} call {s}: {c.kind}, {c.arrived}/{c.expected} members arrived"
               for (g, s), c in self._calls.items()]
        out += [f"p2p {k}: waiting for its peer" for k in self._p2p]
        return out

    def _start(self, group_id: int, seq: int, members, call: _Call, mult: int = 1) -> None:
        env = self.env
        size = call.size
        if call.kind == "all_to_all":
            n = len(members)
            sizes = call.sizes if call.sizes is not None else np.full((n, n), size / n)
            if sizes.shape != (n, n):
                raise ConfigError("sizes", sizes.shape, f"must be ({n}, {n}) for this group")
            akey = (group_id, sizes.tobytes(), mult)
            prepared = self._prepared.get(akey)
            if prepared is None:
                plan = self.alltoall_routes(members)
                rkey = ("a2a routes", group_id, mult)
                routes = self._qcache.get(rkey)
                if routes is None:
                    routes = self._qcache[rkey] = self._quotient([(f.links, f.coefs) for f in plan.flows], mult)
                ii, jj = np.nonzero(~np.eye(n, dtype=bool))
                nbytes = sizes[ii, jj]
                if self.coupled_all_to_all:
                    flows = self._coupled(group_id, mult, n, routes, nbytes)
                else:
                    flows = self._merge([(*routes[p], float(nbytes[p]), 1.0, np.inf)
                                         for p in np.flatnonzero(nbytes > 0).tolist()])
                prepared = (self.latency_s(call.kind, plan, "Simple", size), flows)
                if len(self._prepared) < 4096:       # skewed routing: a new matrix per layer and micro-batch
                    self._prepared[akey] = prepared
            self._launch(call, group_id, seq, "direct", "Simple", prepared[0], prepared[1], akey)
            return
        elif len(members) == 1:
            # (not ``last``: this runs inside the issuing member's process, which goes on)
            self._finish(call, group_id, seq, "none", "none", env.now, 0.0)
            return
        else:
            # a call's algorithm, latency and flows depend only on these: prepared once
            ckey = (group_id, call.kind, size, call.algo, call.proto, call.root, mult)
            prepared = self._prepared.get(ckey)
            if prepared is None:
                prepared = self._prepared[ckey] = self._prepare(members, call, mult)
            algo, proto, lat, flows = prepared
            self._launch(call, group_id, seq, algo, proto, lat, flows, ckey)

    def _coupled(self, group_id: int, mult: int, n: int, routes: list, nbytes: np.ndarray) -> list:
        """An all-to-all as one coupled flow per source (the ``coupled_all_to_all``
        approximation), instead of one flow per (source, destination) pair.

        A source's pairs are summed per link of their routes; its flow crosses each loaded
        link with coefficient ``link bytes / source total``, so it moves at the pace of its
        most loaded link and every link carries exactly the bytes the pairs put there.  It
        stands for as many member flows as the source has destinations with bytes (its
        weight), so against other traffic on its NIC it keeps the share its pairs would
        get.  What it gives up: a pair that would finish early no longer hands its
        bandwidth to the source's others before the slowest pair is done, so a source's
        bytes finish together.  An uneven all-to-all then re-solves the network once per
        source, not once per pair (``n`` finishes, not ``n (n - 1)``).
        """
        key = ("a2a per source", group_id, mult)
        csr = self._qcache.get(key)
        if csr is None:                                # routes: the n (n - 1) pairs, row-major
            lens = np.array([r[0].size for r in routes], dtype=np.int64)
            links = np.concatenate([r[0] for r in routes])
            coefs = np.concatenate([r[1] for r in routes])
            uniq, pos = np.unique(links, return_inverse=True)
            src = np.repeat(np.arange(len(routes)) // (n - 1), lens)
            csr = self._qcache[key] = (lens, src * uniq.size + pos.ravel(), coefs, uniq)
        lens, cell, coefs, uniq = csr
        load = np.bincount(cell, weights=np.repeat(nbytes, lens) * coefs,
                           minlength=n * uniq.size).reshape(n, uniq.size)
        by_src = nbytes.reshape(n, n - 1)
        total = by_src.sum(axis=1)
        members = (by_src > 0).sum(axis=1)
        flows = []
        for s in np.flatnonzero(total > 0).tolist():
            live = load[s] > 0
            flows.append((uniq[live], load[s, live] / total[s], float(total[s] / members[s]), float(members[s]),
                          np.inf))
        return self._merge(flows)

    def _prepare(self, members, call: _Call, mult: int) -> tuple:
        """(algorithm, protocol, latency, flows) of a call; a tiny call (TINY_CALL_BYTES)
        has its predicted time as latency and no flows."""
        size = call.size
        algo, proto = self.choose(members, call.kind, size, call.algo, call.proto)
        if size <= self.tiny_call_bytes:
            return algo, proto, self.predict(members, call.kind, size)[(algo, proto)], None
        a, p = ALGORITHMS[algo], PROTOCOLS[proto]        # resolved once per call
        plan = self.plan(members, call.kind, algo, call.root)[0]
        scale = size / self._bandwidth_factor(call.kind, a, p, plan.n_nodes, size, len(members))
        return (algo, proto, self._latency_s(call.kind, plan, a, p, size),
                self._flows(call.kind, plan, a, p, size, scale, mult))

    def _flows(self, kind, plan, a: CollectiveAlgorithm, p: Protocol, size, scale, mult) -> list:
        cap = self._ll_cap(a, p, plan.n_nodes)
        t_min = size * self._bus_per_alg(kind, plan) / cap if cap else 0.0
        routes = self._quotient([(f.links, f.coefs) for f in plan.flows], mult)
        flows = []
        for f, (links, coefs) in zip(plan.flows, routes):
            size = f.bytes_per_byte * scale
            flows.append((links, coefs, size, 1.0, size / t_min if t_min > 0 else np.inf))
        return self._merge(flows)

    def _merge(self, flows: list) -> list:
        """With folding, flows of one flow cell have the same quotient route (equitability;
        :meth:`~simulator.engine.fold.Folding.quotient_routes` rounds away the summation order):
        one weighted flow stands for them."""
        if self.folding is None:
            return flows
        out: list = []
        seen: dict[tuple, int] = {}
        for links, coefs, size, w, cap in flows:
            key = (links.tobytes(), coefs.tobytes(), size, cap)
            entry = seen.get(key)
            if entry is None:
                seen[key] = len(out)
                out.append((links, coefs, size, w, cap))
            else:
                l0, c0, s0, w0, cap0 = out[entry]
                out[entry] = (l0, c0, s0, w0 + w, cap0)
        return out

    def alltoall_routes(self, members) -> Plan:
        """The all-to-all plan with every (source, destination) pair, in row-major order
        (``bytes_per_byte`` 1): routes for any sizes matrix (cached per group)."""
        members = tuple(members)
        key = (members, "a2a")
        hit = self._plan_cache.get(key)
        if hit is None:
            n = len(members)
            hit = self._plan_cache[key] = (alltoall_plan(self.cluster, members, np.ones((n, n))), 0.0)
        return hit[0]

    def _launch(self, call, group_id, seq, algo, proto, lat, flows, key=None) -> None:
        env = self.env
        start = env.now
        if flows is None:               # a tiny call: its predicted time, no flows
            env.timeout(lat).callbacks.append(
                lambda _e: self._finish(call, group_id, seq, algo, proto, start, lat, True))
        else:
            ev = call.event
            if self.keep_records:
                ev.callbacks.append(lambda _e: self.records.append(CollectiveRecord(
                    group_id, seq, call.kind, call.size, algo, proto, call.first_s, start, env.now, lat)))
            self.net.transfer_group(flows, key, delay=lat, event=ev)

    def _finish(self, call: _Call, group_id, seq, algo, proto, start, lat, last: bool = False) -> None:
        """Complete ``call`` now.  ``last``: this is the last act of the processing of the
        event being processed, so its event may succeed in order (:func:`succeed_in_order`).
        It is from the sole callback of a private event: a tiny call's timer (:meth:`_launch`),
        a transfer's completion (:meth:`send_recv`, whose event nothing else sees); not from
        :meth:`_start`, which runs inside a member's issue."""
        now = self.env.now
        if self.keep_records:
            self.records.append(CollectiveRecord(group_id, seq, call.kind, call.size, algo, proto, call.first_s,
                                                 start, now, lat))
        if last:
            succeed_in_order(self.env, call.event, now)
        else:
            call.event.succeed(now)

    # -- point to point ----------------------------------------------------------------------
    def send_recv(self, key, src: int, dst: int, size_bytes: float, side: str, multiplicity: int = 1) -> simpy.Event:
        """One side (``'send'`` or ``'recv'``) of a transfer matched by ``key``.

        The transfer starts when both sides have arrived (rendezvous, as NCCL's
        blocking send/recv pairs) and completes for both together.  With folding it
        stands for ``multiplicity`` identical transfers of its cell.
        """
        if side not in ("send", "recv"):
            raise ConfigError("side", side, "must be 'send' or 'recv'")
        entry = self._p2p.get(key)
        if entry is None:
            ev = self.env.event()
            self._p2p[key] = [side, src, dst, float(size_bytes), ev, self.env.now]
            return ev
        other, s, d, size, ev, first = entry
        if other == side or (s, d, size) != (src, dst, float(size_bytes)):
            raise CollectiveError(f"p2p {key}: {side} {src}->{dst} {size_bytes} B does not match "
                                  f"{other} {s}->{d} {size} B")
        del self._p2p[key]
        self.p2p_start[key] = self.env.now
        planned = self._p2p_plans.get((src, dst, size))
        if planned is None:
            plan = p2p_plan(self.cluster, src, dst)
            planned = self._p2p_plans[(src, dst, size)] = (plan, self.latency_s("send_recv", plan, "Simple", size))
        plan, lat = planned
        start = self.env.now
        call = _Call("send_recv", size, 2, "direct", "Simple", None, None, first_s=first, event=ev)

        def go(_e):
            rkey = ("p2p", src, dst, multiplicity)
            route = self._qcache.get(rkey)
            if route is None:
                f = plan.flows[0]
                route = self._qcache[rkey] = self._quotient([(f.links, f.coefs)], multiplicity)[0]
            done = self.net.transfer_group([(*route, size, 1.0, np.inf)], rkey + (size,))
            done.callbacks.append(lambda _x: self._finish(call, -1, key, "direct", "Simple", start, lat, True))

        if lat > 0:
            self.env.timeout(lat).callbacks.append(go)
        else:
            go(None)
        return ev
