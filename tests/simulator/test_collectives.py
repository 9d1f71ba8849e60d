"""Collectives through the flow network against independent closed forms, and their rules."""

import dataclasses
import importlib

import numpy as np
import pytest
import simpy

from simulator.collectives import IDEAL, CollectiveEngine, CollectiveError
from simulator.collectives import analytic as A
from topologies import build_cluster

ALPHA = 3e-6
CAL = dataclasses.replace(IDEAL, step_latency_s=ALPHA)
REL = 1e-9


def fast_nvlink_cluster(num_nodes, **kw):
    """DGX-like hosts whose NVLink is 10x the NIC, so NICs are the only bottleneck across hosts."""
    cfg = {"gpu": "H100-SXM", "num_nodes": num_nodes, "gpus_per_host": 8, "nvlink_domain_size": 8,
           "nvlink_bandwidth": "2000 GB/s", "pcie_bandwidth": "400 GB/s", "nics_per_host": 8, "nic": "ndr",
           "hosts_per_leaf": 32}
    cfg.update(kw)
    return build_cluster(cfg)


def run_one(cluster, members, kind, size, algo=None, proto="Simple", cal=CAL, **kw):
    env = simpy.Environment()
    eng = CollectiveEngine(env, cluster, cal)
    g = eng.register_group(members)
    eng.issue(g, 0, kind, size, count=len(members), algo=algo, proto=proto, **kw)
    env.run()
    r = eng.records[-1]
    return r.end_s - r.arrive_s, eng


def close(a, b):
    assert abs(a - b) <= REL * max(abs(a), abs(b)), (a, b)


S = 256 * 2**20


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_inside_one_host(dgx2, n):
    B = 450e9
    close(run_one(dgx2, range(n), "all_reduce", S, "ring")[0], A.ring_all_reduce(n, S, B, ALPHA))
    close(run_one(dgx2, range(n), "all_gather", S, "ring")[0], A.ring_all_gather(n, S, B, ALPHA))
    close(run_one(dgx2, range(n), "reduce_scatter", S, "ring")[0], A.ring_reduce_scatter(n, S, B, ALPHA))
    close(run_one(dgx2, range(n), "broadcast", S, "ring")[0], A.chain_broadcast(n, S, B, ALPHA))


@pytest.mark.parametrize("hosts", [2, 4])
def test_ring_across_hosts_uses_one_channel_per_rail(hosts):
    c = fast_nvlink_cluster(hosts)
    n = 8 * hosts
    B = 8 * 50e9                      # eight rail channels, each held to its 400 Gb/s NIC
    close(run_one(c, range(n), "all_reduce", S, "ring")[0], A.ring_all_reduce(n, S, B, ALPHA))
    close(run_one(c, range(n), "all_gather", S, "ring")[0], A.ring_all_gather(n, S, B, ALPHA))
    # data parallelism across hosts: one GPU per host, one rail, one channel
    members = [8 * h + 3 for h in range(hosts)]
    close(run_one(c, members, "all_reduce", S, "ring")[0], A.ring_all_reduce(hosts, S, 50e9, ALPHA))


@pytest.mark.parametrize("hosts", [2, 4, 8])
def test_double_binary_tree_across_hosts(hosts):
    c = fast_nvlink_cluster(hosts)
    t, _ = run_one(c, range(8 * hosts), "all_reduce", S, "tree")
    close(t, A.tree_all_reduce(hosts, 8, S, 8 * 50e9, ALPHA))


def test_nvls_inside_one_host(dgx2):
    close(run_one(dgx2, range(8), "all_reduce", S, "nvls")[0], A.nvls_all_reduce(8, S, 450e9, ALPHA))


def test_nvls_disabled_like_nccl_nvls_enable_0():
    """``cluster.nvls: false`` (NCCL_NVLS_ENABLE=0) leaves NCCL ring and tree: on 8 H100 the
    all-reduce runs at the ring's rate, slower than with NVLS."""
    size = 2**30
    times = {}
    for nvls in (True, False):
        env = simpy.Environment()
        eng = CollectiveEngine(env, build_cluster("dgx-h100", num_nodes=1, nvls=nvls))
        choices = eng.predict(list(range(8)), "all_reduce", size)
        assert any(algo == "nvls" for algo, _ in choices) is nvls
        times[nvls] = min(choices.values())
    assert times[False] > 1.2 * times[True]


