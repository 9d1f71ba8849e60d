"""Structural routing: GPU-to-GPU routes as arrays of link ids, without graph search.

Routes follow the structure the builders draw, so a route costs O(1) table look-ups and
16,384-GPU clusters need no all-pairs computation.  Policies (``ClusterSpec.routing``):

``dmodk``      deterministic per destination (InfiniBand's D-mod-K): the spine plane is
               the destination NIC's port number on its leaf modulo the spine count.
``ecmp_hash``  a seeded hash of (source NIC, destination NIC, flow key) picks the plane,
               as RoCE ECMP does per flow; collisions are what it models.
``adaptive``   the flow is spread evenly over all planes (and cores): every spine link
               of the route carries a fraction of the flow (coefficient 1/planes).

PXN (NCCL >= 2.12): traffic from a GPU to a GPU on another rail is first moved over
NVLink to the peer GPU of the source host that sits on the destination's rail, then
leaves through that peer's NIC, so it stays on one rail of the fabric.  It applies when
the source host has such a peer in its NVLink domain; otherwise the route crosses rails
through the spines.

On a full-mesh scale-up domain (AMD xGMI, ``ClusterSpec.scaleup_topology == "mesh"``) a hop
between two GPUs of the domain is their own link instead of the two switch ports
(:meth:`Router.hop`); PXN relays take that link too.

A route is a :class:`Route`: link ids plus per-link coefficients (bytes carried on the
link per byte of the flow; 1 except for ``adaptive`` spreading).

Failures (what-ifs, :meth:`topologies.cluster.Cluster.perturbed`): a failed switch link
takes its spine plane (or core) out of the routes that would cross it, and the policy
chooses among the planes left -- D-mod-K moves to the next working plane after the one
it would pick (as a subnet manager re-sweeping its tables does), ECMP hashes over the
working planes, adaptive spreads over them; no plane left is a :class:`ConfigError`
naming both GPUs.  A failed NIC with failover (NCCL's PXN-style ``nic_failover: pxn``)
hands the GPU's traffic to a same-host peer: out over NVLink to the peer and through the
peer's NIC, and in through the peer's NIC and over NVLink.
"""

from __future__ import annotations

from typing import NamedTuple, TYPE_CHECKING

import numpy as np

from .errors import ConfigError

if TYPE_CHECKING:
    from .cluster import Cluster

__all__ = ["Route", "Router", "mix64"]

_MASK = (1 << 64) - 1


