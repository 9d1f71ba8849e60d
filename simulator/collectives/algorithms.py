"""Collective algorithms and protocols behind one interface, chosen through a registry.

Each algorithm NCCL can run (ring, tree, NVLS, NVLS-tree, CollNet Direct) and clustersim's
``direct`` (all-to-all pairs, send/recv) is one :class:`CollectiveAlgorithm` subclass
answering what the engine asks of it: its plan (:mod:`.plans`), NCCL's latency
(:func:`CollectiveAlgorithm.latency_us`, tuning.cc), NCCL's bandwidth factor, the
calibration's efficiency, whether it is capped by ``llMaxBw``, how its predicted
bandwidth is found.  Protocols (``LL``, ``LL128``, ``Simple``) are :class:`Protocol`
value objects holding the factors the model reads from them.

The engine resolves ``ALGORITHMS[name]`` and ``PROTOCOLS[name]`` once per call (or per
prediction) and asks the objects; which algorithm NCCL *enables* for a call stays the
data-driven :func:`.nccl.enabled_algorithms`.  NCCL's tables are defined in :mod:`.nccl`;
the methods that read them take them as an argument (``t``, a :class:`.nccl.NcclTables`,
built by the engine from its run's constants, :mod:`topologies.constants`).

To add an algorithm: subclass :class:`CollectiveAlgorithm`, give it a ``name`` (the key
of NCCL's tables in :mod:`.nccl` if it has rows there), a ``build_plan``, a
``_latency`` (or ``latency_us``) and ``ideal_latency_s``, override what differs from the
defaults, and register an instance with :func:`register`.
"""

from __future__ import annotations

from dataclasses import dataclass

from topologies import ConfigError

from . import nccl
from .plans import Plan, collnet_plan, node_blocks, nvls_plan, nvls_tree_plan, ring_plan, tree_plan

__all__ = ["Protocol", "PROTOCOLS", "CollectiveAlgorithm", "ALGORITHMS", "register", "Ring", "Tree", "NVLS",
           "NVLSTree", "CollNetDirect", "Direct"]


# -- protocols ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Protocol:
    """One NCCL protocol: the factors clustersim's model reads from it (tuning.cc)."""

    name: str
    index: int
    """Column in NCCL's latency tables, and its rank among equal predictions."""
    ring_bw: float
    """Ring bandwidth factor (LL 0.5, LL128 0.92)."""
    tree_divisor: float = 0.0
    """Tree bandwidth divided by this (LL: 3.8); 0 for none."""
    tree_scale: tuple[float, float] | None = None
    """Tree bandwidth times this on one node / across nodes (LL128: 7/9, 120/128)."""
    flush: bool = False
    """Adds the flush term (one more inter-node latency) to the network step (Simple)."""
    net_posts: int = 1
    """Network post overheads per ring step across nodes (Simple: 3)."""
    ll_capped: bool = False
    """Bus bandwidth capped at NCCL's ``llMaxBw`` (LL) on algorithms that honour it."""
    ring_plateau: bool = False
    """Subject to the ring's "plateau" latency factor on large multi-node all-reduces (Simple)."""

    def tree_bw(self, f: float, n_nodes: int) -> float:
        """The tree bandwidth factor ``f`` after this protocol's (tuning.cc L279-298)."""
        if self.tree_divisor:
            f /= self.tree_divisor
        elif self.tree_scale is not None:
            f *= self.tree_scale[0] if n_nodes == 1 else self.tree_scale[1]
        return f


PROTOCOLS: dict[str, Protocol] = {p.name: p for p in (
    Protocol("LL", 0, 0.5, tree_divisor=3.8, ll_capped=True),
    Protocol("LL128", 1, 0.92, tree_scale=(7.0 / 9.0, 120.0 / 128.0)),
    Protocol("Simple", 2, 1.0, flush=True, net_posts=3, ring_plateau=True),
)}
assert tuple(PROTOCOLS) == nccl.PROTOCOLS and all(p.index == nccl.PROTOCOLS.index(n) for n, p in PROTOCOLS.items())


