"""Compact the extracted Megatron-Bridge performance recipes into the harness's data file.

Input: the JSON the extraction tools (``tools/``) write, one record per release x recipe x
GPU x precision x variant with every value the release's recipe code sets.  Output:
``simulator/validation/data/megatron_bridge_recipes.json``, the same records with only the
switches the validation harness reads (:data:`KEEP`), renamed to short keys.  A switch the
recipe does not set is absent, never filled in.

Run: ``python experiments/reference/megatron_bridge/compact.py EXTRACTED.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
OUT = ROOT / "simulator" / "validation" / "data" / "megatron_bridge_recipes.json"

#: (group, recipe key) -> short key in the data file.
KEEP = {
    ("parallel", "model.tensor_model_parallel_size"): "tp",
    ("parallel", "model.pipeline_model_parallel_size"): "pp",
    ("parallel", "model.context_parallel_size"): "cp",
    ("parallel", "model.expert_model_parallel_size"): "ep",
    ("parallel", "model.expert_tensor_parallel_size"): "etp",
    ("parallel", "model.virtual_pipeline_model_parallel_size"): "vpp",
    ("parallel", "model.sequence_parallel"): "sequence_parallel",
    ("parallel", "train.micro_batch_size"): "mbs",
    ("parallel", "train.global_batch_size"): "gbs",
    ("parallel", "model.pipeline_model_parallel_layout"): "pipeline_layout",
    ("recompute", "model.recompute_granularity"): "recompute_granularity",
    ("recompute", "model.recompute_method"): "recompute_method",
    ("recompute", "model.recompute_num_layers"): "recompute_num_layers",
    ("recompute", "model.recompute_modules"): "recompute_modules",
    ("cuda_graph", "model.enable_cuda_graph"): "enable_cuda_graph",
    ("cuda_graph", "model.cuda_graph_impl"): "cuda_graph_impl",
    ("cuda_graph", "model.cuda_graph_scope"): "cuda_graph_scope",
    ("cuda_graph", "model.cuda_graph_modules"): "cuda_graph_modules",
    ("comm_overlap", "comm_overlap.tp_comm_overlap"): "tp_comm_overlap",
    ("comm_overlap", "ddp.overlap_grad_reduce"): "overlap_grad_reduce",
    ("comm_overlap", "ddp.overlap_param_gather"): "overlap_param_gather",
    ("comm_overlap", "model.overlap_p2p_comm"): "overlap_p2p_comm",
    ("comm_overlap", "comm_overlap.overlap_moe_expert_parallel_comm"): "overlap_moe_expert_parallel_comm",
    ("comm_overlap", "comm_overlap.delay_wgrad_compute"): "delay_wgrad_compute",
    ("fsdp_dp", "ddp.use_megatron_fsdp"): "use_megatron_fsdp",
    ("fsdp_dp", "ddp.data_parallel_sharding_strategy"): "data_parallel_sharding_strategy",
    ("fsdp_dp", "ddp.use_distributed_optimizer"): "use_distributed_optimizer",
    ("offload", "model.cpu_offloading_num_layers"): "cpu_offloading_num_layers",
    ("offload", "model.fine_grained_activation_offloading"): "fine_grained_activation_offloading",
    ("offload", "model.offload_modules"): "offload_modules",
    ("offload", "model.moe_paged_stash"): "moe_paged_stash",
    ("moe", "model.moe_token_dispatcher_type"): "moe_token_dispatcher_type",
    ("moe", "model.moe_flex_dispatcher_backend"): "moe_flex_dispatcher_backend",
    ("moe", "model.moe_expert_capacity_factor"): "moe_expert_capacity_factor",
    ("moe", "model.moe_pad_expert_input_to_capacity"): "moe_pad_expert_input_to_capacity",
    ("moe", "model.moe_router_force_load_balancing"): "moe_router_force_load_balancing",
    ("moe", "model.moe_expert_rank_capacity_factor"): "moe_expert_rank_capacity_factor",
    ("precision", "mixed_precision.fp8_recipe"): "fp8_recipe",
    ("precision", "mixed_precision.fp8"): "fp8",
    ("precision", "mixed_precision.fp4_recipe"): "fp4_recipe",
    ("precision", "mixed_precision.fp4"): "fp4",
    ("precision", "mixed_precision.fp8_param_gather"): "fp8_param_gather",
    ("precision", "mixed_precision.fp4_param_gather"): "fp4_param_gather",
    ("precision", "mixed_precision.num_layers_at_start_in_bf16"): "num_layers_at_start_in_bf16",
    ("precision", "mixed_precision.num_layers_at_end_in_bf16"): "num_layers_at_end_in_bf16",
    ("precision", "mixed_precision.first_last_layers_bf16"): "first_last_layers_bf16",
    ("precision", "ddp.grad_reduce_in_fp32"): "grad_reduce_in_fp32",
    ("precision", "mixed_precision.fp8_dot_product_attention"): "fp8_dot_product_attention",
    ("mtp", "model.mtp_num_layers"): "mtp_num_layers",
    ("env", "NCCL_NVLS_ENABLE"): "NCCL_NVLS_ENABLE",
}

_LAYER_TOKENS = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}


def _layout(value):
    """A pipeline layout as Megatron's string form (``Et|tt|...|mL``) whatever the recipe wrote."""
    if isinstance(value, list):
        return "|".join("".join(_LAYER_TOKENS.get(str(t), "?") for t in stage) for stage in value)
    return value


def compact(records: list[dict]) -> list[dict]:
    out = []
    for r in records:
        knobs = {}
        for (group, key), short in KEEP.items():
            values = r["knobs"].get(group, {})
            if key in values and values[key] is not None:
                v = values[key]
                knobs[short] = _layout(v) if short == "pipeline_layout" else v
        out.append({"release": r["release"], "bridge_ref": r["bridge_ref"], "recipe": r["recipe_name"],
                    "gpu": r["gpu"], "precision": r["precision"], "variant": r["variant"],
                    "default": bool(r["is_default_variant"]), "source": r["source"], "knobs": knobs})
    out.sort(key=lambda r: (r["release"], r["recipe"], r["gpu"], r["precision"], not r["default"], r["variant"]))
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    records = json.loads(Path(argv[0]).read_text())
    OUT.parent.mkdir(parents=True, exist_ok=True)
    data = compact(records)
    OUT.write_text("[\n" + ",\n".join(json.dumps(r, separators=(",", ":")) for r in data) + "\n]\n")
    print(f"{len(data)} records -> {OUT} ({OUT.stat().st_size / 1e3:.0f} kB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