@pytest.mark.parametrize("hosts", [1, 2, 3])
def test_uniform_all_to_all(hosts):
    c = build_cluster("dgx-h100", num_nodes=max(hosts, 1))
    n = 8 * hosts
    t, _ = run_one(c, range(n), "all_to_all", n * 4 * 2**20, proto=None)
    close(t, A.uniform_all_to_all(hosts, 8, 4 * 2**20, 450e9, 50e9, ALPHA))


def test_send_recv_and_uneven_all_to_all(dgx2):
    env = simpy.Environment()
    eng = CollectiveEngine(env, dgx2, CAL)
    ev1 = eng.send_recv(("act", 0, 1), 0, 8, S, "send")
    ev2 = eng.send_recv(("act", 0, 1), 0, 8, S, "recv")
    assert ev1 is ev2
    env.run()
    close(eng.records[-1].end_s, A.p2p(S, 50e9, ALPHA))
    # uneven all-to-all inside a host: the busiest sender sets the time
    sizes = np.zeros((4, 4))
    sizes[0, 1:] = [3e8, 1e8, 1e8]
    sizes[2, 3] = 1e8
    t, _ = run_one(dgx2, range(4), "all_to_all", 0.0, proto=None, sizes=sizes)
    close(t, 5e8 / 450e9 + ALPHA)      # GPU 0's NVLink port carries 5e8 bytes


def _coupled_one(cluster, members, size, **kw):
    env = simpy.Environment()
    eng = CollectiveEngine(env, cluster, CAL)
    eng.coupled_all_to_all = True
    g = eng.register_group(members)
    eng.issue(g, 0, "all_to_all", size, count=len(members), **kw)
    env.run()
    r = eng.records[-1]
    return r.end_s - r.arrive_s, eng


@pytest.mark.parametrize("hosts", [1, 2, 3])
def test_coupled_all_to_all_keeps_the_closed_forms(hosts, dgx2):
    """The ``coupled_all_to_all`` approximation (one flow per source) gives the exact path's
    closed forms where a source's pairs all end on its bottleneck: the uniform all-to-all
    across hosts, and the uneven one inside a host that its busiest sender sets."""
    c = build_cluster("dgx-h100", num_nodes=hosts)
    n = 8 * hosts
    t, eng = _coupled_one(c, range(n), n * 4 * 2**20)
    close(t, A.uniform_all_to_all(hosts, 8, 4 * 2**20, 450e9, 50e9, ALPHA))
    assert eng.net.num_flows <= n           # one flow per source, not n (n - 1)
    sizes = np.zeros((4, 4))
    sizes[0, 1:] = [3e8, 1e8, 1e8]
    sizes[2, 3] = 1e8
    t, _ = _coupled_one(dgx2, range(4), 0.0, sizes=sizes)
    close(t, 5e8 / 450e9 + ALPHA)


def test_coupled_all_to_all_gives_up_early_finishes(dgx2):
    """What the approximation gives up, pinned by hand.  Inside a host (450 GB/s ports),
    GPU 1 sends 3e8 bytes to GPU 0 and 4e8 to GPU 2, and GPU 3 sends 3e8 to GPU 2.

    Exactly, the three pairs get 225 GB/s each (GPU 1's port and GPU 2's port are each
    shared by two); at 1.33 ms two finish and 1 -> 2 moves its last 1e8 at 450 GB/s: GPU
    1's port is never idle, so the call takes its 7e8 / 450e9.  Coupled, GPU 1's flow
    (two members, 3.5e8 each) must move its bytes 3:4 to GPUs 0 and 2, so GPU 2's port
    (8/7 r + r = 450 GB/s) holds it to r = 210 GB/s, also when its bytes to GPU 0 could
    go faster: 3e8 / 210e9 until GPU 3 is done, then its last 0.5e8 at 225 GB/s, 6 % longer."""
    sizes = np.zeros((4, 4))
    sizes[1, [0, 2]] = [3e8, 4e8]
    sizes[3, 2] = 3e8
    exact, _ = run_one(dgx2, range(4), "all_to_all", 0.0, proto=None, sizes=sizes)
    coupled, _ = _coupled_one(dgx2, range(4), 0.0, sizes=sizes)
    close(exact, 7e8 / 450e9 + ALPHA)
    close(coupled, 3e8 / 210e9 + 0.5e8 / 225e9 + ALPHA)


