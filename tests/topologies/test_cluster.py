"""Cluster builders: invariants, routes, presets and bad input."""

import collections

import networkx as nx
import numpy as np
import pytest

from topologies import CLUSTER_PRESETS, ConfigError, build_cluster, parse_bandwidth, parse_size, parse_time
from topologies.specs import TIER_INDEX, Tier


def kinds(c):
    return collections.Counter(k for _, k in c.graph.nodes(data="kind"))


def test_units():
    assert parse_bandwidth("400 Gb/s") == 50e9
    assert parse_bandwidth("450 GB/s") == 450e9
    assert parse_size("80 GiB") == 80 * 2**30
    assert parse_time("5 us") == pytest.approx(5e-6)
    with pytest.raises(ConfigError, match="bandwidth must be positive"):
        parse_bandwidth(0, "cluster.nic_bandwidth")
    with pytest.raises(ConfigError, match="cluster.x"):
        parse_bandwidth("fast", "cluster.x")


@pytest.mark.parametrize("preset", CLUSTER_PRESETS)
def test_every_preset_builds_and_routes(preset):
    c = build_cluster(preset)
    assert c.num_gpus == c.spec.num_nodes * c.spec.gpus_per_host
    assert len(c.gpus) == c.num_gpus
    assert np.all(c.link_capacity > 0)
    # a route from GPU 0 to the last GPU is a connected path in the graph
    r = c.route(0, c.num_gpus - 1)
    nodes = [c.link_nodes[l] for l in r.links]
    assert nodes[0][0] == "gpu0" and nodes[-1][1] == c.gpus[-1]
    for (u1, v1), (u2, v2) in zip(nodes, nodes[1:]):
        assert v1 == u2 or r.coefs.min() < 1      # adaptive spreads are parallel, not chained


def test_dgx_h100_invariants():
    c = build_cluster("dgx-h100", num_nodes=64)
    k = kinds(c)
    assert k["gpu"] == 512 and k["nic"] == 512 and k["nvswitch"] == 64
    assert k["leaf"] == 2 * 8           # 2 units of 32 hosts x 8 rails
    assert k["spine"] == 32
    deg = collections.Counter(c.graph.out_degree(n) for n, kd in c.graph.nodes(data="kind") if kd == "gpu")
    assert deg == {2: 512}               # NVSwitch + own NIC
    nvl = c.link_capacity[c.link_tier == TIER_INDEX[Tier.NVLINK]]
    assert np.all(nvl == 450e9)
    # full bisection: every leaf's uplink capacity equals its downlink capacity
    for leaf, kd in c.graph.nodes(data="kind"):
        if kd != "leaf":
            continue
        down = sum(a["bandwidth_bytes_per_s"] for _, v, a in c.graph.out_edges(leaf, data=True)
                   if c.graph.nodes[v]["kind"] == "nic")
        up = sum(a["bandwidth_bytes_per_s"] for _, v, a in c.graph.out_edges(leaf, data=True)
                 if c.graph.nodes[v]["kind"] == "spine")
        assert up == pytest.approx(down)


@pytest.mark.parametrize("ratio", [1.0, 2.0, 4.0])
def test_oversubscription_ratio(ratio):
    c = build_cluster("dgx-h100", num_nodes=64, oversubscription=ratio)
    for leaf, kd in c.graph.nodes(data="kind"):
        if kd == "leaf":
            out = [(c.graph.nodes[v]["kind"], a["bandwidth_bytes_per_s"]) for _, v, a in c.graph.out_edges(leaf, data=True)]
            down = sum(b for k, b in out if k == "nic")
            up = sum(b for k, b in out if k == "spine")
            assert down / up == pytest.approx(ratio)


def test_nvl72_and_fewer_nics():
    c = build_cluster("gb200-nvl72", num_nodes=36)
    assert c.nvlink_domain_size == 72 and c.gpus_per_host == 4
    assert c.domain_of(71) == 0 and c.domain_of(72) == 1
    # GPUs of different hosts in one NVL72 rack talk over NVLink only
    r = c.route(0, 70)
    assert [c.link_tier[l] for l in r.links] == [TIER_INDEX[Tier.NVLINK]] * 2
    assert c.route(0, 80).links.size > 2
    c4 = build_cluster("a100-4nic", num_nodes=2)
    assert c4.nic_of(0) == c4.nic_of(1) == 0 and c4.nic_of(2) == 1 and c4.nic_of(8) == 4
    assert kinds(c4)["nic"] == 8


