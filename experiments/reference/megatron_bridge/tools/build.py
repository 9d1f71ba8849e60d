"""Consolidate per-ref extraction outputs into $MB_RECIPES (default ./megatron_bridge_recipes.json)."""
import glob
import json
import os
import re

OUT = os.environ.get("MB_RECIPES", "megatron_bridge_recipes.json")
RELEASES = [("25.09", "v0.1.0rc3"), ("25.11", "v0.2.0"), ("26.02", "v0.3.0"), ("26.02.01", "v0.3.1"),
            ("26.04", "v0.4.0"), ("26.04.01", "v0.4.2"), ("26.06", "v0.5.0"), ("26.06.01", "v0.5.1"),
            ("26.08", "v0.6.0")]
MODEL = {"llama3_8b": "Llama3 8B", "llama3_70b": "Llama3 70B", "llama31_405b": "Llama3.1 405B",
         "deepseek_v3": "DeepSeek-V3", "qwen3_30b_a3b": "Qwen3 30B-A3B", "qwen3_235b_a22b": "Qwen3 235B-A22B",
         "gpt_oss_120b": "gpt-oss-120b", "nemotron_3_nano": "Nemotron 3 Nano", "nemotron_3_super": "Nemotron 3 Super",
         "nemotron_3_ultra": "Nemotron 3 Ultra", "deepseek_v4_flash": "DeepSeek-V4-Flash",
         "nemotron_3_5_lightning": "Nemotron 3.5 Lightning"}
PREC = {"bf16": "BF16", "fp8_cs": "FP8-CS", "fp8_mx": "FP8-MX", "nvfp4": "NVFP4"}
ARCH_SKIP = re.compile(r"^model\.(rotary_|init_method_std|seq_length$|vocab|make_vocab|num_layers$|hidden_size|"
                       r"ffn_hidden|num_attention|kv_channels|num_query_groups|layernorm|normalization|"
                       r"share_embeddings|position_embedding|persist_layer_norm|bias_|masked_softmax|"
                       r"should_pad_vocab|pipeline_dtype|__ctor__|__args__|account_for|num_layers_in_)")


def cat(k):
    if k.startswith("env."):
        return "env"
    if ARCH_SKIP.match(k):
        return None
    kk = k.split(".", 1)[1] if "." in k else k
    if k.startswith("mixed_precision.") or k in ("ddp.grad_reduce_in_fp32", "model.fp8_output_proj") or \
            k.startswith("optimizer.use_precision_aware") or re.match(r"optimizer\.(main_|exp_avg)", k):
        return "precision"
    if re.match(r"model\.(tensor_model|pipeline_model|context_parallel|expert_model|expert_tensor|virtual_pipeline|"
                r"sequence_parallel)", k) or k in ("train.global_batch_size", "train.micro_batch_size") or \
            k == "model.pipeline_model_parallel_layout":
        return "parallel"
    if "recompute" in kk:
        return "recompute"
    if "cuda_graph" in kk or kk in ("use_te_rng_tracker", "te_rng_tracker"):
        return "cuda_graph"
    if "offload" in kk or "paged_stash" in kk:
        return "offload"
    if k.startswith("model.moe_") or kk in ("high_priority_a2a_comm_stream",):
        return "moe"
    if k.startswith("model.mtp_"):
        return "mtp"
    if "fsdp" in kk or kk in ("data_parallel_sharding_strategy", "keep_fp8_transpose_cache",
                              "suggested_communication_unit_size", "init_model_with_meta_device",
                              "use_distributed_optimizer", "nccl_ub", "average_in_collective"):
        return "fsdp_dp"
    if k.startswith("comm_overlap.") or "overlap" in kk or kk in ("bucket_size",):
        return "comm_overlap"
    if k.startswith("train.manual_gc") and "eval" not in k:
        return "other"
    if k.startswith("model."):
        return "model_other"
    if k.startswith("dist."):
        return "other"
    return None


def summarize_ub(cfg):
    out = {}
    for k, v in cfg.items():
        m = re.match(r"comm_overlap\.tp_comm_overlap_cfg\.([a-z0-9_]+)\.method$", k)
        if m:
            layer = m.group(1)
            extra = []
            for f in ("aggregate", "num_sm", "fp8_buf", "atomic_gemm"):
                x = cfg.get(f"comm_overlap.tp_comm_overlap_cfg.{layer}.{f}")
                if x not in (None, False) and not (f == "num_sm" and x == 1):
                    extra.append(f"{f}={x}")
            out[layer] = v + (f"({','.join(extra)})" if extra else "")
    return out


