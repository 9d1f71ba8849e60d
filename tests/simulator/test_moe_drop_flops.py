"""MFU with token dropping counts only the token-expert assignments the experts compute
(docs/modelling.md, "MFU with token dropping"), so it never exceeds HFU without recompute."""

import pytest

from simulator.engine import run
from workloads import load_model
from workloads.costs import routed_expert_flops_per_step

# Two EP source ranks, 4 experts, top-1, 8 local tokens each; capacity ceil(8 x 1 / 4 x 1.0) = 2
# per (source, expert): source 0 routes [4, 2, 1, 1] and keeps [2, 2, 1, 1], source 1 routes
# [0, 2, 3, 3] and keeps [0, 2, 2, 2]: 4 of 16 assignments dropped in each layer, fraction 1/4.
ROUTED = [[4, 2, 1, 1], [0, 2, 3, 3]]


def _scenario(tmp_path, **moe):
    p = tmp_path / "per_source.csv"
    rows = ["layer,microbatch,source,expert,tokens"]
    rows += [f"{layer},0,{s},{e},{ROUTED[s][e]}" for layer in range(2) for s in range(2) for e in range(4)]
    p.write_text("\n".join(rows) + "\n")
    return {"model": {"preset": "tiny-moe", "num_layers": 2, "moe": {"num_experts": 4, "top_k": 1, **moe}},
            "cluster": {"preset": "dgx-h100", "num_nodes": 1, "gpus_per_host": 2, "nics_per_host": 2},
            "parallel": {"tp": 1, "pp": 1, "dp": 1, "ep": 2, "micro_batch_size": 1, "global_batch_size": 2,
                         "seq_len": 8, "recompute": "none"},
            "moe_routing": {"trace": str(p)}, "num_steps": 1}


# tiny-moe: h 256, 8 heads of 32 (q = 256), 4 KV heads (g = 128), SwiGLU experts of 512,
# vocab 1024; 2 layers, top-1, s = 8, 2 sequences.  megatron_core_2025 per token:
#   attention / layer  6 [h (q + 2g) + q s + q h] = 6 [131072 + 2048 + 65536]  = 1,191,936
#   routed / layer     6 x 3 x h x (1 x 512)                                  = 2,359,296
#   logits             6 h V = 6 x 256 x 1024                                 = 1,572,864
# per step (16 tokens): (2 x (1,191,936 + 2,359,296) + 1,572,864) x 16        = 138,805,248
# routed part: 2 x 2,359,296 x 16 = 75,497,472; a quarter of it dropped: 18,874,368
DROPLESS = 138_805_248
ROUTED_PART = 75_497_472
KEPT = DROPLESS - ROUTED_PART // 4          # 119,930,880


def test_routed_part_of_the_convention():
    model = load_model({"preset": "tiny-moe", "num_layers": 2, "moe": {"num_experts": 4, "top_k": 1}})
    assert routed_expert_flops_per_step(model, 2, 8) == ROUTED_PART
    assert routed_expert_flops_per_step(model, 2, 8, "megatron_2021") == 0.0     # blind to MoE
    assert routed_expert_flops_per_step(load_model("tiny-dense"), 2, 8) == 0.0


def _executed(res):
    tl = res.timeline
    last = tl[tl["step"] == tl["step"].max()]
    sizes = [len(c) for c in res.folding.cells]
    return float(sum(f * sizes[c] for f, c in zip(last["flops"], last["cell"])))


@pytest.mark.parametrize("pad", [False, True])
def test_mfu_counts_only_kept_assignments_and_stays_below_hfu(tmp_path, pad):
    res = run(_scenario(tmp_path, capacity_factor=1.0, pad_expert_input_to_capacity=pad))
    m = res.metrics
    assert m["moe_dropped_fraction"] == 0.25
    assert m["model_flops_per_step_dropless"] == DROPLESS
    assert m["model_flops_per_step"] == KEPT
    # MFU is the kept count over the step's peak FLOPs (same step, same GPUs)
    assert m["mfu"] / m["hfu"] == pytest.approx(KEPT / _executed(res))
    assert m["mfu"] <= m["hfu"]
    # the same trace dropless: nothing taken off, no dropless key
    free = run(_scenario(tmp_path)).metrics
    assert free["model_flops_per_step"] == DROPLESS and "model_flops_per_step_dropless" not in free
    assert free["mfu"] <= free["hfu"]
