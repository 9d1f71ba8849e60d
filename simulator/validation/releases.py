"""Release profiles: which framework release produced a row, and what its recipe turned on.

Benchmark tables give the model, the GPUs, the degrees, the batch and the throughput; the
switches that decide how a step runs -- recompute, CUDA graphs, communication overlaps, FSDP,
activation offload, the MoE dispatcher, the FP8 flavour -- are in the recipe the release
shipped.  This module maps a row to that recipe and returns the scenario settings it implies,
each with the file it came from.  A profile holds only switches present in the source; where
the recipe is silent the framework's runtime default applies and the note says so.  No
profile holds a numeric per-release factor.

Megatron-Bridge
---------------
Rows whose ``framework`` reads ``Megatron-Bridge / NeMo <release>``.  The NeMo container
release maps to a Megatron-Bridge tag (:data:`BRIDGE_TAGS`, from the repository's
``docs/releases/software-versions.md`` and release notes).  The recipes of each tag
(``scripts/performance/configs`` for 25.09-26.06.01, ``src/megatron/bridge/perf_recipes``
for 26.08) were executed offline with the heavy imports stubbed, recording every value they
set (``experiments/reference/megatron_bridge/``); ``data/megatron_bridge_recipes.json`` keeps
the switches read here.  A row finds its recipe by release, model, GPU and precision; among
a recipe's variants the one whose degrees and batch match the row, else the release's
default variant (noted).

What each switch becomes (:func:`bridge_settings`):

=====================================  ==========================================================
recipe                                 scenario
=====================================  ==========================================================
sequence_parallel                      ``parallel.sequence_parallel``
recompute_granularity / _modules /     ``parallel.recompute`` (+ ``recompute_modules``; selective
_method / _num_layers                  with no list: Megatron-Core's default ``core_attn``)
enable_cuda_graph (25.09), cuda graph  ``host: cuda_graphs`` for whole-iteration or per-layer
impl ``local`` / ``full_iteration``    graphs; Transformer Engine graphs of ``attn`` + ``mlp``
/ ``transformer_engine`` + scope       (the whole dense layer) too; other scopes (``attn``,
                                       ``moe_router``, ``moe_preprocess``, ``mamba``) as
                                       ``host: {cuda_graph_scope: [...]}``: those modules
                                       replayed, the experts and dispatch issued eagerly
tp_comm_overlap                        ``overlap.tp_comm`` (Bridge turns it off when tp < 2 or
                                       sequence parallelism is off)
overlap_grad_reduce / _param_gather    ``overlap.grad_reduce`` / ``param_gather`` (dp > 1)
pp > 1 with vpp > 1 / vpp = 1          ``overlap.p2p`` on / off (Bridge's runtime rule:
                                       overlapped p2p when interleaved, batched otherwise)
use_megatron_fsdp                      ``zero_stage: 3``
grad_reduce_in_fp32 false              ``grad_reduce_dtype: bf16``
NCCL_NVLS_ENABLE=0                     ``cluster.nvls: false``
first_last_layers_bf16 / num_layers_   ``precision_options.bf16_first_layers`` / ``_last_layers``
at_start/_end_in_bf16                  (0 + 0 when the recipe keeps none: its FP8-CS and NVFP4)
fp8_param_gather (FP8 recipes)         ``precision_options.fp8_param_gather``
pipeline layout                        ``parallel.pipeline_layout``
moe_expert_capacity_factor (+ pad)     ``moe.capacity_factor`` (+ ``pad_expert_input_to_capacity``)
moe_token_dispatcher_type / flex       ``moe.token_dispatcher`` / ``flex_dispatcher_backend``
backend / rank capacity factor         (HybridEP / DeepEP: wire efficiency and SMs held) /
                                       ``expert_rank_capacity_factor``
overlap_moe_expert_parallel_comm       ``overlap.moe_ep_comm`` (with the interleaved schedule's
                                       overlapped p2p too)
=====================================  ==========================================================

Noted as not modelled: activation offload to the host, FP4 parameter all-gathers, FP8 attention,
paged stashing.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

from .ingest import _key

__all__ = ["BRIDGE_TAGS", "DECLARED_CAP", "DECLARED_NOT_MODELLED", "bridge_layout", "bridge_recipe", "bridge_release", "bridge_settings", "NOT_MODELLED"]

DATA = Path(__file__).parent / "data" / "megatron_bridge_recipes.json"
_REPO = "NVIDIA-NeMo/Megatron-Bridge"

#: NeMo container release -> Megatron-Bridge tag (docs/releases/software-versions.md at v0.6.0;
#: 26.02.01 and 26.04.01 from the known-issues page and the docs' version list; 26.06.01 from
#: the 0.5.1 docs commit; 26.08 from the Nemotron 3 Lightning README).
BRIDGE_TAGS = {"25.09": "v0.1.0rc3", "25.11": "v0.2.0", "26.02": "v0.3.0", "26.02.01": "v0.3.1",
               "26.04": "v0.4.0", "26.04.01": "v0.4.2", "26.06": "v0.5.0", "26.06.01": "v0.5.1",
               "26.08": "v0.6.0"}

#: Prefix of the notes naming a recipe feature clustersim does not model (the report counts them).
NOT_MODELLED = "not modelled: "

#: The recipe features clustersim declares it does not model, each by the words its notes
#: start with.  Capped at :data:`DECLARED_CAP` on purpose: a feature without public cost
#: data goes here rather than into a fitted factor, and the list should shrink, not grow.
DECLARED_NOT_MODELLED: dict[str, str] = {}
DECLARED_CAP = 10


def bridge_release(framework: str) -> str | None:
    """The NeMo release of a ``Megatron-Bridge / NeMo 26.04.01`` framework cell; None when the
    cell names no Megatron-Bridge release.

    >>> bridge_release("Megatron-Bridge / NeMo 26.04.01"), bridge_release("NeMo 24.09")
    ('26.04.01', None)
    """
    if "bridge" not in framework.lower():
        return None
    m = re.search(r"\b(\d\d\.\d\d(?:\.\d\d)?)\b", framework)
    return m.group(1) if m else None


@lru_cache(maxsize=1)
def _records() -> tuple[dict, ...]:
    return tuple(json.loads(DATA.read_text()))


def _recipe_precision(precision: str) -> str:
    """The recipe's precision label of a clustersim precision recipe name."""
    return {"bf16": "BF16", "fp8_tensorwise": "FP8-CS", "fp8_delayed": "FP8-CS", "mxfp8": "FP8-MX",
            "nvfp4": "NVFP4"}.get(precision, precision.upper())