# -- algorithms --------------------------------------------------------------------------------------
class CollectiveAlgorithm:
    """One collective algorithm (see the module docstring).  Instances are stateless."""

    name: str = ""
    index: int = 0
    """Rank among equal predictions (NCCL's algorithm order, :data:`.nccl.ALGORITHMS`)."""
    port_local: bool = False
    """Its plan on a group inside one NVLink domain crosses only the members' NVLink ports
    (the engine then builds one plan per group form and moves it)."""
    equal_nodes: bool = False
    """Enabled only when every node holds as many members."""
    ll_capped: bool = False
    """NCCL caps its LL bus bandwidth at ``llMaxBw``."""

    def __repr__(self) -> str:
        return f"<collective algorithm {self.name}>"

    # plans
    def build_plan(self, cluster, members, kind: str, root: int | None, t: nccl.NcclTables) -> Plan:
        """The channel flows of one call (:mod:`.plans`)."""
        raise ConfigError("algo", self.name, f"unknown algorithm; known: {', '.join(nccl.ALGORITHMS)}")

    def predicted_plan(self, engine, members, kind: str) -> tuple[Plan, float]:
        """The plan and seconds per payload byte the prediction uses."""
        return engine.plan(members, kind, self.name)

    def stretch_reference(self, kind: str) -> tuple[str, str]:
        """(kind, algorithm) whose flows measure how concurrent calls slow each other."""
        return kind, self.name

    # latency
    def ideal_latency_s(self, kind: str, n: int, N: int, a: float) -> float:
        """Latency with the ideal calibration: ``a`` per pipeline step."""
        return a

    def latency_us(self, kind: str, proto: Protocol, n_ranks: int, n_nodes: int, intra_hw: str = "nvlink",
                   latency_inter_us: float = 0.0, intra_scale: float = 1.0, inter_scale: float = 1.0,
                   t: nccl.NcclTables | None = None) -> float:
        """NCCL's latency for one call (tuning.cc L328-378, v2.27.7), in microseconds.

        ``latency_inter_us`` plays the role of ``graph.latencyInter`` (zero for NCCL's IB
        transport); clustersim passes the physical latency of the slowest inter-node route.
        ``intra_scale`` multiplies the base and intra-node terms, ``inter_scale`` the network
        terms (per-generation calibration).  ``t``: NCCL's tables (default
        :func:`.nccl.tables` of the active constants).
        """
        t = t or nccl.tables()
        p = proto.index
        lat = t.base_lat_us[self.name][p] * intra_scale
        intra = t.hw_lat_us[intra_hw][self.name][p] * intra_scale
        ppn = n_ranks / n_nodes
        inter = t.hw_lat_us["net"][self._net_row(ppn)][p] * inter_scale + latency_inter_us
        if proto.flush:
            inter += latency_inter_us        # the flush term
        return self._latency(kind, proto, n_ranks, n_nodes, intra_hw, lat, intra, inter, intra_scale, inter_scale, t)

    def _net_row(self, ppn: float) -> str:
        return self.name

    def _latency(self, kind, proto, n_ranks, n_nodes, intra_hw, lat, intra, inter, intra_scale, inter_scale, t):
        raise NotImplementedError

    def plateau(self, lat: float, cal, generation: str, kind: str, proto: Protocol, plan: Plan, size: float,
                t: nccl.NcclTables) -> float:
        """``lat`` after any size-dependent latency factor."""
        return lat

    # bandwidth
    def nccl_bandwidth_factor(self, kind: str, proto: Protocol, n_nodes: int, size_bytes: float,
                              t: nccl.NcclTables | None = None) -> float:
        """Fraction of the link bandwidth NCCL expects with ``proto`` (tuning.cc L279-298, L555-578)."""
        return 1.0

    def efficiency(self, cal, generation: str) -> float:
        """The calibration's factor on this algorithm's bandwidth."""
        return 1.0

    def size_scaled(self, f: float, cal, n_nodes: int, n_ranks: int) -> float:
        """The bandwidth factor ``f`` after any group-size factor of the calibration."""
        return f


class Ring(CollectiveAlgorithm):
    name, index, port_local, ll_capped = "ring", 0, True, True

    def build_plan(self, cluster, members, kind, root, t):
        return ring_plan(cluster, members, kind, root, t.max_ring_channels)

    def ideal_latency_s(self, kind, n, N, a):
        return nccl.num_steps(kind, n) * a if kind != "broadcast" else (n - 1) * a

    def _net_row(self, ppn):
        return "tree" if ppn == 1 else self.name

    def _latency(self, kind, proto, n_ranks, n_nodes, intra_hw, lat, intra, inter, intra_scale, inter_scale, t):
        p = proto.index
        if kind in ("broadcast", "reduce"):
            hw = "net" if n_nodes > 1 else intra_hw
            scale = inter_scale if n_nodes > 1 else intra_scale
            return lat + nccl.num_steps(kind, n_ranks) * t.hw_lat_us[hw][self.name][p] * scale
        overhead = t.net_overhead_us * proto.net_posts if n_nodes > 1 else 0.0
        intra = max(intra, overhead)
        nsteps = nccl.num_steps(kind, n_ranks)
        n_inter = 0 if n_nodes == 1 else (2 * (n_nodes - 1) if kind == "all_reduce" else n_nodes - 1)
        return lat + (nsteps - n_inter) * intra + n_inter * inter

    def plateau(self, lat, cal, generation, kind, proto, plan, size, t):
        if (cal.ring_plateau and proto.ring_plateau and plan.n_nodes > 1 and kind == "all_reduce"
                and size / (plan.n_channels * plan.n_ranks) >= 64):
            lat *= t.ring_plateau_factor[generation]
        return lat

    def nccl_bandwidth_factor(self, kind, proto, n_nodes, size_bytes, t=None):
        return proto.ring_bw

    def size_scaled(self, f, cal, n_nodes, n_ranks):
        if n_nodes == 1 and n_ranks:
            f *= cal.ring_factor(n_ranks)
        return f