def test_collectives_start_when_the_last_member_arrives(dgx2):
    env = simpy.Environment()
    eng = CollectiveEngine(env, dgx2, CAL)
    g = eng.register_group(range(4))
    events = []

    def member(k):
        yield env.timeout(k * 1e-3)
        ev = eng.issue(g, 0, "all_reduce", S, algo="ring", proto="Simple")
        events.append(ev)
        yield ev
        assert env.now == pytest.approx(3e-3 + A.ring_all_reduce(4, S, 450e9, ALPHA), rel=REL)

    for k in range(4):
        env.process(member(k))
    env.run()
    assert len(set(map(id, events))) == 1 and eng.records[0].start_s == pytest.approx(3e-3)


def test_mismatched_collective_is_an_error(dgx2):
    env = simpy.Environment()
    eng = CollectiveEngine(env, dgx2, CAL)
    g = eng.register_group(range(2))
    eng.issue(g, 0, "all_reduce", S)
    with pytest.raises(CollectiveError, match="does not match"):
        eng.issue(g, 0, "all_gather", S)
    with pytest.raises(CollectiveError, match="does not match"):
        eng.issue(g, 0, "all_reduce", S / 2)


def test_an_arrival_after_the_call_completed_is_an_error(dgx2):
    """A third arrival at a two-member call is a rank outside the group (or a call issued
    twice); it used to open a phantom second call under the same number, which hid a
    program that gave DualPipe's middle ranks the tied-embedding all-reduce."""
    env = simpy.Environment()
    eng = CollectiveEngine(env, dgx2, CAL)
    g = eng.register_group(range(2))
    eng.issue(g, 0, "all_reduce", S)
    eng.issue(g, 0, "all_reduce", S)
    with pytest.raises(CollectiveError, match="issued after the call completed with all 2 members"):
        eng.issue(g, 0, "all_reduce", S)
    eng.issue(g, 1, "all_reduce", S)            # the next call is fine
    env.run()


def test_concurrent_collectives_contend_on_shared_links():
    # a TP ring inside host 0 and an all-to-all over the same NVLink ports slow each other down
    c = build_cluster("dgx-h100", num_nodes=1)
    alone, _ = run_one(c, range(8), "all_reduce", S, "ring")
    env = simpy.Environment()
    eng = CollectiveEngine(env, c, CAL)
    g1 = eng.register_group(range(8))
    g2 = eng.register_group(range(8), group_id=7)
    eng.issue(g1, 0, "all_reduce", S, count=8, algo="ring", proto="Simple")
    eng.issue(g2, 0, "all_to_all", S, count=8)
    env.run()
    ring = next(r for r in eng.records if r.kind == "all_reduce")
    assert ring.end_s > alone * 1.2


def test_oversubscribed_fabric_slows_a_cross_leaf_ring_by_the_bottleneck_ratio():
    """Eight DP rings (one per rail) over 4 hosts, 2 hosts per leaf, interleaved across leaves."""
    order = [0, 2, 1, 3]
    times, expected = {}, {}
    for ratio in (1.0, 2.0):
        c = build_cluster({"gpu": "H100-SXM", "num_nodes": 4, "nics_per_host": 8, "nic": "ndr",
                           "hosts_per_leaf": 2, "rail_optimized": False, "oversubscription": ratio})
        env = simpy.Environment()
        eng = CollectiveEngine(env, c, CAL)
        uses = np.zeros(c.num_links)
        for rail in range(8):
            members = [8 * h + rail for h in order]
            g = eng.register_group(members)
            eng.issue(g, 0, "all_reduce", S, count=4, algo="ring", proto="Simple")
            for a, b in zip(members, members[1:] + members[:1]):
                np.add.at(uses, c.route(a, b).links, c.route(a, b).coefs)
        env.run()
        times[ratio] = max(r.end_s for r in eng.records)
        # all rings are alike, so max-min gives each the rate of the most loaded link
        used = uses > 0
        expected[ratio] = float(np.min(c.link_capacity[used] / uses[used]))
        assert any("spine" in c.link_nodes[l][1] for l in np.flatnonzero(used))
    bw_ratio = expected[1.0] / expected[2.0]
    assert bw_ratio > 1.5            # the test is not vacuous: the uplinks are the bottleneck at 2:1
    t_bw = {k: v - 6 * ALPHA for k, v in times.items()}
    close(t_bw[2.0] / t_bw[1.0], bw_ratio)