def bridge_recipe(release: str, model: str, gpu: str, precision: str, layout: dict) -> tuple[dict | None, str]:
    """``(record or None, how it was chosen)`` for a row: the recipe of ``release`` for the
    model name (punctuation-blind against the recipe's name, variant tags removed), GPU
    (``B200`` / ``GB200``; others have none), clustersim precision; among variants, the one
    whose tp, pp, cp, ep, vpp, micro and global batch equal ``layout``'s, else the default."""
    key = _key(model)
    cands = [r for r in _records() if r["release"] == release and _key(r["recipe"]) == key and r["gpu"] == gpu
             and r["precision"] == _recipe_precision(precision)]
    if not cands:
        return None, (f"no Megatron-Bridge {release} ({BRIDGE_TAGS.get(release, '?')}) performance recipe for "
                      f"{model} on {gpu} in {_recipe_precision(precision)}")

    def same(r):
        k = r["knobs"]
        return all((k.get(name) or 1) == layout.get(name, 1) for name in ("tp", "pp", "cp", "ep", "vpp", "mbs", "gbs"))
    matching = [r for r in cands if same(r)]
    if matching:
        best = next((r for r in matching if r["default"]), matching[0])
        return best, f"recipe variant '{best['variant']}' (its degrees and batch match the row)"
    default = next((r for r in cands if r["default"]), cands[0])
    k = default["knobs"]
    theirs = " ".join(f"{n}{k.get(n) or 1}" for n in ("tp", "pp", "cp", "ep", "vpp", "mbs", "gbs"))
    return default, f"default variant '{default['variant']}' ({theirs}; no variant matches the row's degrees)"


