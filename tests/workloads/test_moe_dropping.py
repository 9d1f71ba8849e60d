"""Token dropping as Megatron-Core does it: capacity per router call (per source rank and
expert), not per pooled EP-group load; dropped tokens leave the all-to-all and the GEMMs."""

import numpy as np
import pytest

from topologies import ConfigError, get_gpu_spec
from workloads import ParallelConfig, load_model
from workloads.moe_routing import (apply_rank_budget, apply_source_capacity, parse_routing, source_capacity,
                                   source_dispatch_matrix, source_loads, split_sources)
from workloads.program import build_program

H100 = get_gpu_spec("H100-SXM")

# Two source ranks (EP 2), 4 experts, top-1, 8 local tokens each.  Capacity per router call:
# ceil(8 x 1 / 4 x 1.0) = 2 tokens per expert.
#   source 0 routes [4, 2, 1, 1] -> keeps [2, 2, 1, 1], drops 2
#   source 1 routes [0, 2, 3, 3] -> keeps [0, 2, 2, 2], drops 2
# Pooled over the EP group the load is [4, 4, 4, 4] against a pooled capacity of
# ceil(16 / 4) = 4: nothing would drop.  Megatron-Core drops 4 of 16.
ROUTED = np.array([[4, 2, 1, 1], [0, 2, 3, 3]])
KEPT = np.array([[2, 2, 1, 1], [0, 2, 2, 2]])


def _trace(tmp_path):
    p = tmp_path / "per_source.csv"
    rows = ["layer,microbatch,source,expert,tokens"]
    for layer in range(2):
        for s in range(2):
            for e in range(4):
                rows.append(f"{layer},0,{s},{e},{ROUTED[s, e]}")
    p.write_text("\n".join(rows) + "\n")
    return {"trace": str(p)}


def test_capacity_is_per_source_rank_not_pooled():
    assert source_capacity(8, 4, 1, 1.0) == 2
    kept, dropped = apply_source_capacity(ROUTED, 8, 1, 1.0)
    assert kept.tolist() == KEPT.tolist() and dropped == 4
    # padding: every (source, expert) pair carries exactly the capacity
    padded, dropped_p = apply_source_capacity(ROUTED, 8, 1, 1.0, pad_to_capacity=True)
    assert padded.tolist() == [[2] * 4] * 2 and dropped_p == 4
    # a capacity above the local tokens keeps everything; padding then sends every token
    # to every expert (the reference's capacity mask is all ones)
    assert apply_source_capacity(ROUTED, 8, 1, 5.0)[1] == 0
    assert apply_source_capacity(ROUTED, 8, 1, 5.0, pad_to_capacity=True)[0].tolist() == [[8] * 4] * 2
    assert apply_source_capacity(ROUTED, 8, 1, None)[1] == 0


def test_dispatch_matrix_carries_only_kept_tokens():
    m = source_dispatch_matrix(KEPT, 2, 10.0)
    assert m.tolist() == [[40.0, 20.0], [20.0, 40.0]]


def test_program_drops_per_source_rank(tmp_path):
    model = load_model({"preset": "tiny-moe", "num_layers": 2,
                        "moe": {"num_experts": 4, "top_k": 1, "capacity_factor": 1.0}})
    par = ParallelConfig(tp=1, pp=1, dp=2, ep=2, micro_batch_size=1, global_batch_size=2, seq_len=8)
    p = build_program(model, par, H100, moe_routing=_trace(tmp_path))
    # 2 layers x (16 routed, 4 dropped): a pooled capacity would report 0
    assert p.moe_drops == {"routed": 32, "dropped": 8, "fraction": 0.25}
    bpt = model.hidden_size * 2.0
    assert p.a2a_sizes[(0, 0)].tolist() == (np.array([[4, 2], [2, 4]]) * bpt).tolist()
    # experts compute on the kept tokens: EP rank 0 (experts 0, 1) gets 2 + 4 tokens, rank 1 gets 3 + 3
    tokens = {}
    for c in p.classes:
        for op in c.ops:
            if op.name == "experts" and op.layer == 0:
                tokens[c.members] = op.flops
    f = sorted(tokens.values())
    assert len(f) == 2 and f[0] == pytest.approx(f[1])        # 6 tokens on each rank
    # the dropless run of the same trace computes 16 on EP rank 0 ... (8 + 8)
    free = build_program(load_model({"preset": "tiny-moe", "num_layers": 2, "moe": {"num_experts": 4, "top_k": 1}}),
                         par, H100, moe_routing=_trace(tmp_path))
    assert free.moe_drops is None
    assert free.a2a_sizes[(0, 0)].tolist() == (np.array([[6, 2], [2, 6]]) * bpt).tolist()