def knobs_from(rec):
    cfg = rec["config"]
    knobs = {}
    ub = summarize_ub(cfg)
    for k, v in cfg.items():
        if k.startswith("comm_overlap.tp_comm_overlap_cfg"):
            continue
        if v is None or v == "<unset>":
            continue
        if k.startswith("optimizer.") and not re.match(
                r"optimizer\.(use_precision_aware|main_|exp_avg|overlap|use_distributed_optimizer)", k):
            continue
        if k.startswith(("rng.seed", "train.train_iters", "train.eval", "train.__", "train.manual_gc_eval")):
            continue
        if k.endswith("__ctor__") or k.startswith("train.manual_gc"):
            continue
        if re.match(r"mixed_precision\.(fp32|fp16|params_dtype|pipeline_dtype|autocast_|fp8_margin|fp8_amax|"
                    r"loss_scale|initial_loss_scale|min_loss_scale|loss_scale_window|hysteresis)", k):
            continue
        if k == "model.pipeline_model_parallel_layout" and isinstance(v, list):
            ab = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}
            v = "|".join("".join(ab.get(t, t) for t in st) if isinstance(st, list) else str(st) for st in v)
        c = cat(k)
        if c is None:
            continue
        knobs.setdefault(c, {})[k] = v
    if ub:
        knobs.setdefault("comm_overlap", {})["comm_overlap.tp_comm_overlap_cfg(summary)"] = ub
    if rec.get("env"):
        knobs["env"] = rec["env"]
    if rec.get("workload_base_config"):
        knobs["workload_base_config"] = {k: v for k, v in rec["workload_base_config"].items() if v is not None}
    if rec.get("helper_calls"):
        knobs["helper_calls_stubbed"] = rec["helper_calls"]
    return knobs


def src_files(ref, rec):
    root = f"/tmp/mb/{ref}"
    if rec.get("source"):
        return [rec["source"]]
    fam = rec["family"]
    files = sorted(glob.glob(f"{root}/scripts/performance/configs/{fam}/*.py") +
                   glob.glob(f"{root}/scripts/performance/configs/{fam}/*.yaml"))
    files = [os.path.relpath(f, root) for f in files if "finetune" not in f and "__init__" not in f]
    key = rec["recipe"].split("_")[0]
    files = [f for f in files if key in os.path.basename(f) or "workload_base_configs.py" == os.path.basename(f)
             or (fam == "nemotronh" and "nemotron_3" in f)]
    extra = ["scripts/performance/utils/overrides.py", "scripts/performance/utils/precision.py",
             "scripts/performance/perf_plugins.py", "scripts/performance/utils/executors.py"]
    if ref == "v0.1.0rc3":
        extra = ["scripts/performance/run_script.py", "scripts/performance/utils/helpers.py",
                 "scripts/performance/setup_experiment.py", "scripts/performance/utils/executors.py"]
    if ref == "v0.2.0":
        extra = ["scripts/performance/utils/helpers.py", "scripts/performance/perf_plugins.py",
                 "scripts/performance/utils/executors.py"]
    return files + [e for e in extra if os.path.exists(f"{root}/{e}")]


def main():
    out = []
    for rel, ref in RELEASES:
        recs = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", f"{ref}.json")))
        # default variant per (recipe,gpu,prec)
        groups = {}
        for r in recs:
            groups.setdefault((r["recipe"], r["gpu"], r["precision"]), []).append(r)
        for (recipe, gpu, prec), rs in groups.items():
            if recipe not in MODEL:
                continue
            variants = [r["variant"] for r in rs]
            if ref == "v0.6.0":
                default = next((r["variant"] for r in rs if r.get("is_default")), None)
            elif ref in ("v0.1.0rc3", "v0.2.0"):
                default = variants[0]
            else:  # argument_parser default --config_variant v2, falls back to v1 (utils/utils.py)
                default = "v2" if "v2" in variants else ("v1" if "v1" in variants else None)
            for r in rs:
                if "error" in r:
                    continue
                k = knobs_from(r)
                out.append({
                    "release": rel, "bridge_ref": ref, "model": MODEL[recipe], "recipe_name": recipe,
                    "gpu": gpu.upper(), "precision": PREC[prec], "variant": r["variant"],
                    "is_default_variant": r["variant"] == default,
                    "function": r.get("function"),
                    "knobs": k,
                    "source": " + ".join(src_files(ref, r)) + f" @ {ref}",
                })
    json.dump(out, open(OUT, "w"), indent=1)
    print(len(out), "records written")


if __name__ == "__main__":
    main()