def bridge_layout(recipe: str, stages: int, release: str) -> tuple[str, dict] | None:
    """``(layout, record)``: a pipeline layout some release's recipe for ``recipe`` gives
    ``stages`` virtual stages (pp x vpp), the release nearest ``release`` first; None when no
    release has one.  Megatron-Bridge's DeepSeek-V3 layouts depend on pp x vpp only (its
    ``_get_deepseek_v3_pipeline_layout`` maps (4, 4), (8, 2) and (16, 1) to one layout)."""
    from workloads.parallel import parse_pipeline_layout
    releases = list(BRIDGE_TAGS)
    here = releases.index(release) if release in releases else 0
    found = []
    for r in _records():
        layout = r["knobs"].get("pipeline_layout")
        if r["recipe"] != recipe or not layout:
            continue
        if len(parse_pipeline_layout(layout)) == stages:
            found.append((abs(releases.index(r["release"]) - here), not r["default"], layout, r))
    if not found:
        return None
    best = min(found, key=lambda f: f[:2])
    return best[2], best[3]


def _link(r: dict) -> str:
    return f"{_REPO} {r['source'].split(' + ')[0].split(' @ ')[0]} @ {r['bridge_ref']}"


def bridge_settings(record: dict, par: dict, model_is_moe: bool) -> tuple[dict, list[str]]:
    """``(settings, notes)``: what ``record``'s switches set in a scenario whose parallel
    section is ``par`` (the row's degrees, which win over the recipe's).  ``settings`` has
    the keys ``parallel``, ``overlap``, ``cluster``, ``model``, ``moe``, ``host`` and
    ``grad_reduce_dtype`` (each only when set)."""
    k = record["knobs"]
    link = _link(record)
    notes: list[str] = []
    out: dict = {"parallel": {}, "overlap": {}, "cluster": {}, "model": {}, "moe": {}}
    p = out["parallel"]
    tp, pp, dp = par["tp"], par["pp"], par["dp"] * (par["ep"] if "etp" not in par else 1)
    vpp = par.get("vpp", 1)
    set_here = []

    if "sequence_parallel" in k:
        p["sequence_parallel"] = bool(k["sequence_parallel"]) and tp > 1
        set_here.append(f"sequence_parallel={str(p['sequence_parallel']).lower()}")
    _recompute_settings(k, p, set_here, notes)

    host, graph_note = _cuda_graphs(k, model_is_moe)
    out["host"] = host
    set_here.append(f"host {host}" if isinstance(host, str) else
                    f"host eager, per-module CUDA graphs of {', '.join(host['cuda_graph_scope'])} (experts and dispatch "
                    "eager)")
    if graph_note:
        notes.append(graph_note)

    tpo = bool(k.get("tp_comm_overlap")) and tp > 1 and p.get("sequence_parallel", tp > 1)
    out["overlap"]["tp_comm"] = tpo
    out["overlap"]["grad_reduce"] = bool(k.get("overlap_grad_reduce", True)) and dp > 1
    out["overlap"]["param_gather"] = bool(k.get("overlap_param_gather", True)) and dp > 1
    out["overlap"]["p2p"] = bool(k.get("overlap_p2p_comm", pp > 1 and vpp > 1)) and pp > 1
    set_here.append("overlap " + ", ".join(f"{n}={str(v).lower()}" for n, v in out["overlap"].items()))

    if k.get("use_megatron_fsdp"):
        p["zero_stage"] = 3
        p["distributed_optimizer"] = True
        set_here.append(f"Megatron-FSDP ({k.get('data_parallel_sharding_strategy', 'optim_grads_params')}) -> "
                        "zero_stage 3")
    elif "use_distributed_optimizer" in k:
        p["distributed_optimizer"] = bool(k["use_distributed_optimizer"])
        p["zero_stage"] = 1 if p["distributed_optimizer"] else 0
        set_here.append(f"distributed_optimizer={str(p['distributed_optimizer']).lower()}")
    if k.get("grad_reduce_in_fp32") is False:
        out["grad_reduce_dtype"] = "bf16"
        set_here.append("grad_reduce_in_fp32 false -> bf16 gradient reduction")
    if str(k.get("NCCL_NVLS_ENABLE", "")) == "0":
        out["cluster"]["nvls"] = False
        set_here.append("NCCL_NVLS_ENABLE=0 -> nvls off")
    if k.get("pipeline_layout") and pp > 1:
        p["pipeline_layout"] = k["pipeline_layout"]
        set_here.append(f"pipeline layout {k['pipeline_layout']}")
    if model_is_moe:
        notes += _moe_settings(k, out, set_here, pp)

    out["precision_options"] = _precision_settings(k, set_here)
    notes += _offload_settings(k, out, set_here, par, model_is_moe)
    notes.insert(0, f"Megatron-Bridge recipe ({link}): " + "; ".join(set_here))
    return out, notes


