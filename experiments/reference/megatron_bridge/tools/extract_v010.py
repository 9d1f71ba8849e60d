"""Extract perf-recipe knobs for Bridge v0.1.0rc3 (NeMo 25.09): YAML perf_matrix + run_script.py main()."""
import copy
import importlib
import json
import os
import sys
import traceback
import types

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stubrec as S  # noqa: E402

ref, out, root, perf = S.release_tree(sys.argv)
REAL = ("megatron.bridge.training.mixed_precision",
        "megatron.bridge.training.comm_overlap")
SECTIONS = ("model", "ddp", "comm_overlap", "mixed_precision", "optimizer", "train", "dist", "rng")


def deep_merge(a, b):
    a = copy.deepcopy(a or {})
    for k, v in (b or {}).items():
        if isinstance(v, dict) and isinstance(a.get(k), dict):
            a[k] = deep_merge(a[k], v)
        else:
            a[k] = copy.deepcopy(v)
    return a


class OC:
    load = staticmethod(lambda p: yaml.safe_load(open(p)))
    merge = staticmethod(lambda *xs: __import__("functools").reduce(deep_merge, xs, {}))
    create = staticmethod(lambda x: copy.deepcopy(x))
    to_container = staticmethod(lambda x, resolve=True: x)
    is_dict = staticmethod(lambda x: isinstance(x, dict))


def apply_nested(obj, d):
    for k, v in d.items():
        if k in ("profiling", "_target_", "checkpoint", "logger", "dataset"):
            continue
        if isinstance(v, dict):
            apply_nested(getattr(obj, k), v)
        else:
            setattr(obj, k, v)


MODELS = [("llama3", "8b", "llama3_8b"), ("llama3", "70b", "llama3_70b"), ("llama31", "405b", "llama31_405b"),
          ("deepseek", "v3", "deepseek_v3"), ("qwen3", "30b_a3b", "qwen3_30b_a3b"),
          ("qwen3", "235b_a22b", "qwen3_235b_a22b")]
PRECS = [("bf16", "bf16", None), ("fp8_cs", "fp8", "cs"), ("fp8_mx", "fp8", "mx")]
records = []
for name, size, rec in MODELS:
    yfile = f"{perf}/configs/{name}/{name}_{size}_llm_pretrain.yaml"
    ydoc = yaml.safe_load(open(yfile))
    for gpu in ["b200", "gb200"]:
        block = (ydoc.get("perf_matrix") or {}).get(gpu) or {}
        for ngkey in block:
            num_gpus = int(ngkey.split("_")[-1])
            for prec, cdt, fr in PRECS:
                key = prec if prec == "bf16" else f"fp8_{fr}"
                if key not in block[ngkey]:
                    continue
                S.install(f"{root}/src", real_exact=REAL)
                S.set_gpu(gpu)
                for k in list(sys.modules):
                    if k.split(".")[0] in ("utils", "argument_parser", "run_script"):
                        del sys.modules[k]
                om = types.ModuleType("omegaconf")
                om.OmegaConf = OC
                sys.modules["omegaconf"] = om
                captured = []
                try:
                    sys.argv = ["run_script.py", "-a", "x", "-p", "y", "-g", gpu, "-l", "/tmp", "-c", cdt,
                                "-m", name, "-s", size, "-ng", str(num_gpus), "--config_file", yfile]
                    if fr:
                        sys.argv += ["-fr", fr]
                    RS = importlib.import_module("run_script")
                    RS.create_omegaconf_dict_config = lambda recipe: ({}, {})
                    RS.parse_hydra_overrides = lambda m, o: m
                    RS.apply_overrides = lambda recipe, d, ex: apply_nested(recipe, d)
                    def _tokdrop(m, moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True):
                        m.moe_expert_capacity_factor = moe_expert_capacity_factor
                        m.moe_pad_expert_input_to_capacity = moe_pad_expert_input_to_capacity
                        return m
                    RS.apply_moe_token_drop = _tokdrop
                    RS.pretrain = lambda config, forward_step_func=None: captured.append(config)
                    RS.main()
                    cfg = captured[0]
                    flat = {k: v for k, v in S.flatten(S.fmt(cfg)).items() if k.split(".")[0] in SECTIONS}
                    # env: executor PERF_ENV_VARS + PerfEnvPlugin as constructed in setup_experiment (tp/pp/cp left at 1)
                    EX = importlib.import_module("utils.executors")
                    env = dict(EX.PERF_ENV_VARS)
                    env["NVTE_FWD_LAYERNORM_SM_MARGIN"] = "16"
                    env["NVTE_BWD_LAYERNORM_SM_MARGIN"] = "16"
                    if rec == "llama31_405b" and gpu == "gb200" and prec == "fp8_cs":
                        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
                    preset = deep_merge(block[ngkey].get("common") or {}, block[ngkey].get(key) or {})
                    unknown_reads = sorted({f"{e[0]}:{e[1]}={e[2]!r}"[:200] for e in S.LOG
                                            if e[0] in ("bool-unknown", "cmp-unknown", "num-unknown")})
                    records.append(dict(ref=ref, family=name, recipe=rec, gpu=gpu, precision=prec,
                                        variant=f"num_gpus_{num_gpus}", workload_base_config=preset,
                                        config=flat, env=env, unknown_reads=unknown_reads))
                except Exception:  # noqa: BLE001
                    records.append(dict(ref=ref, family=name, recipe=rec, gpu=gpu, precision=prec,
                                        variant=f"num_gpus_{num_gpus}", error=traceback.format_exc()[-1500:]))
json.dump(records, open(out, "w"), indent=1, default=str)
print(ref, len(records), "records;", sum(1 for r in records if "error" in r), "errors")