def test_same_input_same_records():
    def once():
        c = build_cluster("dgx-h100", num_nodes=4, routing="ecmp_hash", seed=7)
        env = simpy.Environment()
        eng = CollectiveEngine(env, c)
        tp = eng.register_group(range(8))
        dp = eng.register_group([0, 8, 16, 24])
        ep = eng.register_group(range(32))
        for seq in range(3):
            eng.issue(tp, seq, "all_reduce", 64 * 2**20, count=8)
            eng.issue(dp, seq, "reduce_scatter", 2**30, count=4)
            eng.issue(ep, seq, "all_to_all", 2**28, count=32)
        env.run()
        return [(r.group_id, r.seq, r.algo, r.proto, r.start_s, r.end_s) for r in eng.records], eng.net.link_bytes
    a, bytes_a = once()
    b, bytes_b = once()
    assert a == b and np.array_equal(bytes_a, bytes_b)


@pytest.mark.parametrize("hosts", [2, 4])
@pytest.mark.parametrize("algo", ["collnet_direct", "nvls"])
def test_sharp_all_reduce_across_leaves(hosts, algo):
    # two hosts per leaf, so the aggregation tree climbs to a spine
    c = fast_nvlink_cluster(hosts, hosts_per_leaf=2, sharp=True)
    t, eng = run_one(c, range(8 * hosts), "all_reduce", S, algo)
    close(t, A.sharp_all_reduce(8, S, 2000e9, 50e9, ALPHA, nvls=(algo == "nvls")))
    plan = eng.plan(tuple(range(8 * hosts)), "all_reduce", algo)[0]
    spine_links = [l for f in plan.flows for l in f.links if "spine" in c.link_nodes[l][1]]
    assert bool(spine_links) == (hosts > 2)


def test_sharp_is_offered_only_where_declared():
    plain = build_cluster("dgx-h100", num_nodes=4)
    sharp = build_cluster("dgx-h100", num_nodes=4, sharp=True)
    members = tuple(range(32))
    algos = {a for a, _ in CollectiveEngine(simpy.Environment(), plain).predict(members, "all_reduce", 2**30)}
    assert "collnet_direct" not in algos and "nvls" not in algos
    eng = CollectiveEngine(simpy.Environment(), sharp)
    pred = eng.predict(members, "all_reduce", 2**30)
    assert {("collnet_direct", "Simple"), ("nvls", "Simple")} <= set(pred)
    # in-network reduction moves S/8 per NIC instead of a ring's ~2S/8: it wins for large messages
    assert eng.choose(members, "all_reduce", 2**30)[0] in ("collnet_direct", "nvls")
    with pytest.raises(Exception):
        CollectiveEngine(simpy.Environment(), plain).choose(members, "all_reduce", 2**30, algo="collnet_direct")