def _recompute_settings(k: dict, p: dict, set_here: list, notes: list) -> None:
    """The recipe's recomputation into the parallel section ``p`` (a selective module
    Megatron-Core has and clustersim does not is noted as not modelled)."""
    gran = k.get("recompute_granularity")
    if gran == "full":
        p["recompute"] = "full"
        if k.get("recompute_method"):
            p["recompute_method"] = k["recompute_method"]
        if k.get("recompute_num_layers"):
            p["recompute_num_layers"] = int(k["recompute_num_layers"])
        set_here.append(f"recompute full ({k.get('recompute_method')}, {k.get('recompute_num_layers')} layers)")
    elif gran == "selective":
        mods = list(k.get("recompute_modules") or ["core_attn"])
        from workloads.parallel import RECOMPUTE_MODULES
        unknown = [m for m in mods if m not in RECOMPUTE_MODULES]
        mods = [m for m in mods if m in RECOMPUTE_MODULES]
        if unknown:
            notes.append(NOT_MODELLED + f"recompute of {', '.join(unknown)} (Megatron-Bridge recipe)")
        p["recompute"] = "selective" if mods else "none"
        if mods:
            p["recompute_modules"] = mods
        set_here.append(f"recompute selective {mods}")
    else:
        p["recompute"] = "none"
        set_here.append("recompute none")


def _precision_settings(k: dict, set_here: list) -> dict:
    """The recipe's precision options: BF16 layers at the ends of a low-precision run, FP8
    parameter gathers."""
    popts = {}
    if (k.get("fp8") or k.get("fp4")) and "first_last_layers_bf16" in k:
        keep = bool(k["first_last_layers_bf16"])
        popts["bf16_first_layers"] = int(k.get("num_layers_at_start_in_bf16") or 0) if keep else 0
        popts["bf16_last_layers"] = int(k.get("num_layers_at_end_in_bf16") or 0) if keep else 0
        set_here.append(f"BF16 layers at the ends {popts['bf16_first_layers']} + {popts['bf16_last_layers']}")
    if k.get("fp8") and k.get("fp8_param_gather"):
        popts["fp8_param_gather"] = True
        set_here.append("fp8_param_gather (FP8 parameter all-gather)")
    if k.get("fp4") and k.get("fp4_param_gather"):
        popts["fp4_param_gather"] = True
        set_here.append("fp4_param_gather (NVFP4 parameter all-gather)")
    if (k.get("fp8") or k.get("fp4")) and k.get("fp8_dot_product_attention"):
        popts["fp8_attention"] = True
        set_here.append("fp8_dot_product_attention (FP8 core attention)")
    return popts