def mix64(x: int) -> int:
    """SplitMix64 finaliser: a fixed, platform-independent integer hash."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class Route(NamedTuple):
    """Links a flow crosses, with the bytes each carries per byte of the flow."""

    links: np.ndarray
    coefs: np.ndarray


_EMPTY = Route(np.empty(0, dtype=np.int64), np.empty(0, dtype=float))
_ONES: dict[int, np.ndarray] = {}


def _ones(n: int) -> np.ndarray:
    """Coefficients of an ordinary ``n``-link route: one read-only array per length, shared
    by the many routes a batch builds (nothing writes a route's coefficients)."""
    a = _ONES.get(n)
    if a is None:
        a = _ONES[n] = np.ones(n)
        a.setflags(write=False)
    return a


class Router:
    """Route tables of one cluster.  Built once from the cluster's link table."""

    def __init__(self, cluster: "Cluster"):
        c = cluster
        t = c.table
        self.cluster = c
        self.policy = c.spec.routing
        self.pxn_default = c.spec.pxn
        self.seed = c.spec.seed
        n = c.num_gpus
        self.gpu_nic = np.asarray(c._nic, dtype=np.int64)
        """Per GPU: its NIC (:meth:`~topologies.cluster.Cluster.nic_of`, as an array)."""
        self.nvl_up, self.nvl_down = self._ports(t, "gpu", "nvswitch", n)
        D = c.nvlink_domain_size
        self.mesh = c.spec.scaleup_topology == "mesh"
        """The scale-up domains are full meshes: a GPU reaches a domain peer over their own link."""
        self.mesh_out: np.ndarray | None = None
        """Mesh only: per GPU and peer's position in the domain, the link between them (-1 to itself)."""
        if self.mesh:
            self.mesh_out = np.full((n, max(D, 1)), -1, dtype=np.int64)
            a, b, ids = t.pairs("gpu", "gpu")
            self.mesh_out[a, b % D] = ids
        self.has_scaleup = (self.nvl_up >= 0) | (self.mesh and D > 1)
        """Per GPU: it has scale-up links (a switch port or mesh links)."""
        self.pcie_up, self.pcie_down = self._ports(t, "gpu", "nic", n)
        self.nic_names = [t.names[i] for i in t.ids["nic"]]
        num_nics = len(self.nic_names)
        self.nic_up, self.nic_down = self._ports(t, "nic", "leaf", num_nics)
        self.nic_leaf = np.full(num_nics, -1, dtype=np.int64)
        nic, leaf, _ = t.pairs("nic", "leaf")
        self.nic_leaf[nic] = leaf
        # a NIC's port on its leaf: its rank among the leaf's NICs, in NIC order
        order = np.lexsort((nic, leaf))
        on_leaf = leaf[order]
        self.nic_port = np.zeros(num_nics, dtype=np.int64)
        self.nic_port[nic[order]] = np.arange(order.size) - np.searchsorted(on_leaf, on_leaf)
        self.leaf_pod = t.attr("leaf", "pod")
        spine_pod = t.attr("spine", "pod")
        self.num_pods = 1 + int(spine_pod.max()) if spine_pod.size else 1
        self.num_spines = spine_pod.size // self.num_pods
        self.num_cores = t.count("core")
        S, C = self.num_spines, self.num_cores
        self.leaf_spine = np.full((self.leaf_pod.size, max(S, 1)), -1, dtype=np.int64)
        self.spine_leaf = np.full((self.leaf_pod.size, max(S, 1)), -1, dtype=np.int64)
        lf, sp, ids = t.pairs("leaf", "spine")
        self.leaf_spine[lf, sp % max(S, 1)] = ids
        sp, lf, ids = t.pairs("spine", "leaf")
        self.spine_leaf[lf, sp % max(S, 1)] = ids
        self.spine_core = np.full((self.num_pods, max(S, 1), max(C, 1)), -1, dtype=np.int64)
        self.core_spine = np.full((self.num_pods, max(S, 1), max(C, 1)), -1, dtype=np.int64)
        sp, cc, ids = t.pairs("spine", "core")
        self.spine_core[sp // max(S, 1), sp % max(S, 1), cc] = ids
        cc, sp, ids = t.pairs("core", "spine")
        self.core_spine[sp // max(S, 1), sp % max(S, 1), cc] = ids
        spec = c.spec
        self.rail_optimized = spec.rail_optimized
        self._cache: dict[tuple, Route] = {}
        # what-if failures (set by Cluster.perturbed; None: none)
        self.link_failed: np.ndarray | None = None
        """Per link id: failed (routes avoid it)."""
        self.failover: np.ndarray | None = None
        """Per GPU: the GPU whose NIC carries its scale-out traffic (itself unless its NIC failed)."""

    @staticmethod
    def _ports(t, kind: str, peer: str, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Per node of ``kind`` (by ordinal): the link to its ``peer``-kind neighbour and
        back (-1 where it has none); each node of ``kind`` has at most one."""
        up = np.full(n, -1, dtype=np.int64)
        down = np.full(n, -1, dtype=np.int64)
        a, _, ids = t.pairs(kind, peer)
        up[a] = ids
        _, a, ids = t.pairs(peer, kind)
        down[a] = ids
        return up, down

    @property
    def perturbed(self) -> bool:
        return self.link_failed is not None or self.failover is not None

    # -- pieces ------------------------------------------------------------------------------
    def _plane(self, src_nic: int, dst_nic: int, flow_key: int, n: int) -> int:
        if self.policy == "ecmp_hash":
            h = mix64(((src_nic * 0x100000001B3) ^ (dst_nic << 20) ^ (flow_key << 40) ^ self.seed) & _MASK)
            return h % n
        # D-mod-K: the destination's port number on its leaf picks the plane
        return int(self.nic_port[dst_nic]) % n

    def _planes(self, la: int, lb: int, pa: int, pb: int) -> list[tuple[int, int]]:
        """(spine, core) planes between leaves ``la`` and ``lb`` whose links all work."""
        S, C = self.num_spines, self.num_cores
        bad = self.link_failed
        out = []
        for s in range(S):
            if bad[self.leaf_spine[la, s]] or bad[self.spine_leaf[lb, s]]:
                continue
            for cc in range(C if pa != pb else 1):
                if pa != pb and (bad[self.spine_core[pa, s, cc]] or bad[self.core_spine[pb, s, cc]]):
                    continue
                out.append((s, cc))
        return out

    def _plane_links(self, la: int, lb: int, pa: int, pb: int, s: int, cc: int) -> list[int]:
        """The links of plane (spine ``s``, core ``cc``) from leaf ``la`` (pod ``pa``) to leaf
        ``lb`` (pod ``pb``): leaf -> spine, spine -> core -> spine when the pods differ, spine -> leaf."""
        links = [int(self.leaf_spine[la, s])]
        if pa != pb:
            links += [int(self.spine_core[pa, s, cc]), int(self.core_spine[pb, s, cc])]
        links.append(int(self.spine_leaf[lb, s]))
        return links

    def _fabric_failed(self, la, lb, src_nic, dst_nic, flow_key, src, dst) -> tuple[list[int], list[float]]:
        """The spine part of a route around failed links (see the module docstring)."""
        S, C = self.num_spines, self.num_cores
        pa, pb = int(self.leaf_pod[la]), int(self.leaf_pod[lb])
        planes = self._planes(la, lb, pa, pb)
        if not planes:
            raise ConfigError("whatif.failed_links", f"gpu{src} -> gpu{dst}",
                              f"no path left: every spine plane between leaf{pa}.{la} and leaf{pb}.{lb} "
                              "has a failed link")
        links: list[int] = []
        coefs: list[float] = []
        if self.policy == "adaptive":
            w = 1.0 / len(planes)
            for s, cc in planes:
                links += self._plane_links(la, lb, pa, pb, s, cc)
            coefs = [w] * len(links)
            # merge the leaf links shared by several cores of one spine
            merged: dict[int, float] = {}
            for lk, cf in zip(links, coefs):
                merged[lk] = merged.get(lk, 0.0) + cf
            return list(merged), list(merged.values())
        if self.policy == "ecmp_hash":
            s, cc = planes[self._plane(src_nic, dst_nic, flow_key, len(planes))]
        else:
            # D-mod-K: the plane it would pick, else the next working one (spine-major)
            s0 = int(self.nic_port[dst_nic]) % S
            c0 = int(self.nic_port[dst_nic]) % C if (pa != pb and C > 1) else 0
            order = {(s, cc): ((s - s0) % S) * max(C, 1) + (cc - c0) % max(C, 1) for s, cc in planes}
            s, cc = min(planes, key=order.__getitem__)
        links = self._plane_links(la, lb, pa, pb, s, cc)
        return links, [1.0] * len(links)

    def _fabric(self, src_nic: int, dst_nic: int, flow_key: int, src: int = -1,
                dst: int = -1) -> tuple[list[int], list[float]]:
        la, lb = int(self.nic_leaf[src_nic]), int(self.nic_leaf[dst_nic])
        if self.link_failed is not None and la != lb:
            fl, fc = self._fabric_failed(la, lb, src_nic, dst_nic, flow_key, src, dst)
            return ([int(self.nic_up[src_nic])] + fl + [int(self.nic_down[dst_nic])], [1.0] + fc + [1.0])
        links = [int(self.nic_up[src_nic])]
        coefs = [1.0]
        if la != lb:
            S, C = self.num_spines, self.num_cores
            pa, pb = int(self.leaf_pod[la]), int(self.leaf_pod[lb])
            if self.policy == "adaptive":
                planes = [(s, cc) for s in range(S) for cc in range(C if pa != pb else 1)]
                w = 1.0 / len(planes)
                for s in range(S):
                    links.append(int(self.leaf_spine[la, s])); coefs.append(1.0 / S)
                if pa != pb:
                    for s, cc in planes:
                        links += [int(self.spine_core[pa, s, cc]), int(self.core_spine[pb, s, cc])]
                        coefs += [w, w]
                for s in range(S):
                    links.append(int(self.spine_leaf[lb, s])); coefs.append(1.0 / S)
            else:
                s = self._plane(src_nic, dst_nic, flow_key, S)
                cc = self._plane(src_nic, dst_nic, flow_key + 0x5bd1e995, C) if pa != pb and C > 1 else 0
                plane = self._plane_links(la, lb, pa, pb, s, cc)
                links += plane
                coefs += [1.0] * len(plane)
        links.append(int(self.nic_down[dst_nic])); coefs.append(1.0)
        return links, coefs

    def pxn_peer(self, src: int, dst: int) -> int:
        """The GPU of ``src``'s host on ``dst``'s rail (PXN relay), or ``src`` when none."""
        c = self.cluster
        rail = c.rail_of(dst)
        if rail == c.rail_of(src) or rail < 0:
            return src
        per = c.gpus_per_host // c.nics_per_host
        peer = c.host_of(src) * c.gpus_per_host + rail * per
        if c.domain_of(peer) != c.domain_of(src) or not self.has_scaleup[src]:
            return src
        return peer

    def hop(self, a: int, b: int) -> list[int]:
        """The scale-up links from GPU ``a`` to GPU ``b`` of its domain: ``a``'s port into the
        switch and the switch's port to ``b``, or their own mesh link."""
        if self.mesh:
            return [int(self.mesh_out[a, b % self.cluster.nvlink_domain_size])]
        return [int(self.nvl_up[a]), int(self.nvl_down[b])]

    # -- public ------------------------------------------------------------------------------
    def route(self, src: int, dst: int, *, pxn: bool | None = None, flow_key: int = 0) -> Route:
        """Route from GPU ``src`` to GPU ``dst``.

        ``pxn`` defaults to the cluster's setting; ``flow_key`` matters only to
        ``ecmp_hash`` (different keys may hash onto different planes).
        """
        if pxn is None:
            pxn = self.pxn_default
        key = (src, dst, pxn, flow_key if self.policy == "ecmp_hash" else 0)
        r = self._cache.get(key)
        if r is not None:
            return r
        c = self.cluster
        if not (0 <= src < c.num_gpus and 0 <= dst < c.num_gpus):
            raise ConfigError("route", (src, dst), f"GPU ids must be in [0, {c.num_gpus})")
        if src == dst:
            r = _EMPTY
        elif c.domain_of(src) == c.domain_of(dst):
            h = self.hop(src, dst)
            r = Route(np.array(h, dtype=np.int64), np.ones(len(h)))
        else:
            if c.nic_of(src) < 0:
                raise ConfigError("cluster", c.spec.name, f"no path from gpu{src} to gpu{dst}")
            links: list[int] = []
            coefs: list[float] = []
            fo = self.failover
            # with NIC failover the destination's traffic lands at its peer's NIC
            land = dst if fo is None else int(fo[dst])
            relay = self.pxn_peer(src, land) if (pxn and self.rail_optimized) else src
            if fo is not None:
                relay = int(fo[relay])
            if relay != src:
                h = self.hop(src, relay)
                links += h
                coefs += [1.0] * len(h)
            sn, dn = c.nic_of(relay), c.nic_of(land)
            links.append(int(self.pcie_up[relay])); coefs.append(1.0)
            if sn != dn:
                if self.nic_leaf[sn] < 0 or self.nic_leaf[dn] < 0:
                    raise ConfigError("cluster", c.spec.name, f"no path from gpu{src} to gpu{dst}")
                fl, fc = self._fabric(sn, dn, flow_key, src, dst)
                links += fl; coefs += fc
            links.append(int(self.pcie_down[land])); coefs.append(1.0)
            if land != dst:
                h = self.hop(land, dst)
                links += h
                coefs += [1.0] * len(h)
            r = Route(np.array(links, dtype=np.int64), np.array(coefs, dtype=float))
        self._cache[key] = r
        return r

    def routes(self, srcs, dsts, *, pxn: bool | None = None) -> list[Route]:
        """:meth:`route` for many pairs at once (vectorised for ``dmodk``; other policies,
        and inputs :meth:`route` would reject, go through it one by one)."""
        if pxn is None:
            pxn = self.pxn_default
        src = np.asarray(srcs, dtype=np.int64)
        dst = np.asarray(dsts, dtype=np.int64)
        table = self._table(src, dst, pxn)
        if table is None:
            return [self.route(int(a), int(b), pxn=pxn) for a, b in zip(src.tolist(), dst.tolist())]
        flat, lens = table
        out = []
        cache = self._cache
        start = 0
        for a, b, end in zip(src.tolist(), dst.tolist(), np.cumsum(lens).tolist()):
            key = (a, b, pxn, 0)
            r = cache.get(key)
            if r is None:
                r = cache[key] = Route(flat[start:end], _ones(end - start)) if end > start else _EMPTY
            out.append(r)
            start = end
        return out

    def routes_flat(self, srcs, dsts, *, pxn: bool | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The routes of many pairs laid end to end: their links, their coefficients and how
        many links each has -- :meth:`routes` concatenated, without a :class:`Route` per pair
        (what a plan over a thousand nodes or a job's pipeline transfers need)."""
        if pxn is None:
            pxn = self.pxn_default
        src = np.asarray(srcs, dtype=np.int64)
        dst = np.asarray(dsts, dtype=np.int64)
        table = self._table(src, dst, pxn)
        if table is not None:
            return table[0], np.ones(table[0].size), table[1]
        rs = self.routes(src, dst, pxn=pxn)
        if not rs:
            return np.empty(0, dtype=np.int64), np.empty(0), np.zeros(0, dtype=np.int64)
        return (np.concatenate([r.links for r in rs]), np.concatenate([r.coefs for r in rs]),
                np.array([r.links.size for r in rs], dtype=np.int64))

    def _table(self, src: np.ndarray, dst: np.ndarray, pxn: bool) -> tuple[np.ndarray, np.ndarray] | None:
        """The ``dmodk`` routes of many pairs, vectorised: every route's links row by row and
        each route's length (coefficients all 1); None where :meth:`route` must answer pair
        by pair (another policy, failures, few pairs, inputs it would reject)."""
        c = self.cluster
        n_gpu = c.num_gpus
        if (self.policy != "dmodk" or self.perturbed or self.mesh or src.size < 32 or src.shape != dst.shape or not c.nics_per_host
                or src.min(initial=0) < 0 or dst.min(initial=0) < 0
                or src.max(initial=0) >= n_gpu or dst.max(initial=0) >= n_gpu):
            return None
        D, gph = c.nvlink_domain_size, c.gpus_per_host
        nic = self.gpu_nic
        inter = src // D != dst // D
        if (nic[src[inter]] < 0).any():
            return None
        relay = src
        if pxn and self.rail_optimized:
            rail = nic % c.nics_per_host
            rs, rd = rail[src], rail[dst]
            peer = (src // gph) * gph + rd * (gph // c.nics_per_host)
            ok = inter & (rd != rs) & (peer // D == src // D) & (self.nvl_up[src] >= 0)
            relay = np.where(ok, peer, src)
        sn, dn = nic[relay], nic[dst]
        fab = inter & (sn != dn)
        la, lb = self.nic_leaf[sn], self.nic_leaf[dn]
        if (la[fab] < 0).any() or (lb[fab] < 0).any():
            return None
        S, C = self.num_spines, self.num_cores
        cross = fab & (la != lb)
        if cross.any() and S == 0:
            return None
        if not self.leaf_pod.size:          # no fabric at all (one host): nothing crosses it
            la = lb = np.zeros_like(la)
            pod, ls, sl = np.zeros(1, dtype=np.int64), np.full((1, 1), -1), np.full((1, 1), -1)
        else:
            pod, ls, sl = self.leaf_pod, self.leaf_spine, self.spine_leaf
        sp = self.nic_port[dn] % max(S, 1)
        pa, pb = pod[la], pod[lb]
        xpod = cross & (pa != pb)
        cc = self.nic_port[dn] % C if C > 1 else np.zeros_like(dn)
        relayed = inter & (relay != src)
        same = ~inter & (src != dst)
        cols = [(relayed | same, self.nvl_up[src]), (relayed, self.nvl_down[relay]), (same, self.nvl_down[dst]),
                (inter, self.pcie_up[relay]), (fab, self.nic_up[sn]), (cross, ls[la, sp]),
                (xpod, self.spine_core[pa, sp, cc]), (xpod, self.core_spine[pb, sp, cc]),
                (cross, sl[lb, sp]), (fab, self.nic_down[dn]), (inter, self.pcie_down[dst])]
        mask = np.stack([m for m, _ in cols], axis=1)
        flat = np.stack([v for _, v in cols], axis=1)[mask]        # every route's links, row by row
        return flat, mask.sum(axis=1)

    def domain_ports(self, gpus) -> np.ndarray | None:
        """The NVLink ports of GPUs that share one NVLink domain: ``nvl_up`` of each, then
        ``nvl_down`` of each; None when they span domains, one has no NVLink port, or the
        domains are meshes (a group's routes there cross links between its members).

        A route between two of them is ``nvl_up[src], nvl_down[dst]`` (coefficients 1)
        under every policy, PXN setting and failure (:meth:`route`, :meth:`routes`), so
        these are the only links their routes cross.
        """
        c = self.cluster
        D = c.nvlink_domain_size
        if self.mesh or not gpus or not 0 <= gpus[0] < c.num_gpus:
            return None
        dom = gpus[0] // D
        if any(g // D != dom or g < 0 or g >= c.num_gpus for g in gpus):
            return None
        g = np.asarray(gpus, dtype=np.int64)
        ports = np.concatenate([self.nvl_up[g], self.nvl_down[g]])
        return None if (ports < 0).any() else ports

    def domain_ports_many(self, gpus: np.ndarray) -> np.ndarray | None:
        """:meth:`domain_ports` of many groups of one size (a row of GPUs each): a row of
        ports per group, all -1 where :meth:`domain_ports` gives None (or None for all)."""
        c = self.cluster
        g = np.asarray(gpus, dtype=np.int64)
        if self.mesh or g.ndim != 2 or g.shape[1] == 0:
            return None
        inside = ((g >= 0) & (g < c.num_gpus)).all(axis=1)
        gs = np.where(inside[:, None], g, 0)
        D = c.nvlink_domain_size
        one = inside & (gs // D == gs[:, :1] // D).all(axis=1)
        ports = np.concatenate([self.nvl_up[gs], self.nvl_down[gs]], axis=1)
        ports[~one] = -1
        ports[(ports < 0).any(axis=1)] = -1
        return ports

    def reduction_tree(self, nics, plane: int) -> tuple[list[int], float]:
        """Switch links of a SHARP aggregation tree over ``nics`` rooted in spine plane ``plane``.

        Each NIC's stream enters its leaf; a leaf with member NICs sends one reduced
        stream up to the plane's spine of its pod and receives the result back; pods
        meet at a core switch the same way.  Returns the links (both directions) and the
        physical latency of the longest leaf-to-root path.  NIC links are not included.
        """
        leaves = sorted({int(self.nic_leaf[n]) for n in nics})
        if len(leaves) <= 1 or self.num_spines == 0:
            return [], 0.0
        s = plane % self.num_spines
        pods = sorted({int(self.leaf_pod[l]) for l in leaves})
        links = [int(x) for l in leaves for x in (self.leaf_spine[l, s], self.spine_leaf[l, s])]
        if len(pods) > 1:
            c = plane % self.num_cores
            links += [int(x) for p in pods for x in (self.spine_core[p, s, c], self.core_spine[p, s, c])]
        lat = self.cluster.link_latency
        depth = lat[links[0]] + (lat[links[-1]] if len(pods) > 1 else 0.0)
        return links, float(depth)

    def path_latency(self, route: Route) -> float:
        """Sum of the physical latencies of a route's links (spread links weighted by share)."""
        if route.links.size == 0:
            return 0.0
        return float(np.dot(self.cluster.link_latency[route.links], route.coefs))

    def path_latencies(self, links: np.ndarray, coefs: np.ndarray, lens: np.ndarray) -> np.ndarray:
        """:meth:`path_latency` of each of many routes laid end to end (``lens[i]`` links
        each, as :meth:`routes_flat` gives them), bit for bit: routes whose link latencies
        and coefficients agree, in order, have the same ``np.dot``, so it runs once per
        distinct sequence -- a handful, however many routes."""
        out = np.zeros(lens.size)
        lat = self.cluster.link_latency[links]
        starts = np.cumsum(lens) - lens
        if lens.size <= 16:         # a few routes (a ring over a couple of nodes): each on its own
            for i, (a, n) in enumerate(zip(starts.tolist(), lens.tolist())):
                if n:
                    idx = np.arange(a, a + n)
                    out[i] = float(np.dot(lat[idx], coefs[idx]))
            return out
        # each link's (latency, coefficient) as a small id among the distinct pairs (bit patterns)
        ul, li = np.unique(lat.view(np.uint64), return_inverse=True)
        uc, ci = np.unique(np.asarray(coefs, dtype=float).view(np.uint64), return_inverse=True)
        pid = li.ravel().astype(np.int64) * uc.size + ci.ravel()
        k = max(ul.size * uc.size, 1)
        for n in np.unique(lens[lens > 0]).tolist():
            rows = np.flatnonzero(lens == n)
            idx = starts[rows, None] + np.arange(n)
            if k ** n < 2 ** 62:
                # a route's sequence of pair ids as one integer (mixed radix k): equal iff equal
                key = pid[idx] @ (k ** np.arange(n, dtype=np.int64))
                _, first, inv = np.unique(key, return_index=True, return_inverse=True)
            else:
                bits = np.concatenate([lat[idx], coefs[idx]], axis=1).view(np.uint64)
                _, first, inv = np.unique(bits, axis=0, return_index=True, return_inverse=True)
            dots = [float(np.dot(lat[idx[i]], coefs[idx[i]])) for i in first.tolist()]
            out[rows] = np.array(dots)[inv.ravel()]
        return out