def test_ring_channels_use_every_nic_of_a_multi_host_nvlink_domain():
    """A ring crossing NVLink domains gets one channel per NIC it can pair across the
    domains (on one rail each): 8 on DGX H100 hosts as before; on two NVL72 racks a group
    with one GPU per compute tray has 18 NICs per rack on its rail, and a denser group hits
    NCCL's 32-channel cap -- not the 4 rails of one tray."""
    from simulator.collectives.plans import MAX_RING_CHANNELS, ring_plan
    dgx = build_cluster("dgx-h100", num_nodes=2)
    assert ring_plan(dgx, list(range(16)), "reduce_scatter").n_channels == 8
    gb = build_cluster({"preset": "gb200-nvl72", "num_nodes": 36})
    one_per_tray = list(range(0, 144, 4))
    plan = ring_plan(gb, one_per_tray, "reduce_scatter")
    assert plan.n_channels == 18
    # every channel leaves each rack through a different NIC
    nic_up = set(gb.router.nic_up.tolist())
    used = [frozenset(int(x) for x in f.links if int(x) in nic_up) for f in plan.flows]
    assert all(len(u) == 2 for u in used) and len(set().union(*used)) == 36
    assert ring_plan(gb, list(range(0, 144, 2)), "reduce_scatter").n_channels == MAX_RING_CHANNELS
    # the wider ring is faster than one NIC per rail would allow (4 x 50 GB/s per rack)
    env = simpy.Environment()
    eng = CollectiveEngine(env, gb)
    g = eng.register_group(one_per_tray)
    eng.issue(g, 0, "reduce_scatter", 2**30, count=len(one_per_tray), algo="ring", proto="Simple")
    env.run()
    r = eng.records[-1]
    assert 2**30 * 35 / 36 / (r.end_s - r.arrive_s) > 4 * 50e9


def _same_plan(a, b):
    assert (a.algo, a.n_ranks, a.n_nodes, a.n_channels, a.latency_inter_s, a.intra_hw) == \
        (b.algo, b.n_ranks, b.n_nodes, b.n_channels, b.latency_inter_s, b.intra_hw)
    assert len(a.flows) == len(b.flows)
    for f, g in zip(a.flows, b.flows):
        assert f.links.dtype == g.links.dtype and np.array_equal(f.links, g.links)
        assert f.coefs.tobytes() == g.coefs.tobytes()
        assert (f.bytes_per_byte, f.inter_node) == (g.bytes_per_byte, g.inter_node)


def _fresh(cluster, members, kind, algo):
    """The plan and prediction built for ``members`` alone (no other group cached)."""
    eng = CollectiveEngine(simpy.Environment(), cluster)
    return eng.plan(members, kind, algo), eng.predict(members, kind, 2**28)


@pytest.mark.parametrize("algo,kind", [("ring", "all_gather"), ("ring", "all_reduce"), ("nvls", "all_reduce"),
                                       ("tree", "all_reduce"), ("nvls_tree", "all_reduce")])
def test_translated_groups_share_one_plan_and_prediction(dgx2, algo, kind):
    # the same TP group on two hosts: one entry, moved onto the second host's NVLink ports
    eng = CollectiveEngine(simpy.Environment(), dgx2)
    a, b = tuple(range(8)), tuple(range(8, 16))
    pa, pb = eng.plan(a, kind, algo), eng.plan(b, kind, algo)
    pred_a, pred_b = eng.predict(a, kind, 2**28), eng.predict(b, kind, 2**28)
    # one entry per (collective, algorithm, root), whichever group asked first
    assert len({k[1:] for k in eng._form_plans}) == len(eng._form_plans) and len(eng._form_predictions) == 1
    for members, (p, spb), pred in ((a, pa, pred_a), (b, pb, pred_b)):
        (p0, spb0), pred0 = _fresh(dgx2, members, kind, algo)
        _same_plan(p, p0)
        assert spb == spb0 and pred == pred0
    assert not set(pa[0].flows[0].links) & set(pb[0].flows[0].links)


