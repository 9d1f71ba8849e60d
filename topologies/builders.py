"""networkx-style generators for cluster graphs.

Every builder is a pure function returning (or extending) an ``nx.DiGraph``.  Links are
directed edges, one per direction, with attributes

``bandwidth_bytes_per_s``  capacity of one direction, bytes/s
``latency_s``              physical latency of the link, s
``tier``                   :class:`~topologies.specs.Tier` value

and nodes carry ``kind`` (``gpu``, ``nvswitch``, ``nic``, ``leaf``, ``spine``, ``core``)
plus the indices that :class:`~topologies.cluster.Cluster` uses for structural routing.

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

Racks (pods) repeat this picture and connect their spines to a cross-rack core
(tier xrack).  The NVSwitch of a domain is one non-blocking node: NVLink bandwidth is
a property of each GPU's port (up and down), as on HGX and NVL72 systems.
"""

from __future__ import annotations

import networkx as nx

from .specs import LINK_LATENCY_S, Tier

__all__ = ["nvlink_domains", "host_nics", "leaf_spine", "cross_rack_core"]


def _link(g: nx.DiGraph, u: str, v: str, bw: float, lat: float, tier: Tier) -> None:
    attrs = dict(bandwidth_bytes_per_s=float(bw), latency_s=float(lat), tier=tier)
    g.add_edge(u, v, **attrs)
    g.add_edge(v, u, **attrs)


def nvlink_domains(num_hosts: int, gpus_per_host: int, domain_size: int,
                   nvlink_bandwidth_bytes_per_s: float, graph: nx.DiGraph | None = None) -> nx.DiGraph:
    """GPUs and one NVSwitch node per NVLink domain.

    Parameters
    ----------
    num_hosts, gpus_per_host : int
        GPU ``g`` is ``gpu{g}`` with ``host = g // gpus_per_host``.
    domain_size : int
        GPUs per NVLink domain (8 on HGX, 72 on NVL72); consecutive GPUs share a domain.
    nvlink_bandwidth_bytes_per_s : float
        Per-GPU NVLink bandwidth, one direction (A100 300 GB/s, H100 450 GB/s, B200 900 GB/s).

    Returns
    -------
    networkx.DiGraph
        Nodes ``gpu{g}`` (kind ``gpu``; ``index``, ``host``, ``local``, ``domain``) and
        ``nvsw{d}`` (kind ``nvswitch``); edges ``gpu <-> nvsw`` of tier ``nvlink``.
        A domain of one GPU gets no switch.
    """
    g = nx.DiGraph() if graph is None else graph
    num_gpus = num_hosts * gpus_per_host
    for i in range(num_gpus):
        g.add_node(f"gpu{i}", kind="gpu", index=i, host=i // gpus_per_host,
                   local=i % gpus_per_host, domain=i // domain_size)
    if domain_size > 1:
        lat = LINK_LATENCY_S[Tier.NVLINK]
        for d in range(num_gpus // domain_size):
            g.add_node(f"nvsw{d}", kind="nvswitch", index=d)
            for i in range(d * domain_size, (d + 1) * domain_size):
                _link(g, f"gpu{i}", f"nvsw{d}", nvlink_bandwidth_bytes_per_s, lat, Tier.NVLINK)
    return g


def host_nics(graph: nx.DiGraph, num_hosts: int, gpus_per_host: int, nics_per_host: int,
              pcie_bandwidth_bytes_per_s: float) -> nx.DiGraph:
    """Add ``nics_per_host`` NICs per host; GPU ``local`` uses NIC ``local // (gpus_per_host // nics_per_host)``.

    NIC ``nic{h}.{k}`` (kind ``nic``; ``index = h*nics_per_host + k``, ``host``, ``rail = k``)
    is joined to each affine GPU by a ``pcie`` link, so GPUs sharing a NIC share its
    network port but not their PCIe lanes.
    """
    per_nic = gpus_per_host // nics_per_host
    lat = LINK_LATENCY_S[Tier.PCIE]
    for h in range(num_hosts):
        for k in range(nics_per_host):
            nic = f"nic{h}.{k}"
            graph.add_node(nic, kind="nic", index=h * nics_per_host + k, host=h, rail=k)
            for local in range(k * per_nic, (k + 1) * per_nic):
                _link(graph, f"gpu{h * gpus_per_host + local}", nic, pcie_bandwidth_bytes_per_s, lat, Tier.PCIE)
    return graph


def leaf_spine(graph: nx.DiGraph, pod: int, hosts: range, nics_per_host: int, nic_bandwidth_bytes_per_s: float,
               hosts_per_leaf: int, rail_optimized: bool, oversubscription: float,
               num_spines: int) -> nx.DiGraph:
    """A two-tier leaf/spine fat-tree over the NICs of ``hosts`` (one pod).

    Rail-optimised: NIC ``k`` of every host in a unit of ``hosts_per_leaf`` hosts connects
    to leaf ``k`` of that unit, so same-rail traffic inside a unit never leaves its leaf.
    Otherwise one leaf takes all NICs of its unit.  Every leaf connects to every spine;
    the leaf's uplink capacity is its downlink capacity divided by ``oversubscription``,
    split evenly over ``num_spines`` (a spine node stands for one spine plane).
    Leaves are ``leaf{pod}.{i}`` (``pod``, ``index``, ``rail`` or -1); spines
    ``spine{pod}.{s}``.
    """
    lat = LINK_LATENCY_S[Tier.IB]
    hosts = list(hosts)
    units = [hosts[i:i + hosts_per_leaf] for i in range(0, len(hosts), hosts_per_leaf)]
    leaves = []
    for u, unit in enumerate(units):
        rails = range(nics_per_host) if rail_optimized else [None]
        for r in rails:
            leaf = f"leaf{pod}.{len(leaves)}"
            graph.add_node(leaf, kind="leaf", pod=pod, index=len(leaves), unit=u,
                           rail=-1 if r is None else r)
            ports = 0
            for h in unit:
                for k in (range(nics_per_host) if r is None else [r]):
                    _link(graph, f"nic{h}.{k}", leaf, nic_bandwidth_bytes_per_s, lat, Tier.IB)
                    ports += 1
            leaves.append((leaf, ports))
    for s in range(num_spines):
        graph.add_node(f"spine{pod}.{s}", kind="spine", pod=pod, index=s)
    for leaf, ports in leaves:
        up = ports * nic_bandwidth_bytes_per_s / oversubscription / num_spines
        for s in range(num_spines):
            _link(graph, leaf, f"spine{pod}.{s}", up, lat, Tier.IB)
    return graph


def cross_rack_core(graph: nx.DiGraph, num_pods: int, num_spines: int, num_cores: int,
                    pod_uplink_bytes_per_s: float, latency_s: float) -> nx.DiGraph:
    """Connect every pod's spines to ``num_cores`` core switches (tier ``xrack``).

    Each pod's total cross-rack bandwidth (one direction) is ``pod_uplink_bytes_per_s``,
    split evenly over its spine -> core links.
    """
    per_link = pod_uplink_bytes_per_s / (num_spines * num_cores)
    for c in range(num_cores):
        graph.add_node(f"core{c}", kind="core", index=c)
        for p in range(num_pods):
            for s in range(num_spines):
                _link(graph, f"spine{p}.{s}", f"core{c}", per_link, latency_s, Tier.XRACK)
    return graph
