"""MoE routing distributions, capacity, and their effect on expert load and all-to-all."""

import dataclasses

import numpy as np
import pytest
import simpy

from simulator.collectives import IDEAL, CollectiveEngine
from topologies import ConfigError, build_cluster
from workloads.moe_routing import apply_capacity, dispatch_matrix, expert_load, parse_routing, rank_load


@pytest.mark.parametrize("spec", ["balanced", "forced_balanced", "skew(1.5)", "zipf(1.1)"])
def test_loads_sum_to_tokens_times_topk_and_are_reproducible(spec):
    r = parse_routing(spec)
    a = expert_load(r, 4096, 64, 8, layer=3, microbatch=2, seed=7)
    b = expert_load(r, 4096, 64, 8, layer=3, microbatch=2, seed=7)
    assert a.sum() == 4096 * 8 and np.array_equal(a, b)
    if spec != "balanced":       # a different layer draws differently
        assert not np.array_equal(a, expert_load(r, 4096, 64, 8, layer=4, microbatch=2, seed=7))


@pytest.mark.parametrize("spec", ["zipf(1.0)", "zipf(1.5)", "skew(40)"])
def test_no_expert_gets_a_token_twice(spec):
    """A token picks top_k distinct experts, so an expert receives at most every token once:
    max/mean <= experts / top_k (16 for 128 experts, top 8).  Unbounded, Zipf(1.0) over
    128 experts would give its hottest expert 1 / H(128) = 18.4 % of the assignments, 23.6x
    the mean, more tokens than there are; the excess goes to the others by their weights."""
    tokens, experts, k = 4096, 128, 8
    load = expert_load(parse_routing(spec), tokens, experts, k, layer=1, microbatch=0, seed=3)
    assert load.sum() == tokens * k and load.max() == tokens
    assert load.max() / load.mean() == experts / k
    # below the bound nothing changes: zipf(0.5)'s hottest expert keeps its share (1/H_0.5(128))
    mild = expert_load(parse_routing("zipf(0.5)"), tokens, experts, k, seed=3)
    share = 1.0 / (1.0 / np.arange(1, experts + 1) ** 0.5).sum()
    assert abs(mild.max() - share * tokens * k) <= 1


def test_a_trace_cannot_give_an_expert_more_tokens_than_there_are(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("layer,microbatch,expert,tokens\n0,0,0,5000\n")
    with pytest.raises(ConfigError, match="a token picks an expert at most once"):
        expert_load(parse_routing({"trace": str(path)}), 4096, 8, 2)


def test_skew_sets_max_over_mean_and_the_hottest_rank():
    load = expert_load(parse_routing("skew(1.5)"), 8192, 8, 2, seed=1)
    assert load.max() / load.mean() == pytest.approx(1.5, rel=1e-3)
    balanced = expert_load(parse_routing("balanced"), 8192, 8, 2)
    # one expert per EP rank: the hottest rank computes 1.5x the balanced case
    assert rank_load(load, 8).max() / rank_load(balanced, 8).max() == pytest.approx(1.5, rel=1e-3)


def test_skewed_all_to_all_is_bounded_by_the_hottest_receiver():
    cluster = build_cluster("dgx-h100", num_nodes=1)
    h_bytes = 8192 * 2                       # hidden 8192 in bf16
    times = {}
    for spec in ("balanced", "skew(1.5)"):
        load = expert_load(parse_routing(spec), 4096 * 8, 8, 2, seed=3)
        sizes = dispatch_matrix(load, 8, h_bytes)
        env = simpy.Environment()
        eng = CollectiveEngine(env, cluster, dataclasses.replace(IDEAL, step_latency_s=0.0))
        g = eng.register_group(range(8))
        eng.issue(g, 0, "all_to_all", 0.0, count=8, sizes=sizes)
        env.run()
        times[spec] = eng.records[-1].end_s
        received = sizes.sum(axis=0) - np.diag(sizes)
        sent = sizes.sum(axis=1) - np.diag(sizes)
        bound = max(received.max(), sent.max()) / 450e9
        assert times[spec] == pytest.approx(bound, rel=1e-9)
    assert times["skew(1.5)"] / times["balanced"] == pytest.approx(1.5, rel=1e-3)


def test_capacity_drops_and_pads():
    load = np.array([300, 100, 100, 100])
    kept, dropped = apply_capacity(load, 300, 2, 1.0)      # capacity ceil(1.0*600/4) = 150
    assert kept.tolist() == [150, 100, 100, 100] and dropped == 150
    padded, _ = apply_capacity(load, 300, 2, 1.0, pad_to_capacity=True)
    assert padded.tolist() == [150] * 4
    assert apply_capacity(load, 300, 2, None)[1] == 0


def test_trace_and_bad_specs(tmp_path):
    p = tmp_path / "trace.csv"
    p.write_text("layer,microbatch,expert,tokens\n0,0,0,10\n0,0,1,20\n0,0,2,5\n0,0,3,5\n")
    r = parse_routing({"trace": str(p)})
    assert expert_load(r, 20, 4, 2).tolist() == [10, 20, 5, 5]
    assert expert_load(r, 20, 4, 2, layer=5).tolist() == [10, 10, 10, 10]     # not in the trace: balanced
    for bad in ("skew(0.5)", "uniform", "zipf(-1)", {"file": "x"}):
        with pytest.raises(ConfigError):
            parse_routing(bad)
    with pytest.raises(ConfigError, match="parallel.ep"):
        rank_load(np.ones(6), 4)


@pytest.mark.parametrize("spec, experts, top_k", [("skew(3.0)", 2, 2), ("skew(4.0)", 4, 2), ("skew(8.0)", 8, 8)])
def test_skew_that_leaves_the_other_experts_no_weight_still_spreads_the_tokens(spec, experts, top_k):
    """skew(r) with r >= experts gives every other expert weight 0; when top_k > 1 the hot
    expert is held at one copy of every token and the rest must still land somewhere (it
    used to divide by zero and hand out a negative load; found by experiments/fuzz.py)."""
    tokens = 256
    with np.errstate(all="raise"):
        load = expert_load(parse_routing(spec), tokens, experts, top_k, seed=3)
    assert load.sum() == tokens * top_k and load.min() >= 0 and load.max() <= tokens