def _moe_settings(k: dict, out: dict, set_here: list, pp: int) -> list[str]:
    """The recipe's MoE switches: capacity and padding, the token dispatcher (and HybridEP's
    per-rank budget), and Megatron-Core's EP communication overlap; notes for what cannot
    be modelled."""
    moe, notes = out["moe"], []
    disp = k.get("moe_token_dispatcher_type")
    backend = k.get("moe_flex_dispatcher_backend") or "deepep"
    if disp in ("alltoall", "allgather", "flex"):
        moe["token_dispatcher"] = disp
        if disp == "flex":
            moe["flex_dispatcher_backend"] = backend
        set_here.append(f"moe dispatcher {disp}" + (f" ({backend})" if disp == "flex" else ""))
    if k.get("moe_expert_capacity_factor") is not None:
        moe["capacity_factor"] = float(k["moe_expert_capacity_factor"])
        pad = bool(k.get("moe_pad_expert_input_to_capacity")) and not (disp == "flex" and backend == "deepep")
        if pad:
            moe["pad_expert_input_to_capacity"] = True
        set_here.append(f"moe capacity factor {k['moe_expert_capacity_factor']}" + (" padded to capacity" if pad else ""))
    if k.get("moe_expert_rank_capacity_factor") and disp == "flex" and backend == "hybridep":
        moe["expert_rank_capacity_factor"] = float(k["moe_expert_rank_capacity_factor"])
        set_here.append(f"HybridEP rank budget {k['moe_expert_rank_capacity_factor']}")
    if k.get("overlap_moe_expert_parallel_comm"):
        out["overlap"]["moe_ep_comm"] = True
        set_here.append("EP communication overlap (overlap_moe_expert_parallel_comm)")
    return notes


def _scope_names(scope) -> list[str]:
    """A recipe's ``cuda_graph_scope`` / ``cuda_graph_modules`` as scope names: 26.08's
    recipes record enum members (``<megatron.core.transformer.enums.CudaGraphModule.attn>``)."""
    if isinstance(scope, str):
        scope = [scope]
    return [str(x).strip("<>").rsplit(".", 1)[-1] for x in scope or []]


def _cuda_graphs(k: dict, model_is_moe: bool) -> tuple[str | dict, str | None]:
    """``(host, note or None)`` of a recipe's CUDA-graph switches: ``cuda_graphs`` for
    whole-iteration and whole-layer graphs, ``{"cuda_graph_scope": [...]}`` for per-module
    Transformer Engine graphs that leave the rest of the layer eager, else ``eager``."""
    impl = k.get("cuda_graph_impl")
    scope = _scope_names(k.get("cuda_graph_scope") or k.get("cuda_graph_modules"))
    if k.get("enable_cuda_graph"):
        return "cuda_graphs", ("per-layer CUDA graphs (enable_cuda_graph): run as cuda_graphs; the optimizer step, "
                               "embedding and loss stay eager in the run (not modelled)")
    if impl in ("local", "full_iteration") and (impl == "full_iteration" or "full_iteration" in scope):
        return "cuda_graphs", None
    if impl == "transformer_engine" and scope:
        if not model_is_moe and {"attn", "mlp"} <= set(scope):
            return "cuda_graphs", None
        from workloads.costs.compute import CUDA_GRAPH_SCOPES
        known = [s for s in scope if s in CUDA_GRAPH_SCOPES]
        if known:
            return {"cuda_graph_scope": known}, None
    return "eager", None


def _offload_settings(k: dict, out: dict, set_here: list, par: dict, model_is_moe: bool) -> list[str]:
    """The recipe's host offload and paged stash into ``out`` (``offload``, ``moe``); notes
    for a switch the row's layout cannot run (Megatron-Core refuses CPU offloading with
    pipeline parallelism: transformer_config.py @ d98e8a6)."""
    notes = []
    n = k.get("cpu_offloading_num_layers")
    if n and par.get("pp", 1) > 1:
        notes.append(f"the recipe's activation offload ({n} layers) is not applied: the row runs pp {par['pp']} and "
                     "Megatron-Core has no CPU offloading with pipeline parallelism")
    elif n:
        out["offload"] = {"activations": int(n)}
        set_here.append(f"activation offload to the host of {n} layers (cpu_offloading_num_layers)")
    mods = list(k.get("offload_modules") or [])
    if k.get("fine_grained_activation_offloading") and mods:
        out["offload_modules"] = mods
        set_here.append(f"fine-grained activation offload of {', '.join(mods)}")
    if model_is_moe and k.get("moe_paged_stash"):
        out["moe"]["paged_stash"] = True
        set_here.append("MoE paged stash (moe_paged_stash)")
    return notes