def test_even_split_matches_pooled_when_sources_agree():
    """The sampled routings split the group's load evenly over source ranks, so the split
    keeps the pooled per-expert totals."""
    r = parse_routing("skew(2.0)")
    sl = source_loads(r, 1024, 8, 8, 2, layer=1, microbatch=0, seed=0)
    assert sl.shape == (8, 8) and sl.sum() == 8 * 1024 * 2
    assert np.all(sl.max(axis=0) - sl.min(axis=0) <= 1)
    assert split_sources(np.array([5, 3]), 2).tolist() == [[3, 1], [2, 2]]


def test_rank_budget_trims_what_a_rank_receives():
    # budget int(8 x 1 x 1.0) = 8 per EP rank; rank 0 receives 2+2+0+2 = 6, rank 1 receives 1+1+2+2 = 6
    assert apply_rank_budget(KEPT, 2, 8, 1, 1.0)[1] == 0
    out, over = apply_rank_budget(ROUTED, 2, 8, 1, 0.5)       # budget 4; rank 0 gets 8, rank 1 gets 8
    assert over == 8 and out[:, :2].sum() == 4 and out[:, 2:].sum() == 4


def test_bad_moe_keys_are_config_errors():
    for bad, field in (({"token_drop_policy": "random"}, "model.moe.token_drop_policy"),
                       ({"pad_expert_input_to_capacity": True}, "model.moe.pad_expert_input_to_capacity"),
                       ({"token_dispatcher": "deepep"}, "model.moe.token_dispatcher"),
                       ({"expert_rank_capacity_factor": 1.5}, "model.moe.expert_rank_capacity_factor"),
                       ({"token_dispatcher": "flex", "capacity_factor": 1.0, "pad_expert_input_to_capacity": True},
                        "model.moe.pad_expert_input_to_capacity")):
        with pytest.raises(ConfigError) as e:
            load_model({"preset": "mixtral-8x7b", "moe": bad})
        assert e.value.field == field


def test_megatron_flags_set_dropping_and_the_dispatcher():
    from tests.workloads.test_megatron_args import MIXTRAL
    from workloads.megatron_args import from_megatron_args
    model, _ = from_megatron_args(MIXTRAL + " --moe-expert-capacity-factor 1.25 --moe-token-drop-policy position"
                                  " --moe-pad-expert-input-to-capacity --moe-token-dispatcher-type flex"
                                  " --moe-flex-dispatcher-backend hybridep --moe-expert-rank-capacity-factor 1.5",
                                  num_gpus=64)
    moe = model.moe
    assert (moe.capacity_factor, moe.token_drop_policy, moe.pad_expert_input_to_capacity) == (1.25, "position", True)
    assert (moe.token_dispatcher, moe.flex_dispatcher_backend, moe.expert_rank_capacity_factor) == \
        ("flex", "hybridep", 1.5)
    with pytest.raises(ConfigError) as e:
        from_megatron_args(MIXTRAL + " --moe-token-drop-policy random", num_gpus=64)
    assert e.value.field.endswith("token_drop_policy")


def test_megatron_overlap_flag_sets_the_moe_overlap_switch():
    from tests.workloads.test_megatron_args import MIXTRAL
    from workloads.megatron_args import from_megatron_args, overlap_from_megatron_args
    argv = MIXTRAL + " --overlap-moe-expert-parallel-comm --delay-wgrad-compute"
    assert overlap_from_megatron_args(argv) == {"moe_ep_comm": True}
    assert overlap_from_megatron_args(MIXTRAL) == {}
    from_megatron_args(argv, num_gpus=64)         # the model and layout still parse