class Tree(CollectiveAlgorithm):
    name, index, port_local, ll_capped = "tree", 1, True, True

    def build_plan(self, cluster, members, kind, root, t):
        return tree_plan(cluster, members, t.max_ring_channels)

    def predicted_plan(self, engine, members, kind):
        # NCCL models the tree's bandwidth as half the ring's bus bandwidth
        _, rspb = engine.plan(members, "all_reduce", "ring")
        n = len(members)
        spb = rspb / (2 * (n - 1) / n) * 2.0
        return engine.plan(members, kind, self.name)[0], spb

    def stretch_reference(self, kind):
        return "all_reduce", "ring"

    def ideal_latency_s(self, kind, n, N, a):
        return 2 * ((n // N - 1) + nccl._log2i(N)) * a

    def _latency(self, kind, proto, n_ranks, n_nodes, intra_hw, lat, intra, inter, intra_scale, inter_scale, t):
        return lat + 2 * ((n_ranks // n_nodes - 1) * intra + nccl._log2i(n_nodes) * inter)

    def nccl_bandwidth_factor(self, kind, proto, n_nodes, size_bytes, t=None):
        f = proto.tree_bw(0.92, n_nodes)
        if kind == "all_reduce":
            log_size = nccl._log2i(int(size_bytes) >> 6) if size_bytes >= 64 else -1
            table = (t or nccl.tables()).tree_correction[proto.name]
            if 0 <= log_size < len(table):
                f *= table[log_size]
        return f


class NVLS(CollectiveAlgorithm):
    """NVLink SHARP in one node; across nodes (with SHARP) CollNet's plan with NVLS inside nodes."""

    name, index, port_local = "nvls", 2, True

    def build_plan(self, cluster, members, kind, root, t):
        multi = len(node_blocks(cluster, members)) > 1
        return collnet_plan(cluster, members, nvls=True) if multi else nvls_plan(cluster, members)

    def ideal_latency_s(self, kind, n, N, a):
        return 2 * a

    def _latency(self, kind, proto, n_ranks, n_nodes, intra_hw, lat, intra, inter, intra_scale, inter_scale, t):
        return intra + (inter if n_nodes > 1 else 0.0)

    def efficiency(self, cal, generation):
        return cal.nvls_efficiency


class NVLSTree(CollectiveAlgorithm):
    name, index, port_local, equal_nodes = "nvls_tree", 3, True, True

    def build_plan(self, cluster, members, kind, root, t):
        return nvls_tree_plan(cluster, members)

    def ideal_latency_s(self, kind, n, N, a):
        return (2 + 2 * nccl._log2i(N)) * a

    def _latency(self, kind, proto, n_ranks, n_nodes, intra_hw, lat, intra, inter, intra_scale, inter_scale, t):
        return lat + intra + 2 * nccl._log2i(n_nodes) * inter

    def efficiency(self, cal, generation):
        return cal.nvls_efficiency


class CollNetDirect(CollectiveAlgorithm):
    name, index, equal_nodes = "collnet_direct", 4, True

    def build_plan(self, cluster, members, kind, root, t):
        return collnet_plan(cluster, members, nvls=False)

    def ideal_latency_s(self, kind, n, N, a):
        return 2 * a

    def _latency(self, kind, proto, n_ranks, n_nodes, intra_hw, lat, intra, inter, intra_scale, inter_scale, t):
        p_int = n_ranks // n_nodes
        return lat + 2 * (min(1, p_int - 1) * intra + (p_int - 1) * t.collnet_arity_us) + inter

    def efficiency(self, cal, generation):
        return nccl.COLLNET_FACTOR[generation]


class Direct(CollectiveAlgorithm):
    """All-to-all pairs and send/recv: one flow per transfer (plans from
    :func:`.plans.alltoall_plan` and :func:`.plans.p2p_plan`, not per call); a ring Simple
    step's latency (network across nodes), whatever the protocol."""

    name, index = "direct", 5

    def latency_us(self, kind, proto, n_ranks, n_nodes, intra_hw="nvlink", latency_inter_us=0.0,
                   intra_scale=1.0, inter_scale=1.0, t=None):
        t = t or nccl.tables()
        hw = "net" if n_nodes > 1 else "nvlink"
        scale = inter_scale if n_nodes > 1 else intra_scale
        return t.hw_lat_us[hw]["ring"][2] * scale + latency_inter_us


ALGORITHMS: dict[str, CollectiveAlgorithm] = {}


def register(algo: CollectiveAlgorithm) -> CollectiveAlgorithm:
    """Add ``algo`` to :data:`ALGORITHMS` under its name."""
    if algo.name in ALGORITHMS:
        raise ValueError(f"collective algorithm {algo.name!r} registered twice")
    ALGORITHMS[algo.name] = algo
    return algo


for _cls in (Ring, Tree, NVLS, NVLSTree, CollNetDirect, Direct):
    register(_cls())
assert tuple(ALGORITHMS)[:len(nccl.ALGORITHMS)] == nccl.ALGORITHMS
assert all(a.index == i for i, a in enumerate(ALGORITHMS.values()))
