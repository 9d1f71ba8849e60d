"""Extract perf-recipe knobs for Bridge releases that use scripts/performance/configs (v0.3.x - v0.5.x).
Usage: python extract_mid.py <ref> <out.json>"""
import dataclasses
import importlib
import inspect
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

MODELS = [  # (family, recipe)
    ("llama", "llama3_8b"), ("llama", "llama3_70b"), ("llama", "llama31_405b"),
    ("deepseek", "deepseek_v3"), ("qwen", "qwen3_30b_a3b"), ("qwen", "qwen3_235b_a22b"),
    ("gpt_oss", "gpt_oss_120b"), ("nemotronh", "nemotron_3_nano"), ("nemotronh", "nemotron_3_super"),
    ("nemotronh", "nemotron_3_ultra"), ("deepseek", "deepseek_v4_flash"), ("nemotronh", "nemotron_3_5_lightning"),
]
GPUS = ["b200", "gb200"]
PRECS = ["bf16", "fp8_cs", "fp8_mx", "nvfp4"]
SECTIONS = ("model", "ddp", "comm_overlap", "mixed_precision", "optimizer", "env_vars", "train", "dist", "rng",
            "__recipe_call__")

records = []


def fresh():
    S.install(f"{root}/src", real_exact=REAL)
    for k in list(sys.modules):
        if k.split(".")[0] in ("configs", "utils", "perf_plugins", "argument_parser", "argument_builder"):
            del sys.modules[k]
    return importlib.import_module("utils.utils")


U = fresh()
for fam, rec in MODELS:
    for gpu in GPUS:
        for prec in PRECS:
            try:
                U = fresh()
                try:
                    variants = U.list_available_config_variants(fam, rec, gpu, prec.upper(), "pretrain")
                except TypeError:
                    variants = U.list_available_config_variants(
                        model_family_name=fam, model_recipe_name=rec, gpu=gpu, compute_dtype=prec.upper(),
                        task="pretrain")
            except Exception:  # noqa: BLE001
                variants = []
            if not variants:
                continue
            for var in variants:
                U = fresh()
                S.set_gpu(gpu)
                try:
                    wbc = U.get_workload_base_config(fam, rec, gpu, prec.upper(), "pretrain", var)
                    wbc_d = {f.name: getattr(wbc, f.name) for f in dataclasses.fields(wbc)}
                    cfg = U.get_perf_optimized_recipe(fam, rec, "pretrain", gpu, prec, mock=True, config_variant=var)
                    # replay post overrides as run_script does
                    O = importlib.import_module("utils.overrides")
                    sig = inspect.signature(O.set_post_overrides)
                    kw = dict(recipe=cfg, model_family_name=fam, model_recipe_name=rec, gpu=gpu,
                              num_gpus=wbc.num_gpus, compute_dtype=prec, task="pretrain", user_gbs=None,
                              config_variant=var)
                    for p in sig.parameters:
                        if p not in kw:
                            kw[p] = None
                    kw = {k: v for k, v in kw.items() if k in sig.parameters}
                    try:
                        cfg = O.set_post_overrides(**kw) or cfg
                    except Exception as e:  # noqa: BLE001
                        S.LOG.append(("post-override-error", repr(e), None))
                    calls = [(e[1], S.fmt(list(e[2][0])), S.fmt(e[2][1])) for e in S.LOG if e[0] == "ctor"
                             and "recipes" in str(e[1]) or (e[0] == "ctor" and "pretrain_config" in str(e[1]))]
                    d = S.fmt(cfg)
                    flat = {k: v for k, v in S.flatten(d).items() if k.split(".")[0] in SECTIONS}
                    # env vars via PerfEnvPlugin
                    env = {}
                    try:
                        PP = importlib.import_module("perf_plugins")
                        EX = importlib.import_module("utils.executors")
                        env = dict(getattr(EX, "PERF_ENV_VARS", {}))
                        fields = {f.name for f in dataclasses.fields(PP.PerfEnvPlugin)}
                        pk = dict(model_family_name=fam, model_recipe_name=rec, gpu=gpu, compute_dtype=prec,
                                  train_task="pretrain", config_variant=var, moe_a2a_overlap=None)
                        plugin = PP.PerfEnvPlugin(**{k: v for k, v in pk.items() if k in fields})
                        ex = types.SimpleNamespace(env_vars=env, get_launcher=lambda: S.R("launcher"),
                                                   nodes=1, tunnel=S.R("tunnel"), setup_lines="")
                        plugin.setup(S.R("task"), ex)
                    except Exception as e:  # noqa: BLE001
                        env["__error__"] = repr(e)
                    unknown_reads = sorted({f"{e[0]}:{e[1]}={e[2]!r}"[:200] for e in S.LOG
                                            if e[0] in ("bool-unknown", "cmp-unknown", "num-unknown")})
                    helper_calls = sorted({f"{e[1]}({S.fmt(list(e[2][0]))!s:.80},{S.fmt(e[2][1])})"[:300]
                                           for e in S.LOG if e[0] == "ctor" and e[2][0] and isinstance(e[2][0][0], S.R)})
                    records.append(dict(ref=ref, family=fam, recipe=rec, gpu=gpu, precision=prec, variant=var,
                                        workload_base_config=S.fmt(wbc_d), config=flat, env=S.fmt(env),
                                        unknown_reads=unknown_reads, helper_calls=helper_calls))
                except Exception:  # noqa: BLE001
                    records.append(dict(ref=ref, family=fam, recipe=rec, gpu=gpu, precision=prec, variant=var,
                                        error=traceback.format_exc()[-1500:]))
json.dump(records, open(out, "w"), indent=1, default=str)
print(ref, len(records), "records;", sum(1 for r in records if "error" in r), "errors")
