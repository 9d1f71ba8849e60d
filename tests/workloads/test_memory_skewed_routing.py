"""Dropless skewed routing: the memory estimate sizes the expert activations (and the
dispatch buffer) by the worst EP rank's token load; balanced routing keeps its estimate."""

import pytest

from topologies import ConfigError
from workloads import ParallelConfig, load_model, memory_estimates
from workloads.moe_routing import parse_routing, worst_rank_load

MODEL = {"preset": "tiny-moe", "num_layers": 2, "moe": {"num_experts": 4}}
# EP 2 (experts 0-1 on rank 0, 2-3 on rank 1), top-2, s = 16: each EP rank routes tn = 16
# tokens, the group 32, so 64 token-expert assignments per layer, 32 per rank balanced.
PAR = ParallelConfig(tp=1, pp=1, dp=2, ep=2, micro_batch_size=1, global_batch_size=2, seq_len=16,
                     recompute="none")


def _trace(tmp_path, loads=(32, 16, 8, 8)):
    """Layer 0 routes ``loads`` (rank 0 gets 48 of 64); layer 1 is not in the trace (balanced)."""
    p = tmp_path / "skewed.csv"
    p.write_text("layer,microbatch,expert,tokens\n" + "".join(f"0,0,{e},{t}\n" for e, t in enumerate(loads)))
    return {"trace": str(p)}


def test_worst_rank_load_sums_the_stage_layers(tmp_path):
    # layer 0: rank 0 gets 48 of 32 balanced (1.5x, the dispatch peak); with layer 1
    # balanced the stage holds (48 + 32) / (32 + 32) = 1.25x on rank 0
    routing = parse_routing(_trace(tmp_path))
    assert worst_rank_load(routing, 16, 2, 4, 2, 2, [0, 1], 1) == (1.25, 1.5)
    assert worst_rank_load(routing, 16, 2, 4, 2, 2, [0], 1) == (1.5, 1.5)
    assert worst_rank_load(routing, 16, 2, 4, 2, 2, [1], 1) == (1.0, 1.0)
    # layer 0 as an MTP layer (at or above routed_layers) counts balanced
    assert worst_rank_load(routing, 16, 2, 4, 2, 2, [0, 1], 1, routed_layers=0) == (1.0, 1.0)
    assert worst_rank_load(parse_routing("balanced"), 16, 2, 4, 2, 2, [0, 1], 3) == (1.0, 1.0)


def test_skewed_peak_exceeds_balanced_by_the_closed_form(tmp_path):
    model = load_model(MODEL)
    routing = _trace(tmp_path)
    bal = memory_estimates(model, PAR)[0]
    skew = memory_estimates(model, PAR, moe_routing=routing)[0]
    # Rows an EP rank's experts hold per layer, balanced: tn x top_k x etp = 16 x 2 = 32; two
    # layers 64.  Skewed, the worst rank holds 48 + 32 = 80: 16 rows more.  A row keeps
    #   expert_input        h e        = 256 x 2        =   512
    #   expert_fc1_output   2 fe e     = 2 x 512 x 2    = 2,048   (SwiGLU gate and up)
    #   expert_fc2_input    fe e       = 512 x 2        = 1,024
    # 3,584 bytes: 16 x 3,584 = 57,344 more activations (1 micro-batch in flight).  The
    # dispatch buffer, 2 x rows x h x e, is sized by the worst single layer: 48 rows instead
    # of 32, 2 x 16 x 256 x 2 = 16,384 more.  Total 73,728 bytes.
    diff = {k: skew.activations.get(k, 0.0) - v for k, v in bal.activations.items()}
    assert diff["expert_input"] == 16 * 512
    assert diff["expert_fc1_output"] == 16 * 2048
    assert diff["expert_fc2_input"] == 16 * 1024
    assert sum(diff.values()) == 57_344
    assert skew.moe_dispatch_bytes - bal.moe_dispatch_bytes == 16_384
    assert skew.total_bytes - bal.total_bytes == 73_728
    assert skew.moe_worst_rank_load == 1.25 and bal.moe_worst_rank_load is None
    assert "1.250x the balanced share" in skew.format_table()


@pytest.mark.parametrize("routing", [None, "balanced", "forced_balanced"])
def test_balanced_routing_keeps_its_estimate(routing):
    model = load_model(MODEL)
    base = memory_estimates(model, PAR)[0]
    got = memory_estimates(model, PAR, moe_routing=routing, seed=5)[0]
    assert got == base


@pytest.mark.parametrize("routing", ["skew(2.0)", "zipf(1.2)"])
def test_sampled_skew_raises_the_peak(routing):
    model = load_model(MODEL)
    base = memory_estimates(model, PAR)[0].total_bytes
    assert memory_estimates(model, PAR, moe_routing=routing)[0].total_bytes > base


def test_capacity_factor_and_explicit_imbalance_win(tmp_path):
    capped = load_model({**MODEL, "moe": {"num_experts": 4, "capacity_factor": 1.25}})
    routing = _trace(tmp_path)
    assert memory_estimates(capped, PAR, moe_routing=routing) == memory_estimates(capped, PAR)
    model = load_model(MODEL)
    assert memory_estimates(model, PAR, moe_routing=routing, moe_token_imbalance=2.0) == \
        memory_estimates(model, PAR, moe_token_imbalance=2.0)


def test_scenario_and_run_memory_use_the_routing(tmp_path):
    from simulator.scenario import load_scenario
    sc = {"model": MODEL, "cluster": {"preset": "dgx-h100", "num_nodes": 1, "gpus_per_host": 2, "nics_per_host": 2},
          "parallel": {"tp": 1, "pp": 1, "dp": 1, "ep": 2, "micro_batch_size": 1, "global_batch_size": 2,
                       "seq_len": 16, "recompute": "none"}}
    bal = load_scenario(sc).memory_estimates()[0].total_bytes
    skew = load_scenario({**sc, "moe_routing": _trace(tmp_path)}).memory_estimates()[0].total_bytes
    assert skew - bal == 73_728


def test_bad_routing_or_seed_is_a_config_error():
    model = load_model(MODEL)
    with pytest.raises(ConfigError, match="moe_routing"):
        memory_estimates(model, PAR, moe_routing="zipf(-1)")
    with pytest.raises(ConfigError, match="seed"):
        memory_estimates(model, PAR, moe_routing="zipf(1.2)", seed=-1)