def test_groups_whose_ports_differ_in_capacity_or_order_do_not_share(dgx2):
    a, b = tuple(range(8)), tuple(range(8, 16))
    slow = np.ones(dgx2.num_links)
    slow[dgx2.router.nvl_up[11]] = 0.5                  # one NVLink port of the second host degraded
    c = dgx2.perturbed(capacity_factor=slow)
    eng = CollectiveEngine(simpy.Environment(), c)
    spb_a, (pb, spb_b) = eng.plan(a, "all_gather", "ring")[1], eng.plan(b, "all_gather", "ring")
    assert len(eng._form_plans) == 2 and spb_b > spb_a
    assert eng.predict(b, "all_gather", 2**28) == _fresh(c, b, "all_gather", "ring")[1]
    _same_plan(pb, _fresh(c, b, "all_gather", "ring")[0][0])
    # the same GPUs in another order make another ring
    rev = tuple(reversed(b))
    eng = CollectiveEngine(simpy.Environment(), dgx2)
    eng.plan(a, "all_gather", "ring")
    p, _ = eng.plan(rev, "all_gather", "ring")
    assert len(eng._form_plans) == 2
    _same_plan(p, _fresh(dgx2, rev, "all_gather", "ring")[0][0])


def test_groups_across_domains_and_collnet_have_no_form(dgx2):
    eng = CollectiveEngine(simpy.Environment(), dgx2)
    eng.plan((0, 8), "all_reduce", "ring")
    eng.predict((0, 8), "all_reduce", 2**28)
    assert eng._domain_form((0, 8)) is None and not eng._form_plans and not eng._form_predictions


def test_fold_labels_group_calls_once_per_domain_form(dgx2):
    fold = importlib.import_module("simulator.engine.fold")   # the package exports fold()
    vs = [("all_gather", 1e3, -1), ("all_reduce", 2.0**28, -1), ("reduce_scatter", 2.0**26, -1)]
    slow = np.ones(dgx2.num_links)
    slow[dgx2.router.nvl_up[11]] = 0.5                  # one NVLink port of the second host degraded
    for c, forms in ((dgx2, 1), (dgx2.perturbed(capacity_factor=slow), 2)):
        eng, shared = CollectiveEngine(simpy.Environment(), c), {}
        for g in (tuple(range(8)), tuple(range(8, 16)), tuple(range(15, 7, -1))):
            alone = fold._planned_calls(CollectiveEngine(simpy.Environment(), c), g, vs, {})
            assert fold._planned_calls(eng, g, vs, shared) == alone
        assert len(shared) == forms + 1                 # the reversed ring is a form of its own
        # a group across domains has no form: labelled on its own every time
        fold._planned_calls(eng, (0, 8), vs, shared)
        assert len(shared) == forms + 1


def test_node_blocks_and_channels_of_one_gpu_per_node():
    """A group with one GPU per NVLink domain (data parallelism across nodes) takes the
    short paths of ``node_blocks`` and ``_channels``: the same blocks as grouping member by
    member, and one channel, as the general rail matching gives blocks of one."""
    from simulator.collectives.plans import _channels, node_blocks

    c = build_cluster({"preset": "dgx-h100", "num_nodes": 32})
    rng = np.random.default_rng(3)
    for _ in range(20):
        nodes = rng.permutation(32)[: rng.integers(2, 33)]
        members = [int(n) * 8 + int(rng.integers(0, 8)) for n in nodes]
        assert node_blocks(c, members) == [[g] for g in members]
        blocks = node_blocks(c, members)
        # the general matching, on blocks that are not all of one GPU (a copy of the first block)
        padded = _channels(c, blocks + [[blocks[0][0], blocks[0][0] ^ 1]])
        assert _channels(c, blocks) == [[b[0] for b in blocks]] == [ch[:-1] for ch in padded][:1]


