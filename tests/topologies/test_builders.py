"""The link-table builders against the edge-by-edge networkx build they replaced.

Link ids are positions in the graph's edge iteration order, and the routes, the
collective plans and the golden digests are written in link ids, so the table must
give the same graph: the same nodes with the same attributes in the same order, the same
links in the same order with the same capacity, latency and tier bits, and the same
route tables.  :func:`reference_graph` is the old build, kept here as the definition.
"""

import networkx as nx
import numpy as np
import pytest

from topologies import build_cluster
from topologies.specs import LINK_LATENCY_S, TIER_INDEX, Tier


def _link(g, u, v, bw, lat, tier):
    attrs = dict(bandwidth_bytes_per_s=float(bw), latency_s=float(lat), tier=tier)
    g.add_edge(u, v, **attrs)
    g.add_edge(v, u, **attrs)


def reference_graph(spec) -> nx.DiGraph:
    """The cluster graph drawn edge by edge, as topologies.builders did before the tables."""
    g = nx.DiGraph()
    n, gph, dom, nics = spec.num_gpus, spec.gpus_per_host, spec.nvlink_domain_size, spec.nics_per_host
    for i in range(n):
        g.add_node(f"gpu{i}", kind="gpu", index=i, host=i // gph, local=i % gph, domain=i // dom)
    if dom > 1:
        for d in range(n // dom):
            g.add_node(f"nvsw{d}", kind="nvswitch", index=d)
            for i in range(d * dom, (d + 1) * dom):
                _link(g, f"gpu{i}", f"nvsw{d}", spec.nvlink_bandwidth_bytes_per_s, LINK_LATENCY_S[Tier.NVLINK],
                      Tier.NVLINK)
    if nics:
        per = gph // nics
        for h in range(spec.num_nodes):
            for k in range(nics):
                g.add_node(f"nic{h}.{k}", kind="nic", index=h * nics + k, host=h, rail=k)
                for local in range(k * per, (k + 1) * per):
                    _link(g, f"gpu{h * gph + local}", f"nic{h}.{k}", spec.pcie_bandwidth_bytes_per_s,
                          LINK_LATENCY_S[Tier.PCIE], Tier.PCIE)
    if nics == 0 or n <= dom and spec.num_nodes == 1:
        return g
    rack = spec.hosts_per_rack or spec.num_nodes
    num_pods = spec.num_nodes // rack
    hpl = min(spec.hosts_per_leaf, rack)
    ports = hpl * (1 if spec.rail_optimized else nics)
    spines = spec.num_spines or max(1, int(round(ports / spec.oversubscription)))
    lat = LINK_LATENCY_S[Tier.IB]
    for p in range(num_pods):
        hosts = list(range(p * rack, (p + 1) * rack))
        leaves = []
        for u, unit in enumerate(hosts[i:i + hpl] for i in range(0, len(hosts), hpl)):
            for r in (range(nics) if spec.rail_optimized else [None]):
                leaf = f"leaf{p}.{len(leaves)}"
                g.add_node(leaf, kind="leaf", pod=p, index=len(leaves), unit=u, rail=-1 if r is None else r)
                ports = 0
                for h in unit:
                    for k in (range(nics) if r is None else [r]):
                        _link(g, f"nic{h}.{k}", leaf, spec.nic_bandwidth_bytes_per_s, lat, Tier.IB)
                        ports += 1
                leaves.append((leaf, ports))
        for s in range(spines):
            g.add_node(f"spine{p}.{s}", kind="spine", pod=p, index=s)
        for leaf, ports in leaves:
            for s in range(spines):
                _link(g, leaf, f"spine{p}.{s}", ports * spec.nic_bandwidth_bytes_per_s / spec.oversubscription / spines,
                      lat, Tier.IB)
    if num_pods > 1:
        per_link = spec.xrack_bandwidth_per_host_bytes_per_s * rack / (spines * spec.num_cores)
        for c in range(spec.num_cores):
            g.add_node(f"core{c}", kind="core", index=c)
            for p in range(num_pods):
                for s in range(spines):
                    _link(g, f"spine{p}.{s}", f"core{c}", per_link, spec.xrack_latency_s, Tier.XRACK)
    return g


def reference_tables(g: nx.DiGraph, num_gpus: int) -> dict[str, np.ndarray]:
    """The route tables the router read off the graph before the tables (ports by look-up)."""
    lid = {uv: i for i, uv in enumerate(g.edges())}
    t = {k: np.full(num_gpus, -1) for k in ("nvl_up", "nvl_down", "pcie_up", "pcie_down")}
    for i in range(num_gpus):
        for nb in g.successors(f"gpu{i}"):
            kind = {"nvswitch": "nvl", "nic": "pcie"}[g.nodes[nb]["kind"]]
            t[f"{kind}_up"][i], t[f"{kind}_down"][i] = lid[(f"gpu{i}", nb)], lid[(nb, f"gpu{i}")]
    nics = sorted((a["index"], n) for n, a in g.nodes(data=True) if a["kind"] == "nic")
    leaves = sorted(((a["pod"], a["index"]), n) for n, a in g.nodes(data=True) if a["kind"] == "leaf")
    leaf_index = {n: i for i, (_, n) in enumerate(leaves)}
    t["nic_up"], t["nic_down"], t["nic_leaf"] = (np.full(len(nics), -1) for _ in range(3))
    t["nic_port"] = np.zeros(len(nics), dtype=int)
    used: dict[int, int] = {}
    for k, (_, name) in enumerate(nics):
        for nb in g.successors(name):
            if g.nodes[nb]["kind"] == "leaf":
                t["nic_up"][k], t["nic_down"][k] = lid[(name, nb)], lid[(nb, name)]
                t["nic_leaf"][k] = leaf = leaf_index[nb]
                t["nic_port"][k] = used.get(leaf, 0)
                used[leaf] = t["nic_port"][k] + 1
    spines = [n for n, a in g.nodes(data=True) if a["kind"] == "spine"]
    cores = [n for n, a in g.nodes(data=True) if a["kind"] == "core"]
    num_pods = 1 + max((g.nodes[s]["pod"] for s in spines), default=0)
    S, C = len(spines) // num_pods, len(cores)
    t["leaf_spine"] = np.array([[lid[(n, f"spine{p}.{s}")] for s in range(S)] for (p, _), n in leaves]
                               ).reshape(len(leaves), S)
    t["spine_leaf"] = np.array([[lid[(f"spine{p}.{s}", n)] for s in range(S)] for (p, _), n in leaves]
                               ).reshape(len(leaves), S)
    if C:
        t["spine_core"] = np.array([[[lid[(f"spine{p}.{s}", f"core{c}")] for c in range(C)] for s in range(S)]
                                    for p in range(num_pods)])
        t["core_spine"] = np.array([[[lid[(f"core{c}", f"spine{p}.{s}")] for c in range(C)] for s in range(S)]
                                    for p in range(num_pods)])
    return t


CASES = [
    ("dgx-h100", {"num_nodes": 4}),
    ("dgx-h100", {"num_nodes": 1}),
    ("h100-16k", {}),
    ("gb200-nvl72", {}),
    ("gb200-nvl72", {"num_nodes": 64, "nvlink_domain_size": 64, "hosts_per_leaf": 16}),
    ("a100-4nic", {"num_nodes": 8}),
    ("dgx-h100", {"num_nodes": 64, "hosts_per_leaf": 4, "hosts_per_rack": 16, "xrack_bandwidth_per_host": "100 GB/s",
                  "num_cores": 3, "oversubscription": 3.0, "rail_optimized": False}),
    ("dgx-h100", {"num_nodes": 24, "hosts_per_leaf": 4, "hosts_per_rack": 8, "xrack_bandwidth_per_host": "50 GB/s",
                  "num_cores": 2, "oversubscription": 1.5, "num_spines": 3}),
    ("dgx-h100", {"num_nodes": 4, "nvlink_domain_size": 1}),
    ("dgx-h100", {"num_nodes": 1, "nics_per_host": 0}),
]


@pytest.mark.parametrize("preset,over", CASES, ids=[f"{p}-{i}" for i, (p, _) in enumerate(CASES)])
def test_table_is_the_edge_by_edge_graph(preset, over):
    c = build_cluster(preset, **over)
    ref = reference_graph(c.spec)
    assert list(c.graph.nodes(data=True)) == list(ref.nodes(data=True))
    edges = list(ref.edges(data=True))
    assert c.link_nodes == [(u, v) for u, v, _ in edges]
    assert list(c.graph.edges(data=True)) == edges
    for name, key in (("link_capacity", "bandwidth_bytes_per_s"), ("link_latency", "latency_s")):
        want = np.array([a[key] for _, _, a in edges], dtype=float)
        assert getattr(c, name).tobytes() == want.tobytes(), name
    assert c.link_tier.tolist() == [TIER_INDEX[a["tier"]] for _, _, a in edges]
    for name, want in reference_tables(ref, c.num_gpus).items():
        got = getattr(c.router, name)
        assert np.array_equal(got[tuple(slice(0, k) for k in want.shape)], want), name
