"""Generators for cluster graphs, as numpy link tables.

Every builder extends a :class:`GraphTable`: blocks of nodes (names and attributes) and
blocks of links laid as numpy arrays, whole tiers at a time, so a 131,072-GPU cluster
(1.06 M links) is drawn in well under a second.  Links are directed, one per direction,
with

``bandwidth_bytes_per_s``  capacity of one direction, bytes/s
``latency_s``              physical latency of the link, s
``tier``                   :class:`~topologies.specs.Tier` value

and nodes carry ``kind`` (``gpu``, ``nvswitch``, ``nic``, ``leaf``, ``spine``, ``core``)
plus the indices that :class:`~topologies.cluster.Cluster` uses for structural routing.
:meth:`GraphTable.graph` turns the table into the ``nx.DiGraph`` it describes.

Link ids are the order in which that DiGraph iterates its edges: nodes in the order the
builders add them, each node's out-links in the order they were laid (the order of the
edge-by-edge networkx build this replaced; tests/topologies/test_builders.py holds it).

A cluster as these builders draw it (one pod, rail-optimised, 2 hosts of 4 GPUs)::

                 spine0            spine1               <- spines (tier ib)
                /   |  \\  ...   /   |   \\
           leaf0.r0  leaf0.r1  leaf0.r2  leaf0.r3       <- one leaf per rail per unit
             |   \\      ...                             (hosts_per_leaf hosts)
         nic0.0  nic1.0   nic0.1 nic1.1 ...             <- NIC k of every host on rail k
           |        |                                     (tier ib to the leaf)
         gpu0 ...  gpu4 ...                             <- GPU -> its NIC (tier pcie)
           \\  |  /                                     
           nvsw0   nvsw1                                <- one NVSwitch node per NVLink
                                                          domain, full bandwidth per GPU
                                                          (tier nvlink)

GPUs whose scale-up domain is a full mesh (AMD Infinity Fabric / xGMI) get no switch node:
:func:`mesh_domains` links every pair of a domain directly (tier nvlink), 7 links per GPU on an
8-GPU host.

Racks (pods) repeat this picture and connect their spines to a cross-rack core
(tier xrack).  The NVSwitch of a domain is one non-blocking node: NVLink bandwidth is
a property of each GPU's port (up and down), as on HGX and NVL72 systems.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .constants import value as active_value
from .specs import LINK_LATENCY_S, TIER_INDEX, TIERS, Tier

_LAT = "topologies.specs.LINK_LATENCY_S"

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["GraphTable", "nvlink_domains", "mesh_domains", "host_nics", "leaf_spine", "cross_rack_core"]


class GraphTable:
    """Nodes and links of a cluster graph, laid block by block.

    Attributes (after :meth:`finish`)
    ----------
    names : list[str]
        Node names by node id (insertion order).
    kind : numpy.ndarray
        Per node id: its kind's position in :attr:`kinds`.
    ordinal : numpy.ndarray
        Per node id: its position among the nodes of its kind.
    src, dst : numpy.ndarray
        Per link id: source and destination node ids.
    capacity, latency : numpy.ndarray
        Per link id: bytes/s (one direction) and seconds.
    tier : numpy.ndarray
        Per link id: index into :data:`topologies.specs.TIERS`.
    """

    kinds = ("gpu", "nvswitch", "nic", "leaf", "spine", "core")

    def __init__(self):
        self.num_nodes = 0
        self._nodes: list[tuple[str, list[str], dict[str, np.ndarray]]] = []
        self._links: list[tuple[np.ndarray, np.ndarray, np.ndarray, float, Tier]] = []
        self.ids: dict[str, list[int]] = {k: [] for k in self.kinds}
        """Node ids of each kind, in insertion order."""

    def add_nodes(self, kind: str, names: list[str], **attrs) -> np.ndarray:
        """Add nodes of one kind with per-node integer attributes; returns their ids."""
        ids = np.arange(self.num_nodes, self.num_nodes + len(names), dtype=np.int64)
        self.num_nodes += len(names)
        self._nodes.append((kind, names, {k: np.broadcast_to(np.asarray(v, dtype=np.int64), (len(names),))
                                          for k, v in attrs.items()}))
        self.ids[kind] += ids.tolist()
        return ids

    def link(self, u, v, bandwidth, latency: float, tier: Tier) -> None:
        """Links ``u[i] <-> v[i]`` (node ids), one per direction, laid in index order."""
        u = np.asarray(u, dtype=np.int64)
        self._links.append((u, np.asarray(v, dtype=np.int64),
                            np.broadcast_to(np.asarray(bandwidth, dtype=float), u.shape), float(latency), tier))

    def finish(self) -> "GraphTable":
        """Number the links: by source node, then in the order they were laid."""
        if self._links:
            u = np.concatenate([b[0] for b in self._links])
            v = np.concatenate([b[1] for b in self._links])
            bw = np.concatenate([b[2] for b in self._links])
            lat = np.concatenate([np.full(b[0].size, b[3]) for b in self._links])
            tier = np.concatenate([np.full(b[0].size, TIER_INDEX[b[4]], dtype=np.int8) for b in self._links])
        else:
            u = v = np.empty(0, dtype=np.int64)
            bw = lat = np.empty(0)
            tier = np.empty(0, dtype=np.int8)
        # both directions of a link, in laying order; then by source, keeping that order
        src, dst = np.stack([u, v], axis=1).ravel(), np.stack([v, u], axis=1).ravel()
        order = np.argsort(src, kind="stable")
        self.src, self.dst = src[order], dst[order]
        self.capacity = np.repeat(bw, 2)[order]
        self.latency = np.repeat(lat, 2)[order]
        self.tier = np.repeat(tier, 2)[order]
        self.names = [n for _, names, _ in self._nodes for n in names]
        self.kind = np.concatenate([np.full(len(names), self.kinds.index(k), dtype=np.int8)
                                    for k, names, _ in self._nodes])
        self.ordinal = np.empty(self.num_nodes, dtype=np.int64)
        for ids in self.ids.values():
            self.ordinal[ids] = np.arange(len(ids))
        return self

    def count(self, kind: str) -> int:
        return len(self.ids[kind])

    def attr(self, kind: str, key: str) -> np.ndarray:
        """Attribute ``key`` of the nodes of ``kind``, in insertion order."""
        parts = [a[key] for k, _, a in self._nodes if k == kind]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def pairs(self, src_kind: str, dst_kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source ordinal, destination ordinal, link id) of every link from a ``src_kind``
        node to a ``dst_kind`` node, in link id order."""
        k = self.kind
        ids = np.flatnonzero((k[self.src] == self.kinds.index(src_kind)) & (k[self.dst] == self.kinds.index(dst_kind)))
        return self.ordinal[self.src[ids]], self.ordinal[self.dst[ids]], ids

    def graph(self) -> nx.DiGraph:
        """The ``nx.DiGraph`` of the table: the same nodes, attributes and edge order."""
        import networkx as nx       # (only here: a run that never asks for the graph does not import it)

        g = nx.DiGraph()
        for kind, names, attrs in self._nodes:
            cols = {k: a.tolist() for k, a in attrs.items()}
            g.add_nodes_from((n, {"kind": kind, **{k: c[i] for k, c in cols.items()}}) for i, n in enumerate(names))
        nm, tiers = self.names, TIERS
        g.add_edges_from((nm[u], nm[v], {"bandwidth_bytes_per_s": b, "latency_s": lat, "tier": tiers[t]})
                         for u, v, b, lat, t in zip(self.src.tolist(), self.dst.tolist(), self.capacity.tolist(),
                                                    self.latency.tolist(), self.tier.tolist()))
        return g