def test_batched_forms_rings_and_latencies_equal_one_at_a_time(dgx2):
    """What folding works out for many groups at once -- NVLink-domain forms, ring routes of
    groups across domains, path latencies of many routes -- is what the engine and the
    router give one group, one ring, one route at a time, bit for bit."""
    from simulator.collectives import plans

    slow = np.ones(dgx2.num_links)
    slow[dgx2.router.nvl_up[11]] = 0.5                  # one port of the second host degraded
    c = dgx2.perturbed(capacity_factor=slow)
    eng = CollectiveEngine(simpy.Environment(), c)
    groups = np.array([[0, 1, 2, 3], [8, 9, 10, 11], [12, 13, 14, 15], [3, 2, 1, 0], [4, 5, 6, 12], [0, 1, 1, 2]])
    forms, form_of, ports = eng.domain_forms(groups)
    for g, f, p in zip(groups.tolist(), form_of.tolist(), ports):
        one = CollectiveEngine(simpy.Environment(), c)._domain_form(tuple(g))
        assert (f < 0) == (one is None)
        if one is not None:
            assert forms[f] == one[0] and np.array_equal(p, one[1])
    assert form_of[0] != form_of[1] and form_of[0] != form_of[3]           # capacity, order
    # rings of one GPU per host: prefetched in one batch, then planned as usual
    rings = np.array([[0, 8], [8, 0], [1, 9], [0, 1]])
    plans.prefetch_rings(dgx2, rings)
    pre = dict(dgx2.router._concat_cache)
    dgx2.router._concat_cache.clear()
    assert len(pre) == 3
    for (edges, pxn), (links, coefs, lat) in pre.items():
        l0, c0, lat0 = plans._concat(dgx2, list(edges), pxn)
        assert np.array_equal(links, l0) and np.array_equal(coefs, c0) and lat == lat0
    # path latencies of many routes (over 16: deduplicated) and of a few (one by one)
    r = dgx2.router
    for n in (40, 5):
        src, dst = np.arange(n) % 16, (np.arange(n) * 7 + 3) % 16
        links, coefs, lens = r.routes_flat(src, dst)
        got = r.path_latencies(links, coefs, lens)
        assert [float(x) for x in got] == [r.path_latency(q) for q in r.routes(src, dst)]


def _whole_calls_trace(cluster, keep_whole: bool):
    """Calls every member of which arrives at once, again and again (TP all-reduces, a tiny
    one, gathers with other flows on their ports), with the engine's reuse of earlier
    all-at-once calls on or off: records, start times, counters and every event processed."""
    env = simpy.Environment()
    eng = CollectiveEngine(env, cluster, CAL)
    if not keep_whole:
        eng._keep_whole = lambda *a: None
    tp = eng.register_group(range(8))
    tp2 = eng.register_group(range(8, 16))
    a2a = eng.register_group(range(8), group_id=9)
    done = []

    def member(g, kind, size, seqs, gap):
        for seq in seqs:
            yield env.timeout(gap)
            yield eng.issue(g, seq, kind, size, count=8)
            done.append((g, seq, env.now))

    env.process(member(tp, "all_reduce", 32 * 2**20, range(6), 1e-5))
    env.process(member(tp2, "all_gather", 32 * 2**20, range(6), 2e-5))
    env.process(member(tp, "all_reduce", 1024, range(10, 14), 1e-5))     # tiny: no flows
    env.process(member(a2a, "all_to_all", 8 * 2**20, range(2), 3e-4))    # takes TP's ports meanwhile
    trace = []
    while env.peek() < float("inf"):
        env.step()
        trace.append(env.now)
    recs = [dataclasses.astuple(r) for r in eng.records]
    net = eng.net
    return (recs, done, trace, dict(eng.call_start), net.num_flows, net.link_bytes.tolist(), net.link_busy_s.tolist(),
            list(net._occ))


def test_reused_whole_calls_give_the_same_events_and_records():
    c = build_cluster("dgx-h100", num_nodes=2)
    fast, slow = _whole_calls_trace(c, True), _whole_calls_trace(c, False)
    assert fast == slow
    assert len(fast[0]) == 6 + 6 + 4 + 2 and not any(fast[-1])


def test_a_whole_call_issued_twice_is_an_error_on_the_reuse_path(dgx2):
    env = simpy.Environment()
    eng = CollectiveEngine(env, dgx2, CAL)
    g = eng.register_group(range(2))
    eng.issue(g, 0, "all_reduce", S, count=2)
    eng.issue(g, 1, "all_reduce", S, count=2)           # reuses call 0's preparation
    with pytest.raises(CollectiveError, match="issued after the call completed with all 2 members"):
        eng.issue(g, 1, "all_reduce", S, count=2)
    eng.issue(g, 2, "all_reduce", S, count=1)           # one member of call 2 is waiting
    with pytest.raises(CollectiveError, match="more arrivals than members"):
        eng.issue(g, 2, "all_reduce", S, count=2)
    env.run()
