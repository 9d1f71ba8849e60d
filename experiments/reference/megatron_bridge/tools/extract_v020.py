"""Extract perf-recipe knobs for Bridge v0.2.x layout (configs/<model>/<model>_llm_pretrain.py)."""
import dataclasses
import importlib
import json
import os
import sys
import traceback
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stubrec as S  # noqa: E402

ref, out, root, perf = S.release_tree(sys.argv)
REAL = ("megatron.bridge.training.mixed_precision", "megatron.bridge.training.flex_dispatcher_backend",
        "megatron.bridge.training.utils.moe_token_drop", "megatron.bridge.training.comm_overlap")
MODELS = [("llama3", "8b", "llama3_8b"), ("llama3", "70b", "llama3_70b"), ("llama31", "405b", "llama31_405b"),
          ("deepseek", "v3", "deepseek_v3"), ("qwen3", "30b_a3b", "qwen3_30b_a3b"),
          ("qwen3", "235b_a22b", "qwen3_235b_a22b"), ("gpt_oss", "120b", "gpt_oss_120b"),
          ("nemotronh", "56b", "nemotronh_56b")]
SECTIONS = ("model", "ddp", "comm_overlap", "mixed_precision", "optimizer", "env_vars", "train", "dist", "rng")
records = []


def fresh():
    S.install(f"{root}/src", real_exact=REAL)
    for k in list(sys.modules):
        if k.split(".")[0] in ("configs", "utils", "perf_plugins", "argument_parser"):
            del sys.modules[k]
    return importlib.import_module("utils.utils")


for name, size, rec in MODELS:
    for gpu in ["b200", "gb200"]:
        for prec in ["bf16", "fp8_cs", "fp8_mx", "nvfp4"]:
            U = fresh()
            S.set_gpu(gpu)
            wmod = importlib.import_module(f"configs.{name}.workload_base_configs")
            wname = f"{name}_{size}_{gpu}_{prec}".upper() + "_BASE_CONFIG"
            if not hasattr(wmod, wname):
                continue
            try:
                wbc = getattr(wmod, wname)
                H = importlib.import_module("utils.helpers")
                kw = dict(model_name=name, model_size=size, gpu=gpu, num_gpus=wbc.num_gpus, compute_dtype=prec,
                          domain="llm", task="pretrain")
                cfg = H.get_model_recipe_with_user_overrides(**kw)
                flat = {k: v for k, v in S.flatten(S.fmt(cfg)).items() if k.split(".")[0] in SECTIONS}
                env = {}
                try:
                    PP = importlib.import_module("perf_plugins")
                    EX = importlib.import_module("utils.executors")
                    env = dict(getattr(EX, "PERF_ENV_VARS", {}))
                    fields = {f.name for f in dataclasses.fields(PP.PerfEnvPlugin)}
                    pk = dict(model_name=name, model_size=size, gpu=gpu, compute_dtype=prec, task="pretrain",
                              domain="llm", use_tokendrop=None, moe_a2a_overlap=None,
                              tp_size=wbc.tensor_model_parallel_size, pp_size=wbc.pipeline_model_parallel_size,
                              cp_size=wbc.context_parallel_size)
                    plugin = PP.PerfEnvPlugin(**{k: v for k, v in pk.items() if k in fields})
                    ex = types.SimpleNamespace(env_vars=env, get_launcher=lambda: S.R("launcher"), nodes=1,
                                               tunnel=S.R("tunnel"), setup_lines="")
                    plugin.setup(S.R("task"), ex)
                except Exception as e:  # noqa: BLE001
                    env["__error__"] = repr(e)
                unknown_reads = sorted({f"{e[0]}:{e[1]}={e[2]!r}"[:200] for e in S.LOG
                                        if e[0] in ("bool-unknown", "cmp-unknown", "num-unknown")})
                records.append(dict(ref=ref, family=name, recipe=rec, gpu=gpu, precision=prec, variant="(only)",
                                    workload_base_config=S.fmt({f.name: getattr(wbc, f.name)
                                                                for f in dataclasses.fields(wbc)}),
                                    config=flat, env=S.fmt(env), unknown_reads=unknown_reads))
            except Exception:  # noqa: BLE001
                records.append(dict(ref=ref, family=name, recipe=rec, gpu=gpu, precision=prec, variant="(only)",
                                    error=traceback.format_exc()[-1500:]))
json.dump(records, open(out, "w"), indent=1, default=str)
print(ref, len(records), "records;", sum(1 for r in records if "error" in r), "errors")
