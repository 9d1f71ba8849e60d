"""Extract perf-recipe knobs for Bridge >= v0.6.0 (flat src/megatron/bridge/perf_recipes)."""
import glob
import importlib
import json
import os
import re
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stubrec as S  # noqa: E402

ref, out, root, perf = S.release_tree(sys.argv)
REAL = ("megatron.bridge.training.mixed_precision", "megatron.bridge.training.flex_dispatcher_backend",
        "megatron.bridge.training.utils.moe_token_drop", "megatron.bridge.training.comm_overlap",
        "megatron.bridge.utils.cuda_graph")
SECTIONS = ("model", "ddp", "comm_overlap", "mixed_precision", "optimizer", "env_vars", "train", "dist", "rng")
RECS = ["llama3_8b", "llama3_70b", "llama31_405b", "deepseek_v3", "deepseek_v4_flash", "qwen3_30b_a3b",
        "qwen3_235b_a22b", "gpt_oss_120b", "nemotron_3_nano", "nemotron_3_super", "nemotron_3_ultra",
        "nemotron_3_5_lightning"]
PREC_MAP = {"bf16": "bf16", "fp8cs": "fp8_cs", "fp8mx": "fp8_mx", "nvfp4": "nvfp4"}
pat = re.compile(r"^def ((" + "|".join(sorted(RECS, key=len, reverse=True)) +
                 r")_pretrain_(\d+)gpu_(b200|gb200)_(bf16|fp8cs|fp8mx|nvfp4)(?:_([a-z0-9_]+?))?_config)\(", re.M)
records = []


def fresh():
    S.install(f"{root}/src", real_exact=REAL)
    for k in list(sys.modules):
        if k.split(".")[0] in ("configs", "utils", "perf_plugins", "argument_parser"):
            del sys.modules[k]


# default selection (what setup_experiment picks when --num_gpus/--config_variant are not given)
fresh()
U = importlib.import_module("utils.utils")
defaults = {}
for rec in RECS:
    for gpu in ("b200", "gb200"):
        for p in ("bf16", "fp8_cs", "fp8_mx", "nvfp4"):
            try:
                defaults[(rec, gpu, p)] = U._first_matching_perf_recipe_name(
                    model_recipe_name=rec, task="pretrain", gpu=gpu, precision=p, config_variant=None)
            except Exception:  # noqa: BLE001
                defaults[(rec, gpu, p)] = None

for f in sorted(glob.glob(f"{root}/src/megatron/bridge/perf_recipes/*/*/*.py")):
    src = open(f).read()
    modname = os.path.relpath(f, f"{root}/src")[:-3].replace("/", ".")
    for m in pat.finditer(src):
        fn, rec, ngpu, gpu, prec, var = m.groups()
        prec = PREC_MAP[prec]
        fresh()
        S.set_gpu(gpu)
        try:
            mod = importlib.import_module(modname)
            cfg = getattr(mod, fn)()
            flat = {k: v for k, v in S.flatten(S.fmt(cfg)).items() if k.split(".")[0] in SECTIONS}
            env = flat.pop("env_vars", {})
            unknown_reads = sorted({f"{e[0]}:{e[1]}={e[2]!r}"[:200] for e in S.LOG
                                    if e[0] in ("bool-unknown", "cmp-unknown", "num-unknown")})
            helper_calls = sorted({f"{e[1]}({S.fmt(list(e[2][0][1:]))},{S.fmt(e[2][1])})"[:300]
                                   for e in S.LOG if e[0] == "ctor" and e[2][0] and isinstance(e[2][0][0], S.R)})
            records.append(dict(ref=ref, family=modname.split(".")[3], recipe=rec, gpu=gpu, precision=prec,
                                variant=f"{ngpu}gpu" + (f"_{var}" if var else ""), function=fn,
                                is_default=(defaults.get((rec, gpu, prec)) == fn),
                                source=os.path.relpath(f, root), config=flat, env=env,
                                unknown_reads=unknown_reads, helper_calls=helper_calls))
        except Exception:  # noqa: BLE001
            records.append(dict(ref=ref, recipe=rec, gpu=gpu, precision=prec, function=fn,
                                source=os.path.relpath(f, root), error=traceback.format_exc()[-1500:]))
json.dump(records, open(out, "w"), indent=1, default=str)
print(ref, len(records), "records;", sum(1 for r in records if "error" in r), "errors")
print({k: v for k, v in defaults.items() if v})