def nvlink_domains(t: GraphTable, num_hosts: int, gpus_per_host: int, domain_size: int,
                   nvlink_bandwidth_bytes_per_s: float) -> GraphTable:
    """GPUs and one NVSwitch node per NVLink domain.

    Parameters
    ----------
    num_hosts, gpus_per_host : int
        GPU ``g`` is ``gpu{g}`` with ``host = g // gpus_per_host``.
    domain_size : int
        GPUs per NVLink domain (8 on HGX, 72 on NVL72); consecutive GPUs share a domain.
    nvlink_bandwidth_bytes_per_s : float
        Per-GPU NVLink bandwidth, one direction (A100 300 GB/s, H100 450 GB/s, B200 900 GB/s).

    Adds nodes ``gpu{g}`` (kind ``gpu``; ``index``, ``host``, ``local``, ``domain``) and
    ``nvsw{d}`` (kind ``nvswitch``; ``index``); links ``gpu <-> nvsw`` of tier ``nvlink``.
    A domain of one GPU gets no switch.
    """
    n = num_hosts * gpus_per_host
    i = np.arange(n)
    gpus = t.add_nodes("gpu", [f"gpu{g}" for g in range(n)], index=i, host=i // gpus_per_host,
                       local=i % gpus_per_host, domain=i // domain_size)
    if domain_size > 1:
        nd = n // domain_size
        sw = t.add_nodes("nvswitch", [f"nvsw{d}" for d in range(nd)], index=np.arange(nd))
        members = np.arange(nd * domain_size)
        t.link(gpus[members], sw[members // domain_size], nvlink_bandwidth_bytes_per_s,
               active_value(_LAT, LINK_LATENCY_S)[Tier.NVLINK], Tier.NVLINK)
    return t


def mesh_domains(t: GraphTable, num_hosts: int, gpus_per_host: int, domain_size: int,
                 link_bandwidth_bytes_per_s: float) -> GraphTable:
    """GPUs whose scale-up domains are full meshes: every pair of GPUs of a domain has its own
    link, no switch (AMD Infinity Fabric / xGMI: 8 GPUs, 7 links each).

    Adds the same ``gpu{g}`` nodes as :func:`nvlink_domains`; links ``gpu{a} <-> gpu{b}`` of
    tier ``nvlink`` for every pair ``a < b`` of a domain, of ``link_bandwidth_bytes_per_s`` per
    direction, laid domain by domain, ``a`` then ``b`` in order.
    """
    n = num_hosts * gpus_per_host
    i = np.arange(n)
    gpus = t.add_nodes("gpu", [f"gpu{g}" for g in range(n)], index=i, host=i // gpus_per_host,
                       local=i % gpus_per_host, domain=i // domain_size)
    if domain_size > 1:
        a, b = np.triu_indices(domain_size, k=1)
        base = np.repeat(np.arange(0, n - n % domain_size, domain_size), a.size)
        t.link(gpus[base + np.tile(a, n // domain_size)], gpus[base + np.tile(b, n // domain_size)],
               link_bandwidth_bytes_per_s, LINK_LATENCY_S[Tier.NVLINK], Tier.NVLINK)
    return t


def host_nics(t: GraphTable, num_hosts: int, gpus_per_host: int, nics_per_host: int,
              pcie_bandwidth_bytes_per_s: float) -> GraphTable:
    """Add ``nics_per_host`` NICs per host; GPU ``local`` uses NIC ``local // (gpus_per_host // nics_per_host)``.

    NIC ``nic{h}.{k}`` (kind ``nic``; ``index = h*nics_per_host + k``, ``host``, ``rail = k``)
    is joined to each affine GPU by a ``pcie`` link, so GPUs sharing a NIC share its
    network port but not their PCIe lanes.
    """
    per_nic = gpus_per_host // nics_per_host
    k = np.arange(num_hosts * nics_per_host)
    nics = t.add_nodes("nic", [f"nic{h}.{r}" for h in range(num_hosts) for r in range(nics_per_host)],
                       index=k, host=k // nics_per_host, rail=k % nics_per_host)
    gpus = np.asarray(t.ids["gpu"], dtype=np.int64)
    g = np.arange(num_hosts * nics_per_host * per_nic)       # host-major, NIC by NIC
    t.link(gpus[g], nics[g // per_nic], pcie_bandwidth_bytes_per_s, active_value(_LAT, LINK_LATENCY_S)[Tier.PCIE],
           Tier.PCIE)
    return t


def leaf_spine(t: GraphTable, pod: int, hosts: range, nics_per_host: int, nic_bandwidth_bytes_per_s: float,
               hosts_per_leaf: int, rail_optimized: bool, oversubscription: float,
               num_spines: int) -> GraphTable:
    """A two-tier leaf/spine fat-tree over the NICs of ``hosts`` (one pod).

    Rail-optimised: NIC ``k`` of every host in a unit of ``hosts_per_leaf`` hosts connects
    to leaf ``k`` of that unit, so same-rail traffic inside a unit never leaves its leaf.
    Otherwise one leaf takes all NICs of its unit.  Every leaf connects to every spine;
    the leaf's uplink capacity is its downlink capacity divided by ``oversubscription``,
    split evenly over ``num_spines`` (a spine node stands for one spine plane).
    Leaves are ``leaf{pod}.{i}`` (``pod``, ``index``, ``unit``, ``rail`` or -1); spines
    ``spine{pod}.{s}``.  Leaves are laid unit by unit, rail by rail; a leaf's NIC links
    host by host, rail by rail.
    """
    lat = active_value(_LAT, LINK_LATENCY_S)[Tier.IB]
    rails = nics_per_host if rail_optimized else 1
    num_units = -(-len(hosts) // hosts_per_leaf)
    li = np.arange(num_units * rails)
    leaves = t.add_nodes("leaf", [f"leaf{pod}.{i}" for i in li.tolist()], pod=pod, index=li, unit=li // rails,
                         rail=li % rails if rail_optimized else -1)
    h = np.repeat(np.arange(len(hosts)), nics_per_host)      # every NIC of the pod, host-major
    k = np.tile(np.arange(nics_per_host), len(hosts))
    leaf = (h // hosts_per_leaf) * rails + (k if rail_optimized else 0)
    order = np.lexsort((k, h, leaf))
    nics = np.asarray(t.ids["nic"], dtype=np.int64)[(hosts.start + h) * nics_per_host + k]
    t.link(nics[order], leaves[leaf[order]], nic_bandwidth_bytes_per_s, lat, Tier.IB)
    spines = t.add_nodes("spine", [f"spine{pod}.{s}" for s in range(num_spines)], pod=pod,
                         index=np.arange(num_spines))
    ports = np.bincount(leaf, minlength=leaves.size)
    up = ports * nic_bandwidth_bytes_per_s / oversubscription / num_spines
    t.link(np.repeat(leaves, num_spines), np.tile(spines, leaves.size), np.repeat(up, num_spines), lat, Tier.IB)
    return t


def cross_rack_core(t: GraphTable, num_pods: int, num_spines: int, num_cores: int,
                    pod_uplink_bytes_per_s: float, latency_s: float) -> GraphTable:
    """Connect every pod's spines to ``num_cores`` core switches (tier ``xrack``).

    Each pod's total cross-rack bandwidth (one direction) is ``pod_uplink_bytes_per_s``,
    split evenly over its spine -> core links; links are laid core by core, then pod by
    pod and spine by spine.
    """
    per_link = pod_uplink_bytes_per_s / (num_spines * num_cores)
    spines = np.asarray(t.ids["spine"], dtype=np.int64)[:num_pods * num_spines]
    for c in range(num_cores):
        core = t.add_nodes("core", [f"core{c}"], index=c)
        t.link(spines, np.repeat(core, spines.size), per_link, latency_s, Tier.XRACK)
    return t
