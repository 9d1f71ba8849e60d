"""The collective algorithm and protocol registries (simulator/collectives/algorithms.py)."""

import pytest
import simpy

from simulator.collectives import ALGORITHMS, PROTOCOLS, CollectiveAlgorithm, CollectiveEngine, Protocol, nccl
from simulator.collectives.algorithms import register
from simulator.collectives.engine import PORT_ALGOS
from topologies import ConfigError, build_cluster


def test_registry_covers_nccls_axes_in_order():
    assert tuple(ALGORITHMS)[:len(nccl.ALGORITHMS)] == nccl.ALGORITHMS
    assert tuple(PROTOCOLS) == nccl.PROTOCOLS
    for name, a in ALGORITHMS.items():
        assert isinstance(a, CollectiveAlgorithm) and a.name == name
        if name in nccl.ALGORITHMS:           # NCCL's tables have a row for each
            assert name in nccl.BASE_LAT_US and all(name in row for row in nccl.HW_LAT_US.values())
    assert [a.index for a in ALGORITHMS.values()] == list(range(len(ALGORITHMS)))
    assert all(isinstance(p, Protocol) and p.index == i for i, p in enumerate(PROTOCOLS.values()))


def test_every_enabled_algorithm_resolves():
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
        for n_nodes in (1, 4):
            for algo, proto in nccl.enabled_algorithms(kind, n_nodes, True, 8, sharp=True):
                assert algo in ALGORITHMS and proto in PROTOCOLS


def test_port_algos_are_the_port_local_ones():
    assert PORT_ALGOS == {"ring", "tree", "nvls", "nvls_tree"}


def test_register_refuses_a_name_twice():
    with pytest.raises(ValueError):
        register(ALGORITHMS["ring"])


def test_direct_and_unknown_algorithms_have_no_per_call_plan():
    eng = CollectiveEngine(simpy.Environment(), build_cluster("dgx-h100", num_nodes=1))
    for algo in ("direct", "bogus"):
        with pytest.raises(ConfigError, match="unknown algorithm"):
            eng.plan(tuple(range(8)), "all_reduce", algo)


def test_nccl_wrappers_match_the_objects():
    ring, ll = ALGORITHMS["ring"], PROTOCOLS["LL"]
    assert nccl.latency_us("all_reduce", "ring", "LL", 16, 2) == ring.latency_us("all_reduce", ll, 16, 2)
    assert nccl.bandwidth_factor("all_reduce", "tree", "LL128", 2, 2**20) == \
        ALGORITHMS["tree"].nccl_bandwidth_factor("all_reduce", PROTOCOLS["LL128"], 2, 2**20)
    with pytest.raises(ValueError):
        nccl.latency_us("all_reduce", "direct", "Simple", 16, 2)