def test_cross_rack_tier_and_latency():
    c = build_cluster("dgx-h100", num_nodes=4, hosts_per_rack=2, xrack_bandwidth_per_host="25 GB/s")
    r = c.route(0, 16)            # host 0 (rack 0) -> host 2 (rack 1), same rail
    tiers = [c.link_tier[l] for l in r.links]
    assert TIER_INDEX[Tier.XRACK] in tiers
    xr = c.link_capacity[c.link_tier == TIER_INDEX[Tier.XRACK]]
    # each rack's uplink = 25 GB/s x 2 hosts, spread over its spine->core links
    per_rack = xr.sum() / 2 / 2           # both directions, two racks
    assert per_rack == pytest.approx(50e9)
    assert c.router.path_latency(r) > c.router.path_latency(c.route(0, 8))


def test_routes_are_shortest_paths_on_a_small_fabric():
    c = build_cluster("dgx-h100", num_nodes=4, hosts_per_leaf=2, pxn=False)
    g = c.graph
    for a, b in [(0, 1), (0, 8), (0, 16), (3, 27), (5, 30)]:
        r = c.route(a, b)
        assert len(r.links) == nx.shortest_path_length(g, f"gpu{a}", f"gpu{b}")


def test_pxn_keeps_cross_rail_traffic_on_one_rail(dgx2):
    r = dgx2.route(0, 9)          # rail 0 -> rail 1 on the other host
    names = [dgx2.link_nodes[l] for l in r.links]
    assert names[0] == ("gpu0", "nvsw0") and names[1] == ("nvsw0", "gpu1")
    assert not any("spine" in u or "spine" in v for u, v in names)
    r2 = dgx2.route(0, 9, pxn=False)
    assert any("spine" in v for _, v in (dgx2.link_nodes[l] for l in r2.links))


def test_routing_policies():
    ecmp = build_cluster("dgx-h100", num_nodes=64, routing="ecmp_hash", seed=3)
    planes = {ecmp.link_nodes[ecmp.route(0, 8 * 40, flow_key=k, pxn=False).links[2]][1] for k in range(64)}
    assert len(planes) > 4                          # flows hash onto many spines
    again = build_cluster("dgx-h100", num_nodes=64, routing="ecmp_hash", seed=3)
    assert np.array_equal(again.route(0, 320, flow_key=5).links, ecmp.route(0, 320, flow_key=5).links)
    ad = build_cluster("dgx-h100", num_nodes=64, routing="adaptive")
    r = ad.route(0, 320)
    assert r.coefs.min() == pytest.approx(1 / 32) and r.coefs.max() == 1.0


@pytest.mark.parametrize("cfg, field", [
    ({"preset": "no-such"}, "cluster.preset"),
    ({"preset": "dgx-h100", "nic_bandwidth": -5}, "cluster.nic_bandwidth"),
    ({"preset": "dgx-h100", "num_gpus": 12}, "cluster.num_gpus"),
    ({"preset": "dgx-h100", "num_nodes": 0}, "cluster.num_nodes"),
    ({"preset": "dgx-h100", "num_nodes": 2, "nics_per_host": 0}, "cluster.nics_per_host"),
    ({"preset": "dgx-h100", "bogus": 1}, "cluster.bogus"),
    ({"preset": "dgx-h100", "routing": "random"}, "cluster.routing"),
    ({"preset": "dgx-h100", "oversubscription": 0}, "cluster.oversubscription"),
    ({"preset": "gb200-nvl72", "num_nodes": 20}, "cluster.nvlink_domain_size"),
    ({"gpu": "Z100", "num_nodes": 1}, "cluster.gpu"),
    ({"preset": "dgx-h100", "sharp": "yes"}, "cluster.sharp"),
])
def test_bad_input_names_field_value_and_rule(cfg, field):
    with pytest.raises(ConfigError) as e:
        build_cluster(cfg)
    assert e.value.field == field
    assert str(e.value).startswith(field)


def test_a_job_smaller_than_the_nvlink_domain_is_one_domain_of_its_size():
    c = build_cluster("gb200-nvl72", num_nodes=16)          # 16 trays of an NVL72 rack
    assert c.spec.nvlink_domain_size == 64 and c.domain_of(63) == 0
    with pytest.raises(ConfigError, match="largest that does and fits is 64"):
        build_cluster("gb200-nvl72", num_nodes=32)          # 128 GPUs: say how to lay it out
