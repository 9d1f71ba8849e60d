"""A row of a runs table -> a scenario mapping (the contract's sections) and notes.

:func:`row_to_scenario` maps one row (:mod:`.ingest` reads them); every default that fills
an empty cell is echoed in the notes.  The rules, column by column:

Mapping (published format)
--------------------------
=====================  ==========================================================================
column                 scenario
=====================  ==========================================================================
gpu_type (system if    GPU name and cluster preset, case- and punctuation-blind:
empty)                 ``A100 ... 40GB`` -> dgx-a100 with gpu A100-SXM4-40GB; other A100 SXM
                       (80GB, or size not stated: noted) -> dgx-a100; ``H100`` SXM variants
                       (H100-SXM-80GB, H100 SXM5, H100 80GB HBM3) -> dgx-h100; ``H200`` ->
                       dgx-h200; ``H800`` -> hgx-h800; ``A800`` (SXM4 80GB) -> dgx-a100 with gpu
                       A800-SXM4-80GB (NVLink 400 GB/s both directions, 200 per direction);
                       ``B200`` -> dgx-b200; ``B300`` -> dgx-b200 with gpu B300;
                       ``GB200`` (NVL72) -> gb200-nvl72; ``GB300`` (NVL72) -> gb200-nvl72 with gpu
                       GB300.  PCIe / NVL cards (the 40GB A800 is one), H20, GH200 and other
                       GPUs: unsupported, naming the cell.
num_gpus,              ``num_nodes = num_gpus / gpus per host`` of the preset; fewer GPUs than
gpus_per_node          one host -> one host of that many GPUs (NVLink only, noted); a count
                       that is not whole hosts, or a stated gpus_per_node that matches neither
                       the preset's host nor its NVLink domain, is unsupported.  When the
                       preset's leaf size (scalable unit, 32 DGX H100 hosts) does not divide
                       the hosts, ``hosts_per_leaf`` is the largest divisor below it (72 hosts
                       -> 24; the fabric stays full-bisection; noted).  NVL72 racks: a job on
                       fewer than 72 GPUs is one NVLink domain of its size; one that is not a
                       whole number of racks runs equal domains, the largest of whole hosts
                       that divides it (128 GPUs -> 2 x 64, 16 trays a rack; noted).
inter_node_network     per host, per GPU or per NIC (:func:`_network`): ``8x400Gb/s IB``,
                       ``RoCE 4x200Gbps`` (NICs x rate); ``3.2 Tbps per node``, ``1600 Gbps
                       node-node`` (the host's total over the preset's NICs); ``400G per GPU``
                       (a NIC per GPU); ``ConnectX-7 NDR 400``, ``8x NDR`` (a NIC's rate; bytes
                       ``GB/s`` converted).  Overrides the preset's NICs per host and NIC rate
                       when they differ (noted); a rate that says none of these, or no rate,
                       keeps the preset (the former noted).
model                  a model preset by name, punctuation-blind (``GPT3-175B`` -> gpt3-175b,
                       ``Llama 3.1 70B`` -> llama3.1-70b, ``Mixtral 8x7B`` -> mixtral-8x7b);
                       ``... PROXY (<n> layers)`` -> the preset with ``num_layers = n`` (must
                       agree with the num_layers cell).  Variant tags (:func:`model_variants`):
                       ``(tokendrop)`` -> capacity factor 1.0; ``(w/o MTP)`` -> no MTP module;
                       ``(w/ MTP)`` -> the preset's (unsupported if it has none).  Unknown model: built from the row's
                       dimensions when it gives them (:func:`model_from_dimensions`: what the
                       model and notes cells state -- ALiBi, biases, tied embeddings, MLP, norm
                       -- as given, the rest from params_b), else unsupported.  The
                       NeMo 405B proxies split evenly (7 layers at pp 1; 21 = pp 3 x vpp 7 x 1;
                       42 = 3 x 7 x 2), so no ``num_layers_in_first/last_pipeline_stage``
                       knob is needed.  A layer count that does not divide over pp x vpp:
                       if it does with the embedding and the loss counted as layers (126 + 2
                       on pp 8 x vpp 4), Megatron's ``account_for_embedding/loss_in_pipeline_
                       split`` as NeMo's 405B recipe sets them; else (DeepSeek-V3's 61 on
                       pp 8) :func:`edge_stage_split`: the middle
                       stages the fewest layers that fit, the first and last stage the rest
                       (7, 8 x 6, 6; noted); where no split of whole chunks fits and no
                       recipe gives a layout: unsupported, naming num_layers, pp and vpp.
num_layers, hidden_    override the preset where they differ (noted; a stated layer count is
size, ffn_hidden_size, the one simulated: a recipe's pipeline layout for the preset's count is
num_heads, num_kv_     dropped, and a hybrid preset's layer pattern, which cannot be resized,
heads, vocab_size,     makes it unsupported).  ``vocab_size`` is the vocabulary of the source's
num_experts, moe_top_k FLOP formula; the *executed* vocabulary is the row's, except rows whose
(cells like ``2048 per notes name the GPT2BPETokenizer proxy (the NeMo 24.09 Llama 3.1 405B
expert``, ``256 routed recipe): GPT-2's 50,257 padded to Megatron's multiple of 128 x tp (51,200
+ 1 shared``)          at tp 8).  ``ffn_hidden_size`` ``<n> per expert`` is the expert width;
                       ``num_experts`` ``<r> routed + <s> shared`` the routed and shared expert
                       counts.
seq_len                ``parallel.seq_len`` (and the model's when it differs).
tp, pp, cp, ep, vpp    the degrees; empty -> 1; a tp or pp cell that gives a model-parallel
                       size without its split (``8 (TP*PP)``) is unsupported.  An ep that does
                       not fit in dp but in tp*cp*dp: MoE parallel folding with etp 1.  ``dp`` is Megatron's dense DP, which
                       *includes* EP: the five-degree scenario gets ``dp = dp / ep``.  A dp
                       with ``tp*pp*cp*dp*ep = num_gpus`` is read as excluding EP (noted).
                       Empty dp -> ``num_gpus / (tp*pp*cp)``.  Degrees that do not multiply to
                       num_gpus: invalid.
micro_batch_size,      as given (empty micro-batch: 1, noted; empty global batch: invalid);
global_batch_size      ``grad_accum`` is checked against ``gbs / (mbs * dense dp)`` (noted).
sp, zero_fsdp,         as given.  Booleans: yes / no, true / false, on / off, Y / N, enabled,
activation_recompute   check marks, optionally annotated (``yes (TP/SP)``, ``sp=true``); ``-`` /
                       ``n/a`` = empty.  zero_fsdp (:func:`_zero`): FSDP ``SHARD_GRAD_OP`` = 2,
                       ``FULL_SHARD`` = 3, ``NO_SHARD`` / ``DDP ...`` = 0; a stated stage
                       (``ZeRO-1``, ``ZeRO stage 2``, ``zero_stage=3``); other FSDP (FSDP2,
                       ``fully_shard``, Megatron-FSDP) = 3; the distributed optimizer
                       (``dist-opt``, ``--use-distributed-optimizer``) = 1; ZeRO-Offload = 2 and
                       ZeRO-Infinity = 3 with ``offload.optimizer`` 1; HSDP / HYBRID_SHARD:
                       unsupported.  Recompute (:func:`_recompute`): ``full``,
                       ``activation checkpointing``, ``AC=full``, ``full (uniform, 1 layer)``,
                       ``block 4`` (method and layers kept); ``selective``, ``SAC``; ``none``,
                       ``no AC``; CPU / activation offload of N layers -> ``offload.activations``
                       N (no count: all but the last); partial, N layers -> full, block, N.
                       Empty -> the framework's default below.
precision              ``BF16`` -> bf16; ``FP16`` -> bf16 (same tensor-core peak; noted);
                       ``FP8`` -> fp8_delayed: NeMo's and Transformer Engine's default FP8
                       recipe (``DelayedScaling``, HYBRID E4M3 forward / E5M2 backward,
                       amax history 1024 in the NeMo 24.09 recipes); ``FP8 current /
                       tensorwise`` -> fp8_tensorwise; ``FP8 block(wise)`` -> fp8_blockwise;
                       ``MXFP8`` / ``FP8-MX`` -> mxfp8; ``NVFP4`` / ``FP4`` -> nvfp4;
                       ``FP8-CS`` -> fp8_tensorwise, and a bare ``FP8`` too in Megatron-Bridge
                       tables; torchao ``float8 rowwise`` / ``Float8 linears`` ->
                       fp8_tensorwise (noted); ``fp8 delayed`` -> fp8_delayed in any framework;
                       ``bf16-mixed``, ``amp_bf16`` -> bf16; a recipe the row's GPU cannot run
                       (MXFP8 on Hopper), FP32 / TF32 and others unsupported, naming the cell.
schedule               interleaved_1f1b when vpp > 1, else 1f1b.
=====================  ==========================================================================

Framework defaults for empty cells (echoed per row in ``notes``), :data:`FRAMEWORKS`:

* **NeMo** (``framework`` contains "nemo"): sequence_parallel = (tp > 1); distributed
  optimizer (ZeRO-1); recompute **none**; overlap grad_reduce, param_gather and p2p on.
  Source: NVIDIA/dgxc-benchmarking 24.11, ``nemo_megatron/gpt3_175b_hydra.yaml`` and
  ``llama3.1/llama3.1_{70b,405b}.yaml`` (``sequence_parallel: true``,
  ``distributed_fused_adam`` with ``overlap_grad_sync`` / ``overlap_param_sync``,
  ``activations_checkpoint_granularity: null``, ``overlap_p2p_comm: true``).  Not modelled
  (noted per row): per recipe ``fp8_params: true`` (GPT-3 FP8: FP8 parameter all-gather).  Modelled:
  ``NCCL_NVLS_ENABLE=0`` (Llama 3.1 runs) -> ``cluster.nvls: false``,
  ``ub_tp_comm_overlap: true`` -> ``overlap.tp_comm: true`` and ``grad_sync_dtype: bf16``
  -> ``grad_reduce_dtype: bf16``.
* **Megatron-Bridge** (contains "bridge"): the release's performance recipe
  (:mod:`.releases`), and where it is silent Bridge's runtime defaults (distributed
  optimizer; grad-reduce and param-gather overlap when dp > 1; overlapped p2p when
  interleaved).
* **Megatron-LM / Megatron-Core / Megatron-DeepSpeed** (contains "megatron"): the
  argument defaults of Megatron-LM: no sequence parallelism, no distributed optimizer
  (ZeRO-0, gradients all-reduced), recompute none, no grad-reduce or param-gather overlap,
  p2p overlap on (``--no-overlap-p2p-communication`` is the opt-out).
* **DeepSpeed** (contains "deepspeed" but not "megatron"): ZeRO off unless the row says;
  ``overlap_comm`` (gradient reduce and parameter gather overlap) only at stage 3, its
  default there; no sequence parallelism, no recompute, no p2p overlap.  A data-parallel
  row runs on the ``deepspeed`` kernel stack (DeepSpeed v0.16.4's buckets, reductions and
  ZeRO-3 gathers, the model's eager modules with SDPA); a row with tp, pp, cp or ep > 1
  stays on the default stack (noted).  Megatron-DeepSpeed rows are Megatron-LM's.
* **torchtitan**: FSDP2 (ZeRO-3), sequence parallelism with TP (its TP plan shards norms
  along the sequence), and its default activation checkpointing (v0.2.2: mode ``selective``
  with ``selective_ac_option: "2"``, every second transformer block fully checkpointed) as
  full recompute of half of each stage's layers (``recompute_method: block``,
  ``recompute_num_layers`` = ceil(layers per stage / 2): the same recomputed work and held
  activations, the checkpointed layers placed first).
* **llm-foundry** (contains "llm-foundry" or "composer"): the ``llm_foundry`` kernel stack
  (its Triton FlashAttention kernel); where the row is silent FSDP FULL_SHARD (ZeRO-3), no
  sequence parallelism, no recompute, gradient-reduce and parameter-gather overlap on
  (``scripts/train/benchmarking/submit_benchmarks.py``).  Per row (:func:`_llm_foundry_run`):
  Composer's ``MP mode`` in the precision cell sets the gradient reduction's dtype (DEFAULT
  FP32, PURE BF16; FULL, all FP32, is unsupported), and the runs of the "Large Scale" H100
  table that ``sweep.py`` gave ``--attn_impl flash`` (MPT 1b, 3b, 7b, 70b) run on the
  ``llm_foundry_flash`` stack (FlashAttention-2).
* anything else: clustersim's own defaults (Megatron-Core as in NVIDIA's recipes:
  sequence_parallel with TP, distributed optimizer, selective recompute, overlap on), noted.

Mapping (vTrain format)
-----------------------
As ``reference/vtrain/README.md`` states the runs (collected with Megatron-DeepSpeed, says
vTrain's ``data/README.md``): a GPT model (vocabulary 50,257,
learned positions, GELU, LayerNorm, biases, tied embeddings, FFN 4h, dropout 0.1 --
Megatron-LM's default) with the row's layers, hidden size, heads and sequence length;
cluster preset ``a100-4nic`` (8 GPUs per node, 4 x 200 Gb/s NICs = 800 Gb/s per host; the
single-node file's 2- and 4-GPU runs are one host of that many GPUs);
1F1B; full recompute of every layer; no sequence parallelism; no distributed optimizer
(ZeRO-0: gradients all-reduced); no gradient bucketing -> ``overlap.grad_reduce: false``
(the reduction no longer overlaps the backward; clustersim still issues it in buckets of
``max(40M, 1M x dp)`` parameters, each blocking); precision bf16 for "mixed precision"
(fp16 on A100 has the same tensor-core peak; loss scaling is not modelled) with
``grad_reduce_dtype: bf16``: Megatron-LM reduces FP16 gradients in FP16, 2 bytes per
parameter (``accumulate_allreduce_grads_in_fp32`` is forced on only for ``--bf16``,
``megatron/arguments.py``), and vTrain's own predictor sizes the all-reduce as
``numel x element_size`` of FP16 parameters (``src/predictor.py``).  Core attention is
Megatron-LM's unfused ``CoreAttention`` (``flash_attention: false``): the kernels vTrain
profiles (``baddbmm``, fused scale-mask-softmax, dropout, ``bmm``; vTrain
``src/model/gpt_modeling.py``), the Megatron-LM of that era having no FlashAttention path.
**A100 80GB** (``A100-SXM4-80GB``, the preset's GPU): vTrain's configurations say only
"A100"; the 80GB part is the one with a measured matmul peak in ``hardware.csv`` (the GEMM
efficiency model's anchor) and both parts have the same FLOP/s;
the 40GB part differs in HBM capacity and bandwidth (1.555 vs 2.039 TB/s), which affect the
memory-bound ops and the OOM verdict only.  vTrain's simulated "intra-node bandwidth 150
GB/s" is an effective rate of its own model; clustersim keeps the A100 NVLink spec.
"""

from __future__ import annotations

import re

from topologies import ConfigError

from .ingest import _UNSTATED, FORMATS, InvalidRow, Unsupported, _bool, _cell, _int, _key, _num

__all__ = ["FRAMEWORKS", "edge_stage_split", "map_gpu", "map_model", "map_precision", "model_from_dimensions",
           "row_to_scenario", "stated_architecture"]

#: Prefix of a note naming a source feature clustersim does not model (counted by :func:`.report.summary`).
_NOT_MODELLED = "not modelled: "

# -- framework profiles ----------------------------------------------------------------------------
_DGXC = "NVIDIA/dgxc-benchmarking 24.11"
FRAMEWORKS: dict[str, dict] = {
    "nemo": {
        "label": "NeMo 24.x recipe",
        "sequence_parallel": "tp>1", "zero_stage": 1, "distributed_optimizer": True, "recompute": "none",
        "overlap": {"grad_reduce": True, "param_gather": True, "p2p": True, "tp_comm": True},
        "grad_reduce_dtype": "bf16",
        "convention": "nemo_24",
        "source": f"{_DGXC} nemo_megatron/gpt3_175b_hydra.yaml, llama3.1/llama3.1_{{70b,405b}}.yaml",
    },
    "megatron": {
        "label": "Megatron-LM argument defaults",
        "sequence_parallel": False, "zero_stage": 0, "distributed_optimizer": False, "recompute": "none",
        "overlap": {"grad_reduce": False, "param_gather": False, "p2p": True},
        "convention": "megatron_core_2025",
        "source": "NVIDIA/Megatron-LM megatron/training/arguments.py (store_true flags default off; "
                  "--no-overlap-p2p-communication)",
    },
    "torchtitan": {
        "label": "torchtitan defaults",
        "sequence_parallel": "tp>1", "zero_stage": 3, "distributed_optimizer": True, "recompute": "every_2nd_layer",
        "overlap": {"grad_reduce": True, "param_gather": True, "p2p": False},
        "convention": "megatron_core_2025",
        "stack": "torchtitan",
        "source": "pytorch/torchtitan (FSDP2, TP plan with sequence-sharded norms; compile off: the torchtitan kernel "
                  "stack, SDPA's cuDNN attention and eager element-wise kernels); torchtitan/config/job_config.py"
                  "@v0.2.2 activation_checkpoint mode 'selective' with selective_ac_option '2': "
                  "torchtitan/distributed/activation_checkpoint.py@v0.2.2 _apply_layer_sac wraps every 2nd "
                  "transformer block in a full checkpoint",
    },
    "megatron_bridge": {
        "label": "Megatron-Bridge runtime defaults",
        "sequence_parallel": "tp>1", "zero_stage": 1, "distributed_optimizer": True, "recompute": "none",
        "overlap": {"grad_reduce": True, "param_gather": True, "p2p": True, "tp_comm": False},
        "convention": "megatron_core_2025",
        "source": "NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/training/comm_overlap.py (dp > 1: grad-reduce and "
                  "param-gather overlap; interleaved pp: overlapped p2p) and the performance recipes "
                  "(distributed optimizer); the release's recipe overrides these (releases.py)",
    },
    "deepspeed": {
        "label": "DeepSpeed config defaults",
        "sequence_parallel": False, "zero_stage": 0, "distributed_optimizer": False, "recompute": "none",
        "overlap": {"grad_reduce": "zero3", "param_gather": "zero3", "p2p": False, "tp_comm": False},
        "convention": "megatron_core_2025",
        "stack": "deepspeed",
        "source": "microsoft/DeepSpeed deepspeed/runtime/zero/config.py@v0.16.4 (ZeRO off unless configured; "
                  "overlap_comm defaults to True only at stage 3); its pipeline engine does not overlap p2p; the "
                  "deepspeed kernel stack (DeepSpeed's buckets and ZeRO-3 gathers, eager modules, SDPA) when the row "
                  "is data parallel only",
    },
    "llm_foundry": {
        "label": "llm-foundry benchmark runs (Composer, PyTorch FSDP1)",
        "sequence_parallel": False, "zero_stage": 3, "distributed_optimizer": True, "recompute": "none",
        "overlap": {"grad_reduce": True, "param_gather": True, "p2p": False, "tp_comm": False},
        "convention": "megatron_core_2025",
        "stack": "llm_foundry",
        "source": "mosaicml/llm-foundry scripts/train/benchmarking/submit_benchmarks.py (FSDP FULL_SHARD, no "
                  "activation checkpointing unless the run sets it; attn_impl triton): the llm_foundry kernel stack",
    },
    "pytorch_fsdp": {
        "label": "PyTorch FSDP / FSDP2 training loop",
        "sequence_parallel": False, "zero_stage": 3, "distributed_optimizer": True, "recompute": "none",
        "overlap": {"grad_reduce": True, "param_gather": True, "p2p": False, "tp_comm": False},
        "convention": "megatron_core_2025",
        "stack": "pytorch_fsdp",
        "source": "pytorch/pytorch torch/distributed/fsdp (FULL_SHARD / fully_shard: parameters gathered per layer, "
                  "gradients reduce-scattered, the next layer's gather prefetched); eager modules and SDPA's default "
                  "kernel (FlashAttention-2, torch 2.4-2.8): the pytorch_fsdp kernel stack",
    },
    "default": {
        "label": "clustersim defaults (Megatron-Core as in NVIDIA recipes)",
        "sequence_parallel": "tp>1", "zero_stage": 1, "distributed_optimizer": True, "recompute": "selective",
        "overlap": {"grad_reduce": True, "param_gather": True, "p2p": False},
        "convention": "megatron_core_2025",
        "source": "clustersim's scenario defaults (docs/scenarios.md)",
    },
}
"""Defaults per framework for the cells a published-format row leaves empty."""

# Recipe-specific settings of the NeMo 24.09 runs (model preset -> list of (precision prefix
# or '' for any, cluster overrides (a "precision_options" key: the scenario's) or None when
# clustersim cannot express it, note)).
_NVLS_OFF = ({"nvls": False}, "NCCL_NVLS_ENABLE=0 in the recipe -> cluster.nvls: false (ring/tree on NVLink)")
_NEMO_RECIPES = {
    "gpt3-175b": [("fp8", {"precision_options": {"fp8_param_gather": True}},
                   "NeMo fp8_params: true -> precision_options.fp8_param_gather (the distributed optimizer "
                   "gathers FP8 parameters)")],
    "llama3.1-70b": [("", *_NVLS_OFF)],
    "llama3.1-405b": [("", *_NVLS_OFF)],
}

_GPT2_VOCAB = 50257


def _fmt(v, digits=4) -> str:
    """A number for a note: a float to ``digits`` significant digits."""
    return f"{v:.{digits}g}" if isinstance(v, float) else str(v)


# -- GPUs, models, precisions ----------------------------------------------------------------------
def map_gpu(text: str) -> tuple[str, str, list[str]]:
    """``(cluster preset, GPU name, notes)`` for a GPU description; :class:`Unsupported` otherwise.

    >>> map_gpu("H100-SXM-80GB")[:2]
    ('dgx-h100', 'H100-SXM')
    >>> map_gpu("GB300 NVL72")[:2]
    ('gb200-nvl72', 'GB300')
    """
    s = text.lower()
    k = _key(text)
    pcie = "pcie" in k or re.search(r"nvl(?!ink|\d)", s) is not None
    if not k:
        raise Unsupported("gpu_type (and system) not stated")
    if "gb300" in k:
        return "gb200-nvl72", "GB300", ["GB300 on the GB200 NVL72 rack layout (72-GPU NVLink domain)"]
    if "gb200" in k:
        return "gb200-nvl72", "GB200", []
    if "gh200" in k:
        raise Unsupported(f"gpu_type {text!r} (GH200) has no clustersim spec")
    if "b300" in k:
        return "dgx-b200", "B300", ["B300 on the DGX B200 host layout"]
    if "b200" in k:
        return "dgx-b200", "B200", []
    if "h800" in k:
        if pcie:
            raise Unsupported(f"gpu_type {text!r}: H800 PCIe cards are not modelled")
        return "hgx-h800", "H800-SXM", []
    if "h200" in k:
        if pcie:
            raise Unsupported(f"gpu_type {text!r}: H200 NVL / PCIe cards are not modelled")
        return "dgx-h200", "H200-SXM", []
    if "h100" in k:
        if pcie:
            raise Unsupported(f"gpu_type {text!r}: H100 PCIe / NVL cards are not modelled")
        return "dgx-h100", "H100-SXM", []
    if re.search(r"\bh20\b", s):
        raise Unsupported(f"gpu_type {text!r}: the H20 (export Hopper, a fraction of the H100's FLOP/s) has no "
                          "clustersim spec")
    if "a800" in k:
        if pcie or re.search(r"40\s*g", s):
            raise Unsupported(f"gpu_type {text!r}: A800 PCIe cards (the 40GB A800 is one) are not modelled")
        return "dgx-a100", "A800-SXM4-80GB", ["A800 on the DGX A100 host layout (NVLink 400 GB/s both directions, "
                                              "200 per direction)"]
    if "a100" in k:
        if pcie:
            raise Unsupported(f"gpu_type {text!r}: A100 PCIe cards are not modelled")
        if re.search(r"40\s*g", s):
            return "dgx-a100", "A100-SXM4-40GB", []
        notes = [] if re.search(r"80\s*g", s) else ["A100 memory size not stated: 80GB assumed"]
        return "dgx-a100", "A100-SXM4-80GB", notes
    raise Unsupported(f"gpu_type {text!r} has no clustersim spec")


def _model_keys() -> dict[str, str]:
    from workloads import MODEL_PRESETS
    keys = {_key(p): p for p in MODEL_PRESETS}
    for alias, preset in (("gpt175b", "gpt3-175b"), ("deepseekv3671b", "deepseek-v3")):
        if preset in MODEL_PRESETS:
            keys[alias] = preset
    return keys


#: Variant tags a model name may carry in parentheses, -> the variant's name (see :func:`model_variants`).
_VARIANT_TAGS = (
    (re.compile(r"\(\s*token\s*-?\s*drop(?:ping)?\s*\)", re.IGNORECASE), "tokendrop"),
    (re.compile(r"\(\s*w/o\s*mtp\s*\)", re.IGNORECASE), "no_mtp"),
    (re.compile(r"\(\s*w/\s*mtp\s*\)", re.IGNORECASE), "mtp"),
)


def model_variants(name: str) -> tuple[str, tuple[str, ...]]:
    """``(name without its variant tags, the variants)``: Megatron-Bridge's tables mark a
    token-dropping run ``(tokendrop)`` and DeepSeek-V3 with or without its multi-token
    prediction module ``(w/ MTP)`` / ``(w/o MTP)``.

    >>> model_variants("DeepSeekV3 (w/o MTP)")
    ('DeepSeekV3', ('no_mtp',))
    """
    found = []
    for pattern, variant in _VARIANT_TAGS:
        if pattern.search(name):
            name = pattern.sub("", name)
            found.append(variant)
    return name.strip(), tuple(found)


def map_model(name: str) -> tuple[str, int | None]:
    """``(model preset, proxy layer count or None)`` for a model name (its variant tags,
    :func:`model_variants`, ignored); :class:`Unsupported` otherwise.

    >>> map_model("Llama 3.1 405B PROXY (7 layers)")
    ('llama3.1-405b', 7)
    >>> map_model("Qwen3_30B_a3B (tokendrop)")
    ('qwen3-30b-a3b', None)
    """
    name, _variants = model_variants(name)
    if not name.strip():
        raise Unsupported("model not stated")
    proxy = None
    m = re.search(r"\(\s*(\d+)\s*layers?\s*\)", name, re.IGNORECASE)
    base = name
    if m:
        proxy = int(m.group(1))
        base = name[:m.start()] + name[m.end():]
    base = re.sub(r"\bproxy\b", "", base, flags=re.IGNORECASE)
    k = _key(base)
    for prefix in ("meta", "nvidia", "mistralai"):
        if k.startswith(prefix) and k[len(prefix):] in _model_keys():
            k = k[len(prefix):]
    preset = _model_keys().get(k)
    if preset is None:
        raise Unsupported(f"unknown model {name!r} (no clustersim preset)")
    return preset, proxy


def map_precision(text: str, framework: str | None = None) -> tuple[str, list[str]]:
    """``(precision recipe, notes)`` for a precision cell; :class:`Unsupported` otherwise.

    ``framework`` (a :data:`FRAMEWORKS` key) decides what a bare "FP8" means: Megatron-Bridge's
    performance tables mean current (tensorwise) scaling, NeMo 1.x and Megatron-LM delayed
    scaling (Transformer Engine's default recipe).

    >>> map_precision("FP8-MX")[0], map_precision("FP8-CS")[0], map_precision("FP8", "megatron_bridge")[0]
    ('mxfp8', 'fp8_tensorwise', 'fp8_tensorwise')
    """
    s = text.strip().lower()
    k = _key(text)
    if not k:
        return "bf16", ["precision not stated: bf16"]
    if "nvfp4" in k or re.search(r"(?<!mx)fp4", k):
        return "nvfp4", [] if "nvfp4" in k else ["FP4 read as NVFP4"]
    if "mxfp8" in k or re.search(r"(fp8|float8)\W*mx\b", s):
        return "mxfp8", []
    if "fp8" in k or "float8" in k:
        if re.search(r"block|blk|deepseek", s):
            return "fp8_blockwise", []
        if re.search(r"current|\bcs\b", s) or "tensorwise" in k:
            return "fp8_tensorwise", []
        if "delayed" in k:
            return "fp8_delayed", []
        if "rowwise" in k:
            return "fp8_tensorwise", [("float8 rowwise (torchao): GEMMs at the FP8 rate with per-row scales applied "
                                       "in the epilogue; its casts costed as tensorwise scaling's (the extra per-row "
                                       "amax is not modelled)")]
        if "float8linear" in k or ("bf16" in k and "float8" in k):
            return "fp8_tensorwise", ["Float8 linears (torchao's default recipe: tensorwise dynamic scaling); "
                                      "attention and the rest in BF16 as in every FP8 recipe"]
        if framework == "megatron_bridge":
            return "fp8_tensorwise", ["FP8 -> fp8_tensorwise (Megatron-Bridge's performance tables: plain 'FP8' "
                                      "is current scaling)"]
        if framework == "torchtitan":
            return "fp8_tensorwise", ["FP8 -> fp8_tensorwise (torchtitan's float8 converter: torchao Float8Linear, "
                                      "tensorwise dynamic scaling unless a recipe name says rowwise)"]
        return "fp8_delayed", [("FP8 -> fp8_delayed (NeMo's default FP8 recipe: Transformer Engine DelayedScaling, "
                                "HYBRID format, amax history 1024)")]
    if "bf16" in k or "bfloat16" in k:
        return "bf16", []
    if "fp16" in k or "float16" in k or "half" in k or k in ("mixed", "mixedprecision", "amp"):
        return "bf16", ["FP16 mixed precision run as bf16 (same tensor-core peak; loss scaling not modelled)"]
    if re.search(r"fp32|tf32|float32|single", k):
        raise Unsupported(f"precision {text!r}: FP32 / TF32 training is not modelled (clustersim's recipes are BF16, "
                          "FP16 as BF16, FP8, MXFP8 and NVFP4)")
    if "fp4" in k:
        raise Unsupported(f"precision {text!r}: only NVFP4 of the 4-bit recipes is modelled")
    raise Unsupported(f"precision {text!r}: not a precision clustersim reads (BF16, FP16, FP8 and its scaling "
                      "recipes, MXFP8, NVFP4)")


def _framework(text: str) -> tuple[str, list[str]]:
    t = text.lower()
    if "bridge" in t:
        return "megatron_bridge", []
    if "nemo" in t:
        return "nemo", []
    if "megatron" in t:
        return "megatron", []
    if "deepspeed" in t:
        return "deepspeed", []
    if "torchtitan" in t:
        return "torchtitan", []
    if "llm-foundry" in t or "llmfoundry" in t or "composer" in t:
        return "llm_foundry", []
    if "fsdp" in t:                     # after llm-foundry, whose cells read "Composer, PyTorch FSDP"
        return "pytorch_fsdp", []
    return "default", [f"framework {text or 'not stated'!r} not recognised: {FRAMEWORKS['default']['label']}"]


#: Cells that say "no recompute" (also as the first word: ``none (default)``, ``no AC``).
_RC_NONE = ("none", "no", "false", "off", "0", "disabled", "n", "\u2717", "\u2718")
#: Words that name full recompute: whole transformer layers checkpointed (Megatron's ``full``,
#: PyTorch / FSDP activation checkpointing of each block, DeepSpeed's checkpoint_activations).
_RC_FULL = re.compile(r"\bfull\b|\ball\b|checkpoint|\bac\b|\brecompute|\bblock\b|\buniform\b|^(?:yes|y|true|on|1|enabled"
                      "|\u2713|\u2714)(?!\\w)")


def _recompute(text: str) -> dict | None:
    """The ``parallel`` recompute settings of an ``activation_recompute`` cell (None when
    empty); :class:`Unsupported` naming the cell for a kind clustersim does not model.

    ``AC=full`` / ``recompute: selective`` read their value; ``selective`` / ``SAC`` ->
    selective; ``none`` / ``no AC`` -> none; ``full``, ``activation checkpointing``, a yes ->
    full, with Megatron's method (``block`` / ``uniform``) and layer count where stated
    (``full (uniform, 1 layer)``, ``block 4``).
    """
    s = text.strip().lower()
    if not s or s in _UNSTATED:
        return None
    m = re.fullmatch(r"[a-z_\s-]*(?:ac|recompute\w*|checkpoint\w*|granularity)\s*[=:]\s*(\S.*)", s)
    if m:
        s = m.group(1).strip()                 # "AC=full", "activation_checkpointing: true"
    first = re.split(r"[\s(;,:]", s, maxsplit=1)[0] or s
    if first in _RC_NONE or re.match(r"no\s", s):
        return {"recompute": "none"}
    if "selective" in s or re.search(r"\bsac\b", s):
        return {"recompute": "selective"}     # "selective AC", "per-op SAC", "selective (attention core only)"
    if re.search(r"offload|partial|cpu", s):
        return _offload_or_partial(text, s)
    if not _RC_FULL.search(s):
        raise Unsupported(f"activation_recompute {text!r}: not none, selective or full recompute")
    out: dict = {"recompute": "full"}
    method = re.search(r"\b(block|uniform)\b", s)
    if method and method.group(1) == "block":
        out["recompute_method"] = "block"
    n = re.search(r"(\d+)\s*layers?\b", s) or re.search(r"\b(?:block|uniform)\D{0,3}(\d+)\b", s)
    if n:
        if int(n.group(1)) < 1:
            raise Unsupported(f"activation_recompute {text!r}: a layer count of 0 recomputes nothing; say none")
        out["recompute_num_layers"] = int(n.group(1))
    return out


def _offload_or_partial(text: str, s: str) -> dict:
    """An ``activation_recompute`` cell naming activation offload or partial checkpointing:
    offload of ``N`` layers -> ``offload_activation_layers`` N with recompute none (Megatron-Core's
    ``cpu_offloading_num_layers``, which refuses recomputation); without a count, every layer
    but the last (``all``); partial checkpointing of ``N`` layers -> full recompute of the first
    N layers of each chunk (Megatron's ``block`` method)."""
    n = re.search(r"(\d+)\s*(?:layers?|blocks?)\b", s)
    if re.search(r"offload|cpu", s):
        return {"recompute": "none", "offload_activation_layers": int(n.group(1)) if n else "all"}
    if not n or int(n.group(1)) < 1:
        raise Unsupported(f"activation_recompute {text!r}: partial checkpointing needs its layer count "
                          "(e.g. 'partial, 4 layers')")
    return {"recompute": "full", "recompute_method": "block", "recompute_num_layers": int(n.group(1))}


#: FSDP sharding strategies (PyTorch ``ShardingStrategy``) -> ZeRO stage: SHARD_GRAD_OP shards
#: gradients and optimizer state and keeps the parameters gathered after the forward (ZeRO-2);
#: NO_SHARD is plain data parallelism.  Source: pytorch/pytorch torch/distributed/fsdp/api.py
#: (``ShardingStrategy`` docstrings).
_FSDP_STRATEGIES = (("shardgradop", 2), ("fullshard", 3), ("noshard", 0))
_ZERO_STAGE = re.compile(r"(?:zero|stage)[\s_:=-]*(?:stage)?[\s_:=-]*([0-3])(?![\d.])")
_NO = ("0", "none", "no", "false", "off", "disabled", "n", "na")
_DIST_OPT = ("distributedoptimizer", "distopt", "usedistributedoptimizer", "true", "yes", "y", "on", "enabled", "1")


def _zero_offload(text: str) -> tuple[float, list[str]]:
    """``(optimizer_offload_fraction, notes)`` of a ``zero_fsdp`` cell: 1 for ZeRO-Offload /
    ZeRO-Infinity / an optimizer offload (DeepSpeed's ``offload_optimizer``, Megatron-Core's
    ``optimizer_cpu_offload``), with a note when parameters are offloaded too (their
    per-layer fetches from the host are not costed: the parameters count on the GPU)."""
    s = _key(text)
    if "offload" not in s and "infinity" not in s:
        return 0.0, []
    notes = [f"zero_fsdp {text!r}: optimizer state and its Adam step on the host (offload.optimizer 1)"]
    if "infinity" in s or "param" in s:
        notes.append("parameter offload to the host: the parameters are counted on the GPU and their fetches "
                     "from the host are not costed")
    return 1.0, notes


def _zero(text: str) -> int | None:
    """The ZeRO stage of a ``zero_fsdp`` cell (None when empty); :class:`Unsupported` naming
    the cell for a sharding clustersim does not model (HSDP, offload) or cannot read.

    FSDP's strategy names first (``FSDP SHARD_GRAD_OP (ZeRO-2-like)`` is stage 2), then DDP,
    a stated stage (``ZeRO-1``, ``ZeRO stage 2``, ``zero_stage=3``), FSDP otherwise (FSDP2,
    ``fully_shard``, Megatron-FSDP: stage 3), the distributed optimizer (stage 1).
    """
    s = _key(text)
    if not s:
        return None
    low = text.lower()
    if "hsdp" in s or "hybrid" in s:
        raise Unsupported(f"zero_fsdp {text!r}: HSDP (hybrid sharding within a replica group, replicated across) "
                          "is not modelled")
    if "offload" in s or "infinity" in s:
        # ZeRO-Offload builds on stage 2, ZeRO-Infinity on stage 3 (Ren et al., arXiv:2101.06840
        # §4; Rajbhandari et al., arXiv:2104.07857 §5), unless the cell states a stage; the
        # optimizer half is read by _zero_offload
        m = _ZERO_STAGE.search(low.replace("offload", "").replace("infinity", ""))
        return int(m.group(1)) if m else (3 if "infinity" in s or "param" in s else 2)
    for name, stage in _FSDP_STRATEGIES:
        if name in s:
            return stage
    if s.startswith("ddp") or s.startswith("fsdp0") or s in _NO:
        return 0                                # "DDP (FSDP=0 per doc)"
    m = _ZERO_STAGE.search(low)
    if m:
        return int(m.group(1))
    if s in ("1", "2", "3"):
        return int(s)
    if "fsdp" in s or "fullyshard" in s:
        return 3                                # FSDP2, fully_shard, Megatron-FSDP (optimizer, gradients, parameters)
    if re.sub(r"^(?:megatron)?", "", s) in _DIST_OPT or "distributedoptimizer" in s:
        return 1                                # "--use-distributed-optimizer", "dist-opt"
    raise Unsupported(f"zero_fsdp {text!r}: not a ZeRO stage (0-3), an FSDP sharding strategy, DDP or the "
                      "distributed optimizer")


#: A rate in a network cell: ``400Gb/s``, ``400 Gbps``, ``400G``, ``100GbE``, ``3.2 Tbps``, ``50 GB/s`` (bytes).
_RATE = re.compile(r"(\d+(?:\.\d+)?)\s*([GgTt])(?:(B)(?:/s|ps)|(?:[Bb]it|b)?(?:/s|ps|E)?(?![A-Za-z]))")
#: NIC generations named without a rate (InfiniBand HDR / NDR / XDR per port).
_NIC_WORDS = {"hdr": 200.0, "ndr": 400.0, "xdr": 800.0}
_PER_GPU = re.compile(r"per[\s-]*gpu|/\s*gpu|each\s*gpu", re.IGNORECASE)
_PER_HOST = re.compile(r"per[\s-]*(?:node|host|server|system)|/\s*(?:node|host)|node[\s-]*(?:to[\s-]*)?node|total|"
                       r"aggregate", re.IGNORECASE)
_PER_NIC = re.compile(r"connectx|\bcx-?\d|\bnic|\bhca|\bport|\b[hnx]dr\b|per[\s-]*(?:nic|link|port|rail)",
                      re.IGNORECASE)


def _rate_gbps(text: str) -> float | None:
    """The first rate of a network cell in Gb/s (bytes converted; a bare NIC generation,
    ``NDR``, at its port rate); None when the cell gives none."""
    m = _RATE.search(text)
    if m:
        return float(m.group(1)) * (1000 if m.group(2) in "Tt" else 1) * (8 if m.group(3) else 1)
    word = re.search(r"\b([hnx]dr)\b", text, re.IGNORECASE)
    return _NIC_WORDS[word.group(1).lower()] if word else None


def _network(text: str, preset: dict) -> tuple[dict, list[str]]:
    """``(cluster overrides, notes)`` of an ``inter_node_network`` cell, per host, per GPU or
    per NIC: ``8x400Gb/s IB`` / ``RoCE 4x200Gbps`` (NICs x rate), ``3.2 Tbps per node`` /
    ``1600 Gbps node-node`` (the host's total over the preset's NIC count), ``400G per GPU``
    (one NIC per GPU), ``ConnectX-7 NDR 400`` (a NIC's rate, the preset's NIC count).  A
    rate that says none of these keeps the preset (noted); so does a cell with no rate."""
    from topologies.specs import NIC_SPECS

    gbps = _rate_gbps(text)
    if gbps is None:
        return {}, []
    if gbps <= 0:
        raise InvalidRow(f"inter_node_network {text!r}: a rate of 0")
    p_nics, gph = preset.get("nics_per_host", 8), preset.get("gpus_per_host", 8)
    p_bw = NIC_SPECS[preset.get("nic", "ndr")].bandwidth_bytes_per_s * 8 / 1e9
    count = re.search(r"(\d+)\s*[x×*]\s*(?!\d+\s*[x×*])\D{0,40}?\d", text) or \
        re.search(r"(\d+)\s*(?:nics?|hcas?|ports?|rails?)\b", text, re.IGNORECASE)
    if _PER_GPU.search(text):
        nics, rate = gph, gbps * (int(count.group(1)) if count else 1)
        how = f"{_fmt(rate)} Gb/s per GPU: {gph} NICs per host"
    elif count:
        nics, rate = int(count.group(1)), gbps
        how = f"{nics} x {_fmt(rate)} Gb/s per host"
    elif _PER_HOST.search(text):
        nics, rate = p_nics, gbps / p_nics
        how = f"{_fmt(gbps)} Gb/s per host over the preset's {p_nics} NICs"
    elif _PER_NIC.search(text):
        nics, rate = p_nics, gbps
        how = f"{_fmt(rate)} Gb/s per NIC, the preset's {p_nics} NICs per host"
    else:
        return {}, [f"inter_node_network {text!r}: a rate without NICs, per GPU or per host; the preset's "
                    f"{p_nics} x {_fmt(p_bw)} Gb/s kept"]
    if nics < 1:
        raise InvalidRow(f"inter_node_network {text!r}: 0 NICs")
    if gph % nics:
        raise Unsupported(f"inter_node_network {text!r}: {nics} NICs per host do not divide the preset's {gph}-GPU "
                          "hosts (clustersim gives each NIC the same number of GPUs)")
    if nics == p_nics and abs(rate - p_bw) < 1e-6:
        return {}, []
    return ({"nics_per_host": nics, "nic_bandwidth": f"{_fmt(rate)} Gb/s"},
            [f"network {nics} x {_fmt(rate)} Gb/s per host ({how}; preset {p_nics} x {_fmt(p_bw)} Gb/s)"])


def _partial_host(preset: dict, n: int) -> tuple[dict, list[str]]:
    """Cluster overrides for a run on ``n`` GPUs of one host (fewer than the preset's host).

    The GPUs keep their NVLink rate; the host's NICs are scaled down in proportion (they
    carry no traffic on one host).
    """
    gph = preset.get("gpus_per_host", 8)
    nics = max(1, preset.get("nics_per_host", gph) * n // gph)
    return ({"num_nodes": 1, "gpus_per_host": n, "nvlink_domain_size": n, "nics_per_host": nics},
            [f"{n} GPUs of one {gph}-GPU host ({preset.get('gpu')}), NVLink only"])


def _leaf_fit(preset: dict, num_nodes: int) -> tuple[dict, list[str]]:
    """A leaf size that divides the host count: the largest divisor <= the preset's.

    The presets' scalable units (32 hosts per leaf for DGX H100) need not divide a run's
    host count (72 hosts = 576 GPUs); the fabric is full-bisection either way, so only the
    number of hops between hosts on different leaves changes.
    """
    hpl = preset.get("hosts_per_leaf", 32)
    if preset.get("hosts_per_rack") or num_nodes <= hpl or num_nodes % hpl == 0:
        return {}, []
    d = max(k for k in range(1, hpl + 1) if num_nodes % k == 0)
    return {"hosts_per_leaf": d}, [f"hosts_per_leaf {d} (largest divisor of {num_nodes} hosts <= the preset's {hpl})"]


# -- row -> scenario -------------------------------------------------------------------------------
def row_to_scenario(row: dict, fmt: str | None = None) -> tuple[dict, list[str]]:
    """A scenario mapping (the contract's sections) and notes for one row.

    ``fmt`` defaults to the row's ``_format`` (set by :func:`load_runs`).  Raises
    :class:`Unsupported` (a feature clustersim lacks) or :class:`InvalidRow`.  The
    mapping rules are the tables of the module docstring; every default that fills an
    empty cell is echoed in the notes.
    """
    fmt = fmt or row.get("_format")
    if fmt == "vtrain":
        return _vtrain_scenario(row)
    if fmt == "published":
        return _published_scenario(row)
    raise ConfigError("format", fmt, f"must be one of {', '.join(FORMATS)}")


def _vtrain_scenario(row: dict) -> tuple[dict, list[str]]:
    def need(col):
        v = _int(row, col)
        if v is None:
            raise InvalidRow(f"{col!r} is empty")
        return v

    n, gbs, mbs = need("# GPUs"), need("global batch"), need("micro batch")
    h, heads, layers, seq = need("hidden size"), need("attention heads"), need("# layers"), need("sequence length")
    tp, dp, pp = need("tensor parallelism"), need("data parallelism"), need("pipeline parallelism")
    if tp * dp * pp != n:
        raise InvalidRow(f"tp*dp*pp = {tp}*{dp}*{pp} = {tp * dp * pp} != # GPUs = {n}")
    from topologies import load_preset
    pdata = load_preset("a100-4nic")
    if n < 8:
        leaf, lnotes = _partial_host(pdata, n)
    elif n % 8:
        raise Unsupported(f"{n} GPUs is not a whole number of 8-GPU nodes")
    else:
        leaf, lnotes = _leaf_fit(pdata, n // 8)
    size = _cell(row, "Parameters (billion)")
    model = {"name": f"vtrain-gpt-{size}b" if size else "vtrain-gpt", "num_layers": layers,
             "hidden_size": h, "num_attention_heads": heads, "vocab_size": _GPT2_VOCAB, "seq_len": seq,
             "mlp": "gelu", "norm": "layernorm", "position_embedding": "learned", "add_bias_linear": True,
             "tied_embeddings": True, "dropout": 0.1, "flash_attention": False}
    scenario = {
        "model": model,
        "cluster": {"preset": "a100-4nic", "num_nodes": n // 8, **leaf},
        "parallel": {"tp": tp, "pp": pp, "dp": dp, "cp": 1, "ep": 1, "micro_batch_size": mbs,
                     "global_batch_size": gbs, "seq_len": seq, "schedule": "1f1b", "vpp": 1,
                     "sequence_parallel": False, "distributed_optimizer": False, "zero_stage": 0,
                     "recompute": "full", "scatter_gather_tensors_in_pipeline": True},
        "precision": "bf16",
        "grad_reduce_dtype": "bf16",
        "overlap": {"grad_reduce": False, "param_gather": False, "tp_comm": False, "p2p": False},
        "num_steps": 2,
    }
    notes = [("vTrain settings: GPT vocab 50257, learned positions, GELU, LayerNorm; a100-4nic (A100-SXM4-80GB, "
              "4 x 200 Gb/s per 8-GPU host); 1F1B; full recompute; no SP; ZeRO-0 all-reduce; no gradient "
              "bucketing (grad_reduce overlap off); FP16 mixed precision as bf16 with a 2-byte gradient "
              "all-reduce; Megatron-LM's unfused core attention (no FlashAttention); pipeline sends "
              "partitioned over the TP ranks, 1/tp of the activation each (Megatron-LM's scatter/gather; "
              "DeepSpeed's pipeline engine, pipe_partitioned, does the same)")] + lnotes
    return scenario, notes


#: Architectures a row's dimensions may describe, in order of preference: ModelSpec's defaults
#: first, then each way a published model differs that changes its parameter count (the MLP's
#: matrices, a learned position table, an output layer tied to the embedding).
_ARCHITECTURES = tuple({"mlp": mlp, "position_embedding": pos, "tied_embeddings": tied}
                       for pos in ("rope", "learned") for tied in (False, True) for mlp in ("swiglu", "gelu"))

#: A variant whose parameter count is this close to the stated one is taken as what the row names.
_PARAMS_MATCH = 0.01


#: What a row's text (its model and notes cells) may state about the architecture, each a
#: ``(field, value, pattern)``, the first match per field winning; ALiBi has no position table.
_ARCH_CLUES = (
    ("position_embedding", "none", r"\balibi\b"),
    ("position_embedding", "rope", r"\brope\b|rotary"),
    ("position_embedding", "learned", r"(?<!no )learned[\s_-]*(?:abs\w*[\s_-]*)?pos|absolute[\s_-]*pos"),
    ("tied_embeddings", False, r"untied|not[\s_-]*tied|no[\s_-]*(?:weight[\s_-]*)?tying|tie_word_embeddings\W*false"),
    ("tied_embeddings", True, r"\btied[\s_-]*(?:input|output|word|embed)|weight[\s_-]*tying|tie_word_embeddings\W*true"),
    ("add_bias_linear", True, r"no_bias\W*false|add_bias_linear\W*true"),
    ("add_bias_linear", False, r"no[\s_-]*bias|bias[\s_-]*free|without[\s_-]*bias|add_bias_linear\W*false"),
    ("add_bias_linear", True, r"\bbias(?:es)?\b"),
    ("mlp", "swiglu", r"swiglu|geglu|gated[\s_-]*(?:mlp|linear|gelu|silu)"),
    ("mlp", "gelu", r"\bgelu\b|\brelu\b"),
    ("norm", "layernorm", r"layer[\s_-]*norm"),
    ("norm", "rmsnorm", r"rms[\s_-]*norm"),
)


def stated_architecture(row: dict) -> dict:
    """The architecture fields a published row's ``model`` and ``notes`` cells state
    (``ALiBi`` -> no position table, ``no biases``, ``tied embeddings``, ``SwiGLU``,
    ``LayerNorm`` ...); fields they do not mention are absent.

    >>> stated_architecture({"notes": "MPT arch: ALiBi, no biases, tie_word_embeddings=True"})
    {'position_embedding': 'none', 'tied_embeddings': True, 'add_bias_linear': False}
    """
    text = f"{_cell(row, 'model')} {_cell(row, 'notes')}".lower()
    found: dict = {}
    for field, value, pattern in _ARCH_CLUES:
        if field not in found and re.search(pattern, text):
            found[field] = value
    return found


def model_from_dimensions(row: dict) -> tuple[dict, str] | None:
    """A dense model built from a published row's dimensions when its name is no preset:
    ``(model mapping, note)``, or None when the row lacks them (num_layers, hidden_size,
    ffn_hidden_size, num_heads, vocab_size, seq_len) or names experts.

    The dimensions leave open what changes the parameter count: the MLP (two matrices,
    GELU-like; three, SwiGLU), a learned position table sized to the sequence (GPT, MPT as
    llm-foundry counts it; none with ALiBi or RoPE), an output layer tied to the embedding
    (MPT), biases and the norm.  What the row's model and notes cells state
    (:func:`stated_architecture`: ``ALiBi``, ``no biases``, ``tied embeddings`` ...) is
    taken as given; the rest is searched: with ``params_b``, the first of
    :data:`_ARCHITECTURES` within 1 % of it, else the closest within 10 % (Unsupported
    beyond, naming the stated architecture); without it, ModelSpec's defaults (noted):
    SwiGLU, RoPE, untied embeddings.  Norms, biases and attention where not stated:
    ModelSpec's defaults (RMSNorm, no biases, FlashAttention).

    >>> row = {"model": "MPT-125m", "num_layers": 12, "hidden_size": 768, "ffn_hidden_size": 3072,
    ...        "num_heads": 12, "vocab_size": 50368, "seq_len": 2048, "params_b": 0.1253}
    >>> m, note = model_from_dimensions(row)
    >>> m["mlp"], m["position_embedding"], m["tied_embeddings"]
    ('gelu', 'learned', True)
    """
    from workloads.model import ModelSpec

    need = {"num_layers": "num_layers", "hidden_size": "hidden_size", "ffn_hidden_size": "ffn_hidden_size",
            "num_attention_heads": "num_heads", "vocab_size": "vocab_size", "seq_len": "seq_len"}
    dims = {f: _int(row, col) for f, col in need.items()}
    if any(v is None for v in dims.values()) or (_int(row, "num_experts") or 1) > 1:
        return None
    kv = _int(row, "num_kv_heads")
    name = _cell(row, "model")
    base = {"name": _key(name) or "custom", **dims, "num_kv_heads": kv or dims["num_attention_heads"]}
    said = stated_architecture(row)
    archs = list(dict.fromkeys(tuple(sorted({**a, **said}.items())) for a in _ARCHITECTURES))
    archs = [dict(a) for a in archs]
    told = f"stated in the row: {_describe(said)}; " if said else ""
    rest = _defaults_left(said)
    stated = _num(row, "params_b")
    if not stated:
        return ({**base, **archs[0]},
                f"unknown model {name!r}: built from the row's dimensions; {told}no params_b to tell the rest of the "
                f"architecture: {_describe(archs[0])}{rest}")
    counts = []
    for arch in archs:
        try:
            counts.append(ModelSpec.from_dict({**base, **arch}).num_params() / 1e9)
        except ConfigError as e:
            raise InvalidRow(f"model dimensions: {e}") from None
    off = [abs(c / stated - 1) for c in counts]
    i = next((j for j, o in enumerate(off) if o <= _PARAMS_MATCH), min(range(len(off)), key=off.__getitem__))
    if off[i] > 0.10:
        raise Unsupported(f"unknown model {name!r}: no architecture its dimensions allow {told}comes within 10 % of "
                          f"the stated {stated:g}B parameters (closest {counts[i]:.3g}B: {_describe(archs[i])})")
    arch = archs[i]
    return ({**base, **arch},
            f"unknown model {name!r}: built from the row's dimensions, {told}{_describe(arch)} ({counts[i]:.4g}B "
            f"parameters against {stated:g}B stated){rest}")


_ARCH_WORDS = {
    "mlp": lambda v: f"mlp {v}",
    "position_embedding": lambda v: {"learned": "learned positions", "rope": "RoPE", "none": "ALiBi / no position "
                                     "table (the attention bias not costed)"}[v],
    "tied_embeddings": lambda v: "tied embeddings" if v else "untied embeddings",
    "add_bias_linear": lambda v: "linear biases" if v else "no biases",
    "norm": lambda v: {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}[v],
}


def _describe(arch: dict) -> str:
    return ", ".join(_ARCH_WORDS[k](arch[k]) for k in _ARCH_WORDS if k in arch)


def _defaults_left(said: dict) -> str:
    """The ModelSpec defaults a built model keeps for what its row does not state."""
    left = [w for k, w in (("norm", "RMSNorm"), ("add_bias_linear", "no biases")) if k not in said]
    return f"; {', '.join(left)} (ModelSpec defaults)" if left else ""


def edge_stage_split(num_layers: int, pp: int, vpp: int = 1) -> tuple[int, int] | None:
    """Layers of the first and last pipeline stage when ``num_layers`` does not divide over
    ``pp x vpp`` virtual stages (None when it does, or when no split fits): the middle
    stages get the fewest layers that fit, a multiple of ``vpp`` each, and the edge stages,
    which also hold the embedding and the loss (and MTP), share the rest, the last no more
    than the first -- 61 layers on pp 8: 7, 8 x 6, 6."""
    if pp < 2 or num_layers <= 0 or num_layers % (pp * vpp) == 0 or num_layers % vpp:
        return None                       # (edge stages of whole chunks need num_layers % vpp == 0)
    per = -(-num_layers // pp)
    for mid in [0] if pp == 2 else range(per + -per % vpp, num_layers + 1, vpp):
        rest = num_layers - mid * (pp - 2)
        if rest < 2 * vpp:
            break
        last = rest // 2 - (rest // 2) % vpp
        if pp == 2 or rest - last <= mid:
            return rest - last, last
    return None



def _published_scenario(row: dict) -> tuple[dict, list[str]]:
    """The published-format mapping: the cluster, model, parallel layout, batch, executed
    vocabulary, framework defaults and precision recipe of one row, decided in that order
    (the first of them to fail names the row's status)."""
    n = _int(row, "num_gpus")
    if n is None:
        raise InvalidRow("num_gpus is empty")
    cluster, notes = _published_cluster(row, n)
    model, base, mpreset, mnotes = _published_model(row)
    notes += mnotes
    par, dense, lnotes = _published_layout(row, n, model, base)
    notes += lnotes
    notes += _published_batch(row, par, dense, model, base)
    notes += _executed_vocab(row, par["tp"], model, base, mpreset)
    fw, prof, overlap, fnotes = _framework_defaults(row, par, int(model.get("num_layers", base.get("num_layers", 0))
                                                                     or 0))
    notes += fnotes
    precision, cluster, pnotes = _precision_and_recipe(row, fw, mpreset, cluster)
    notes += pnotes
    popts = cluster.pop("precision_options", None) if isinstance(cluster, dict) else None

    scenario = {"model": model if len(model) > 1 else mpreset, "cluster": cluster, "parallel": par,
                "precision": precision, "overlap": overlap, "num_steps": 2}
    if popts:
        scenario["precision_options"] = popts
    if fw == "llm_foundry":
        notes += _llm_foundry_run(row, scenario)
    if prof.get("stack") and not _model_parallel_deepspeed(fw, par, notes):
        scenario.setdefault("framework", prof["stack"])
        notes.append(f"kernel stack {scenario['framework']}")
    if prof.get("grad_reduce_dtype"):
        scenario["grad_reduce_dtype"] = prof["grad_reduce_dtype"]
        notes.append(f"grad_reduce_dtype={prof['grad_reduce_dtype']} ({prof['label']})")
    if fw == "megatron_bridge":
        notes += _bridge_recipe(row, scenario, base)
    _check_pipeline_split(par, int(model.get("num_layers", base.get("num_layers", 0)) or 0))
    return scenario, notes


def _model_parallel_deepspeed(fw: str, par: dict, notes: list[str]) -> bool:
    """A DeepSpeed row with tensor, pipeline, context or expert parallelism: the ``deepspeed``
    stack models ZeRO data parallelism only, so the row stays on the default stack (noted)."""
    axes = [f"{a}={par.get(a, 1)}" for a in ("tp", "pp", "cp", "ep") if par.get(a, 1) != 1]
    if fw != "deepspeed" or not axes:
        return False
    notes.append(f"not modelled: the deepspeed kernel stack with {', '.join(axes)} (it models ZeRO data "
                 "parallelism only): run on megatron_core")
    return True


#: Composer's FSDP mixed-precision modes -> the gradient reduction's dtype.  Source:
#: mosaicml/composer ``composer/trainer/mosaic_fsdp_utils.py`` ``get_mixed_precision`` @v0.16.4
#: and @v0.17.2: DEFAULT = (param BF16, reduce FP32, buffer BF16), PURE = all BF16, FULL = all
#: FP32.  (Before v0.16.4, commit d745fcb1 "patch default", DEFAULT left reduce_dtype unset.)
#: Parameters are gathered in BF16 under DEFAULT and PURE alike.
_COMPOSER_REDUCE_DTYPE = {"default": "fp32", "pure": "bf16"}

#: Benchmark-table sections whose runs set ``attn_impl`` per model (the rest ran
#: ``submit_benchmarks.py``'s default, ``triton``): mosaicml/llm-foundry
#: ``scripts/train/benchmarking/sweep.py``@5e85bd62, which made the "Large Scale" H100 table
#: (``--attn_impl flash`` for 1b, 3b, 7b and 70b, ``triton`` for 13b and 30b), and
#: ``submit_benchmarks.py``@5e85bd62, which writes the flag into the run's yaml and installs
#: ``.[gpu-flash2]`` (flash-attn 2.4.2).
_LLM_FOUNDRY_FLASH_RUNS = {"large scale": ("1b", "3b", "7b", "70b")}


def _llm_foundry_run(row: dict, scenario: dict) -> list[str]:
    """The settings of one llm-foundry benchmark run its cells imply, set in ``scenario``: the
    attention kernel (``attn_impl``: the kernel stack) and Composer's mixed-precision mode
    (``MP mode`` in the precision cell: the gradient reduction's dtype).  Notes say which."""
    notes = []
    mode = re.search(r"mp\s*mode\s*([a-z]+)", _cell(row, "precision").lower())
    if mode:
        name = mode.group(1)
        if name == "full":
            raise Unsupported(f"precision {_cell(row, 'precision')!r}: Composer's FULL mode keeps parameters, "
                              "gathers and gradients in FP32 (FP32 training is not modelled)")
        if name not in _COMPOSER_REDUCE_DTYPE:
            raise Unsupported(f"precision {_cell(row, 'precision')!r}: MP mode {name.upper()} is not one of "
                              "Composer's DEFAULT, PURE, FULL")
        dtype = _COMPOSER_REDUCE_DTYPE[name]
        scenario["grad_reduce_dtype"] = dtype
        notes.append(f"Composer MP mode {name.upper()}: parameters gathered in BF16, gradients reduced in "
                     f"{dtype.upper()} -> grad_reduce_dtype={dtype}")
    where = _cell(row, "source_location").lower()
    size = re.sub(r"^mpt-?", "", _cell(row, "model").lower().strip())
    flash = any(sec in where and size in sizes for sec, sizes in _LLM_FOUNDRY_FLASH_RUNS.items())
    if flash:
        scenario["framework"] = "llm_foundry_flash"
        notes.append("attn_impl: flash (FlashAttention-2, llm-foundry sweep.py@5e85bd62)")
    else:
        notes.append("attn_impl: triton (submit_benchmarks.py default)")
    return notes


_SPLIT_KEYS = ("pipeline_layout", "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
               "account_for_embedding_in_pipeline_split")


def _check_pipeline_split(par: dict, layers: int) -> None:
    """:class:`Unsupported` when the layers do not divide over pp x vpp and neither the row,
    its recipe nor the harness's rules (:func:`_published_layout`) give a split."""
    stages = par["pp"] * par.get("vpp", 1)
    if par["pp"] > 1 and layers % stages and not any(k in par for k in _SPLIT_KEYS):
        raise Unsupported(f"num_layers {layers} do not divide over pp {par['pp']} x vpp {par.get('vpp', 1)}, the row "
                          "gives no split and no uneven split of whole chunks fits (Megatron needs "
                          "num_layers_in_first/last_pipeline_stage or a pipeline layout)")


def _bridge_layout(record: dict, release: str, scenario: dict, base: dict) -> list[str]:
    """Notes; sets ``parallel.pipeline_layout`` from the recipe when it has one for the row's
    pp x vpp (else from the nearest release whose recipe has one for that stage count), with
    the MTP layer taken out for a row run without it."""
    from workloads.parallel import parse_pipeline_layout

    from .releases import bridge_layout

    par = scenario["parallel"]
    stages = par["pp"] * par.get("vpp", 1)
    layout, notes = record["knobs"].get("pipeline_layout"), []
    model = scenario["model"]
    layers = model.get("num_layers") if isinstance(model, dict) else None
    if layers is not None and layers != base.get("num_layers"):
        return [f"the recipe's pipeline layout places the preset's {base.get('num_layers')} layers, the row states "
                f"{layers}: the harness's split"] if par["pp"] > 1 else []
    if par["pp"] < 2 or layout is None and not (base.get("num_layers", 0) % stages):
        return []
    if layout is None or len(parse_pipeline_layout(layout)) != stages:
        found = bridge_layout(record["recipe"], stages, release)
        if found is None:
            return [f"no Megatron-Bridge pipeline layout for {stages} virtual stages: the harness's split"]
        layout, other = found
        notes.append(f"pipeline layout {layout} from the {other['release']} recipe ({stages} virtual stages; this "
                     f"release's variant has none for pp {par['pp']} x vpp {par.get('vpp', 1)})")
    else:
        notes.append(f"pipeline layout {layout} (recipe)")
    mtp = model.get("mtp_layers", base.get("mtp_layers", 0)) if isinstance(model, dict) else base.get("mtp_layers", 0)
    if "m" in layout and not mtp:
        layout = layout.replace("m", "")
        notes.append("MTP layer removed from the layout (the row runs without MTP)")
    for k in ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
              "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"):
        par.pop(k, None)
    par["pipeline_layout"] = layout
    return notes


def _bridge_recipe(row: dict, scenario: dict, base: dict) -> list[str]:
    """Notes; applies the Megatron-Bridge release's recipe (:mod:`.releases`) to ``scenario``.
    The row's own cells win: sequence parallelism, sharding and recompute only where the
    row leaves them empty; the degrees and batch always (a recipe variant that disagrees is
    noted)."""
    from .releases import BRIDGE_TAGS, bridge_recipe, bridge_release, bridge_settings

    release = bridge_release(_cell(row, "framework"))
    if release is None or release not in BRIDGE_TAGS:
        return [f"Megatron-Bridge release not recognised in {_cell(row, 'framework')!r}: runtime defaults only"]
    par = scenario["parallel"]
    layout = {"tp": par["tp"], "pp": par["pp"], "cp": par["cp"], "vpp": par.get("vpp", 1),
              "ep": par.get("ep", 1), "mbs": par["micro_batch_size"], "gbs": par["global_batch_size"]}
    gpu = map_gpu(_cell(row, "gpu_type") or _cell(row, "system"))[1]
    name, _variants = model_variants(_cell(row, "model"))
    record, how = bridge_recipe(release, name, gpu, scenario["precision"], layout)
    if record is None:
        return [how + ": runtime defaults only"]
    settings, notes = bridge_settings(record, par, base.get("moe") is not None)
    notes.insert(0, f"release {release} = Megatron-Bridge {BRIDGE_TAGS[release]}; {how}")
    # Megatron-Bridge's tables give only FSDP on or off ("DDP (FSDP=0 per doc)"): off leaves the
    # recipe's distributed optimizer (ZeRO-1) in place; the row's word wins over a recipe variant
    # that says otherwise
    row_zero = _zero(_cell(row, "zero_fsdp"))
    recipe_fsdp = settings["parallel"].get("zero_stage") == 3
    if row_zero is not None and (row_zero == 3) != recipe_fsdp:
        notes.append(f"the row says {'FSDP' if row_zero == 3 else 'no FSDP'}, its recipe variant the opposite: "
                     "the row's")
    if row_zero == 0:
        dist = settings["parallel"].get("distributed_optimizer", True)
        settings["parallel"].update(zero_stage=1 if dist else 0, distributed_optimizer=dist)
    elif row_zero == 3:
        settings["parallel"].update(zero_stage=3, distributed_optimizer=True)
    stated = {"sequence_parallel": _bool(row, "sp") is not None, "recompute": bool(_cell(row, "activation_recompute"))}
    for key, value in settings["parallel"].items():
        if key.startswith("recompute") and stated["recompute"]:
            continue
        if stated.get(key):
            continue
        if key != "pipeline_layout":
            par[key] = value
    notes += _bridge_layout(record, release, scenario, base)
    scenario["overlap"] = settings["overlap"]
    if settings["cluster"]:
        scenario["cluster"] = {**scenario["cluster"], **settings["cluster"]}
    if settings.get("host"):
        scenario["host"] = settings["host"]
    if settings.get("grad_reduce_dtype"):
        scenario["grad_reduce_dtype"] = settings["grad_reduce_dtype"]
    if settings.get("precision_options"):
        scenario["precision_options"] = settings["precision_options"]
    notes += _bridge_offload(settings, scenario)
    if settings["moe"]:
        model = scenario["model"] if isinstance(scenario["model"], dict) else {"preset": scenario["model"]}
        model["moe"] = {**model.get("moe", {}), **settings["moe"]}
        scenario["model"] = model
    notes += _bridge_hybrid_mtp(record, scenario, base)
    return notes


def _bridge_offload(settings: dict, scenario: dict) -> list[str]:
    """Notes; the recipe's activation offload into the scenario's ``offload`` section, unless
    the row's own recompute cell asks for recomputation (Megatron-Core refuses the two
    together: the row's word wins and the offload is dropped)."""
    off = dict(settings.get("offload") or {})
    if settings.get("offload_modules"):
        off["modules"] = list(settings["offload_modules"])
    if not off:
        return []
    if off.get("activations") and scenario["parallel"].get("recompute", "none") != "none":
        return [f"the recipe's activation offload ({off['activations']} layers) is dropped: the row recomputes "
                f"({scenario['parallel']['recompute']}) and Megatron-Core refuses the two together"]
    scenario["offload"] = off
    return []


def _bridge_hybrid_mtp(record: dict, scenario: dict, base: dict) -> list[str]:
    """Notes; a hybrid (Nemotron 3) recipe's ``mtp_num_layers``: its depths run one repeated
    module (the Nemotron 3 recipes set ``mtp_use_repeated_layer``, pattern ``*E``)."""
    mtp = record["knobs"].get("mtp_num_layers")
    if not base.get("hybrid_override_pattern") or not isinstance(mtp, int) or isinstance(mtp, bool):
        return []
    model = scenario["model"] if isinstance(scenario["model"], dict) else {"preset": scenario["model"]}
    if mtp == base.get("mtp_layers", 0) and base.get("mtp_repeated_layer", False):
        return []
    model["mtp_layers"] = mtp
    if mtp:
        model["mtp_repeated_layer"] = True
    scenario["model"] = model
    return [f"mtp_layers {mtp} over one repeated module (recipe mtp_num_layers; preset {base.get('mtp_layers', 0)})"]


def _published_cluster(row: dict, n: int) -> tuple[dict, list[str]]:
    """The ``cluster`` section for ``n`` GPUs: the preset of the GPU type, whole hosts (or part
    of one), the NVLink domain, the leaf size and the NICs the row states."""
    from topologies import load_preset
    from topologies.cluster import domain_that_divides

    notes: list[str] = []
    gpu_text = _cell(row, "gpu_type") or _cell(row, "system")
    try:
        preset, gpu, gnotes = map_gpu(gpu_text)
    except Unsupported as e:
        if _cell(row, "gpu_type"):
            raise
        raise Unsupported(f"gpu_type empty, system {gpu_text!r}: {e.reason}") from None
    notes += gnotes
    pdata = load_preset(preset)
    gph = pdata.get("gpus_per_host", 8)
    stated = _int(row, "gpus_per_node")
    if stated is not None and stated not in (gph, pdata.get("nvlink_domain_size", gph)):
        raise Unsupported(f"gpus_per_node {stated} on {preset} (hosts of {gph}, NVLink domains of "
                          f"{pdata.get('nvlink_domain_size', gph)})")
    cluster = {"preset": preset, "num_nodes": n // gph}
    if n < gph:
        part, pnotes = _partial_host(pdata, n)
        cluster.update(part)
        notes += pnotes
    elif n % gph:
        raise Unsupported(f"{n} GPUs is not a whole number of {gph}-GPU hosts ({preset})")
    dom = pdata.get("nvlink_domain_size", gph)
    if gph < n < dom:
        notes.append(f"{n} GPUs: one NVLink domain of {n} ({n // gph} hosts of a {dom}-GPU rack)")
    elif n > dom and n % dom:
        # NVL72 racks: a job of 128, 256, ... GPUs runs 16 trays (64 GPUs) per rack
        fit = domain_that_divides(n, gph, dom)
        cluster["nvlink_domain_size"] = fit
        notes.append(f"{n} GPUs is not a whole number of {dom}-GPU NVLink domains: {n // fit} domains of {fit} "
                     f"({fit // gph} hosts of each rack)")
    if pdata.get("gpu") != gpu:
        cluster["gpu"] = gpu
    leaf, lnotes = _leaf_fit(pdata, n // gph)
    cluster.update(leaf)
    notes += lnotes
    net, nnotes = _network(_cell(row, "inter_node_network"), pdata)
    if net and n < gph:                          # one host's share of the stated NICs
        net["nics_per_host"] = max(1, net["nics_per_host"] * n // gph)
    cluster.update(net)
    notes += nnotes
    return cluster, notes


def _published_model(row: dict) -> tuple[dict, dict, str | None, list[str]]:
    """``(model section, base, preset, notes)``: the preset the name maps to (or a model built
    from the row's dimensions, preset None) with the row's dimensions and experts where they
    differ from ``base``, the preset's (or built) mapping."""
    from workloads.model_loading import load_preset_mapping

    notes: list[str] = []
    try:
        mpreset, proxy = map_model(_cell(row, "model"))
    except Unsupported:
        dims = model_from_dimensions(row)        # an unknown name with its dimensions given
        if dims is None:
            raise
        model, dnote = dims
        notes.append(dnote)
        mpreset, proxy, base = None, None, dict(model)
    else:
        base = load_preset_mapping(mpreset)
        model = {"preset": mpreset}
    layers = _int(row, "num_layers")
    ffn, expert_ffn, (experts, shared) = _ffn_cell(row), _expert_ffn_cell(row), _experts_cell(row)
    if proxy is not None:
        if layers is not None and layers != proxy:
            raise InvalidRow(f"model name says {proxy} layers, num_layers says {layers}")
        layers = proxy
    fields = {"num_layers": layers, "hidden_size": _int(row, "hidden_size"),
              "ffn_hidden_size": ffn, "num_attention_heads": _int(row, "num_heads"),
              "num_kv_heads": _int(row, "num_kv_heads")}
    for f, v in fields.items():
        if v is None:
            continue
        ref = base.get(f)
        if ref is None and f == "num_kv_heads":
            ref = base.get("num_attention_heads")
        if v != ref:
            model[f] = v
            notes.append(f"{f} {v} (preset {mpreset}: {ref})")
    top_k = _int(row, "moe_top_k")
    if any(v is not None for v in (experts, top_k, expert_ffn, shared)):
        bmoe = base.get("moe")
        if bmoe is None:
            if (experts or 1) > 1 or expert_ffn is not None:
                raise InvalidRow(f"num_experts {_cell(row, 'num_experts')!r} / ffn_hidden_size "
                                 f"{_cell(row, 'ffn_hidden_size')!r} give experts for the dense preset {mpreset}")
        else:
            moe = {}
            for key, v in (("num_experts", experts), ("top_k", top_k), ("expert_ffn_hidden_size", expert_ffn),
                           ("num_shared_experts", shared)):
                if v is not None and v != bmoe.get(key, 0 if key == "num_shared_experts" else None):
                    moe[key] = v
            if moe:
                model["moe"] = moe
                notes.append(f"moe {moe} (preset {mpreset})")
    pattern = base.get("hybrid_override_pattern")
    if pattern and model.get("num_layers", len(pattern)) != len(pattern):
        raise Unsupported(f"num_layers {model['num_layers']}: preset {mpreset} is a hybrid whose layer pattern has "
                          f"{len(pattern)} layers, and the pattern of a {model['num_layers']}-layer variant is not "
                          "stated")
    notes += _apply_variants(row, model, base, mpreset)
    if _cell(row, "moe_layer_pattern"):
        notes.append(f"moe_layer_pattern {_cell(row, 'moe_layer_pattern')!r} not read: the preset's pattern")
    return model, base, mpreset, notes


def _ffn_cell(row: dict) -> int | None:
    """The dense FFN width of the ``ffn_hidden_size`` cell (None when it gives an expert's)."""
    if re.search(r"per\s*expert", _cell(row, "ffn_hidden_size"), re.IGNORECASE):
        return None
    return _int(row, "ffn_hidden_size")


def _expert_ffn_cell(row: dict) -> int | None:
    """An expert's FFN width from an ``ffn_hidden_size`` cell like ``2048 per expert``."""
    m = re.fullmatch(r"([\d,]+)\s*per\s*expert", _cell(row, "ffn_hidden_size"), re.IGNORECASE)
    return int(m.group(1).replace(",", "")) if m else None


def _experts_cell(row: dict) -> tuple[int | None, int | None]:
    """``(routed experts, shared experts)`` of a ``num_experts`` cell: ``64``, or
    ``256 routed + 1 shared`` (shared None when the cell does not say)."""
    text = _cell(row, "num_experts")
    m = re.fullmatch(r"([\d,]+)\s*routed\s*\+\s*(\d+)\s*shared", text, re.IGNORECASE)
    if m:
        return int(m.group(1).replace(",", "")), int(m.group(2))
    return _int(row, "num_experts"), None


def _apply_variants(row: dict, model: dict, base: dict, mpreset: str | None) -> list[str]:
    """Notes; applies the model name's variant tags (:func:`model_variants`) to ``model``."""
    _name, variants = model_variants(_cell(row, "model"))
    notes = []
    if "no_mtp" in variants and base.get("mtp_layers"):
        model["mtp_layers"] = 0
        notes.append(f"'w/o MTP': mtp_layers 0 (preset {mpreset}: {base['mtp_layers']})")
    if "mtp" in variants and not base.get("mtp_layers"):
        raise Unsupported(f"model {_cell(row, 'model')!r}: MTP asked of preset {mpreset}, which has no MTP module")
    if "tokendrop" in variants:
        if base.get("moe") is None:
            raise InvalidRow(f"model {_cell(row, 'model')!r}: a token-drop variant of the dense preset {mpreset}")
        model.setdefault("moe", {})["capacity_factor"] = 1.0
        notes.append("tokendrop: capacity_factor 1.0 (Megatron-Bridge's token-drop recipes), experts padded to "
                     "capacity; under the forced-balanced routing of these benchmarks every expert receives exactly "
                     "its capacity, so nothing is dropped and the step runs as the dropless one")
    return notes


def _published_layout(row: dict, n: int, model: dict, base: dict) -> tuple[dict, int, list[str]]:
    """``(parallel section, dense dp, notes)``: the five degrees (Megatron's dp includes EP),
    the schedule, and the pipeline split of a layer count that does not divide evenly."""
    notes: list[str] = []
    for col in ("tp", "pp"):
        m = re.fullmatch(r"(\d+)\s*\(?\s*(?:tp\s*[x*×]\s*pp|pp\s*[x*×]\s*tp|mp|model[\s-]*parallel\w*)\s*\)?",
                         _cell(row, col), re.IGNORECASE)
        if m:
            raise Unsupported(f"model-parallel size {m.group(1)} given without the TP/PP split ({col} "
                              f"{_cell(row, col)!r}): the split decides the step, and guessing it would hide that")
    tp, pp, cp, ep, vpp = (_int(row, k) for k in ("tp", "pp", "cp", "ep", "vpp"))
    filled = [k for k, v in (("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep), ("vpp", vpp)) if v is None]
    tp, pp, cp, ep, vpp = tp or 1, pp or 1, cp or 1, ep or 1, vpp or 1
    if filled:
        notes.append(f"{', '.join(filled)} empty -> 1")
    dp = _int(row, "dp")
    if dp is None:
        if n % (tp * pp * cp):
            raise InvalidRow(f"num_gpus {n} is not divisible by tp*pp*cp = {tp * pp * cp}")
        dense = n // (tp * pp * cp)
        notes.append(f"dp empty -> num_gpus/(tp*pp*cp) = {dense}")
    elif tp * pp * cp * dp == n:
        dense = dp
    elif tp * pp * cp * dp * ep == n:
        dense = dp * ep
        notes.append(f"dp {dp} excludes ep (tp*pp*cp*dp*ep = num_gpus): dense dp {dense}")
    else:
        raise InvalidRow(f"tp*pp*cp*dp = {tp}*{pp}*{cp}*{dp} = {tp * pp * cp * dp} != num_gpus {n}")
    if dense % ep == 0:
        par: dict = {"tp": tp, "pp": pp, "dp": dense // ep, "cp": cp, "ep": ep}
        if ep > 1:
            notes.append(f"dp {dense} includes ep {ep}: five-degree dp = {dense // ep}")
    elif (tp * cp * dense) % ep == 0:
        # MoE parallel folding: the expert mesh (etp, ep, edp) spans tp*cp*dp; with the default
        # etp = tp it would not fit, so the run must have set expert_tensor_parallel_size
        par = {"tp": tp, "pp": pp, "dp": dense, "cp": cp, "ep": ep, "etp": 1}
        notes.append(f"ep {ep} does not fit in dp {dense}: MoE parallel folding with expert tensor parallel 1 "
                     f"(expert mesh etp 1 x ep {ep} x edp {tp * cp * dense // ep} over tp*cp*dp = {tp * cp * dense})")
    else:
        raise InvalidRow(f"ep {ep} divides neither the dense data-parallel degree {dense} nor tp*cp*dp = "
                         f"{tp * cp * dense}")
    if vpp > 1:
        if pp == 1:
            raise InvalidRow(f"vpp {vpp} needs pp > 1")
        par.update(schedule="interleaved_1f1b", vpp=vpp)
    else:
        par.update(schedule="1f1b", vpp=1)
    layers = int(model.get("num_layers", base.get("num_layers", 0)) or 0)
    nvs = pp * par["vpp"]
    if pp > 1 and layers % nvs and (layers + 2) % nvs == 0:
        # Megatron's knobs for it, as NeMo's Llama 3.1 405B recipe sets them (126 + 2 = 128)
        par.update(account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)
        notes.append(f"{layers} layers do not divide over pp {pp} x vpp {par['vpp']} and the row gives no split: "
                     f"embedding and loss counted as layers ({layers} + 2 = {layers + 2}; harness default)")
    elif (split := edge_stage_split(layers, pp, par["vpp"])) is not None:
        first, last = split
        par.update(num_layers_in_first_pipeline_stage=first, num_layers_in_last_pipeline_stage=last)
        notes.append(f"{layers} layers do not divide over pp {pp} x vpp {par['vpp']} and the row gives no split: "
                     f"first stage {first}, last {last}, the others {(layers - first - last) // max(1, pp - 2)} "
                     f"(harness default; Megatron needs the split given)")
    return par, dense, notes


def _published_batch(row: dict, par: dict, dense: int, model: dict, base: dict) -> list[str]:
    """Notes; sets the batch sizes and sequence length in ``par`` (and the model's sequence
    length where it differs from ``base``), checking grad_accum against the dense dp."""
    notes: list[str] = []
    gbs = _int(row, "global_batch_size")
    if gbs is None:
        raise InvalidRow("global_batch_size is empty")
    mbs = _int(row, "micro_batch_size")
    if mbs is None:
        mbs = 1
        notes.append("micro_batch_size empty -> 1")
    par.update(micro_batch_size=mbs, global_batch_size=gbs)
    ga = _int(row, "grad_accum")
    if ga is not None and ga * mbs * dense != gbs:
        notes.append(f"grad_accum {ga} disagrees with gbs/(mbs*dp) = {gbs / (mbs * dense):g}")
    seq = _int(row, "seq_len")
    if seq is None:
        seq = base["seq_len"]
        notes.append(f"seq_len empty -> the preset's {seq}")
    elif seq != base.get("seq_len"):
        model["seq_len"] = seq
    par["seq_len"] = seq
    return notes


def _executed_vocab(row: dict, tp: int, model: dict, base: dict, mpreset: str | None) -> list[str]:
    """Notes; sets the vocabulary actually executed in ``model`` (the row's vocab_size is the
    FLOP formula's; the GPT2BPETokenizer proxy runs GPT-2's, padded to a multiple of 128 x tp)."""
    vocab = _int(row, "vocab_size")
    if "gpt2bpetokenizer" in _key(_cell(row, "notes") + _cell(row, "derived_fields")):
        mult = 128 * tp
        padded = -(-_GPT2_VOCAB // mult) * mult
        model["vocab_size"] = padded
        return [f"vocab {padded} executed (GPT2BPETokenizer proxy: 50257 padded to a multiple of 128*tp); "
                f"row vocab {vocab} used for FLOP conventions only"]
    if vocab is not None and vocab != base.get("vocab_size"):
        model["vocab_size"] = vocab
        return [f"vocab_size {vocab} (preset {mpreset}: {base.get('vocab_size')})"]
    return []


def _default_recompute(name: str, par: dict, num_layers: int) -> dict:
    """A framework's default recompute as ``parallel`` settings; ``every_2nd_layer``
    (torchtitan's layer-wise selective AC, one block in two checkpointed) as full recompute of
    ceil(half) of each stage's layers, the block method."""
    if name != "every_2nd_layer":
        return {"recompute": name}
    per_stage = max(1, num_layers // max(1, par["pp"] * par.get("vpp", 1)))
    return {"recompute": "full", "recompute_method": "block", "recompute_num_layers": -(-per_stage // 2)}


def _framework_defaults(row: dict, par: dict, num_layers: int = 0) -> tuple[str, dict, dict, list[str]]:
    """``(framework, its FRAMEWORKS profile, overlap section, notes)``; sets sequence
    parallelism, the ZeRO stage and recompute in ``par``, from the row or, for empty cells,
    the framework's defaults (listed in one note)."""
    fw, notes = _framework(_cell(row, "framework"))
    prof = FRAMEWORKS[fw]
    used = []
    sp = _bool(row, "sp")
    if sp is None:
        sp = par["tp"] > 1 if prof["sequence_parallel"] == "tp>1" else bool(prof["sequence_parallel"])
        used.append(f"sequence_parallel={str(sp).lower()}")
    zero = _zero(_cell(row, "zero_fsdp"))
    if zero is None:
        zero, dist = prof["zero_stage"], prof["distributed_optimizer"]
        used.append(f"distributed_optimizer={str(dist).lower()} (ZeRO-{zero})")
    else:
        dist = zero >= 1
    rc = _recompute(_cell(row, "activation_recompute"))
    if rc is None:
        rc = _default_recompute(prof["recompute"], par, num_layers)
        used.append(", ".join(f"{k}={v}" for k, v in rc.items()))
    if rc.get("offload_activation_layers") and par.get("pp", 1) > 1:
        raise Unsupported(f"activation_recompute {_cell(row, 'activation_recompute')!r}: activation offload with "
                          f"pp {par['pp']} (Megatron-Core has no CPU offloading with pipeline parallelism)")
    fraction, onotes = _zero_offload(_cell(row, "zero_fsdp"))
    notes += onotes
    if fraction:
        rc["optimizer_offload_fraction"] = fraction
    par.update(sequence_parallel=sp, zero_stage=zero, distributed_optimizer=dist, **rc)
    overlap = {"grad_reduce": prof["overlap"]["grad_reduce"], "param_gather": prof["overlap"]["param_gather"],
               "tp_comm": prof["overlap"].get("tp_comm", False), "p2p": prof["overlap"]["p2p"]}
    for k, v in overlap.items():
        if v == "zero3":                            # DeepSpeed: overlap_comm on only at ZeRO stage 3
            overlap[k] = zero == 3
    used.append("overlap " + ", ".join(f"{k}={str(v).lower()}" for k, v in overlap.items()))
    used.append(f"schedule={par['schedule']}")
    notes.append(f"defaults ({prof['label']}): " + "; ".join(used))
    return fw, prof, overlap, notes


def _check_precision_gpu(text: str, precision: str, cluster: dict) -> None:
    """:class:`Unsupported` naming the precision cell when the row's GPU cannot run its recipe
    (MXFP8 / NVFP4 need Blackwell, FP8 Hopper or later)."""
    from topologies import load_preset
    from topologies.specs import get_gpu_spec
    from workloads.costs.precision import PRECISION_RECIPES

    gpu = get_gpu_spec(cluster.get("gpu") or load_preset(cluster["preset"])["gpu"])
    try:
        PRECISION_RECIPES[precision].check_gpu(gpu)
    except ConfigError as e:
        raise Unsupported(f"precision {text!r} ({precision}) on {gpu.name}: {e.rule}") from None


def _precision_and_recipe(row: dict, fw: str, mpreset: str | None, cluster: dict) -> tuple[str, dict, list[str]]:
    """``(precision recipe, cluster, notes)``: the row's precision, and the NeMo recipe's
    settings for its model (cluster overrides, or a not-modelled note)."""
    text = _cell(row, "precision")
    notes: list[str] = []
    if not text and fw == "megatron_bridge" and "fp8 quantization granularity" in _cell(row, "notes").lower():
        # Megatron-Bridge 25.09's table states no precision; its footnotes give two FP8
        # granularities per cell, and the next release's table names the primary one FP8-CS
        text = "FP8-CS"
        notes.append("precision not stated; the table's footnotes give two FP8 quantisation granularities, the primary "
                     "read as current scaling (FP8-CS) as the next release's table names it")
    precision, pnotes = map_precision(text, fw)
    notes += pnotes
    _check_precision_gpu(text, precision, cluster)
    if fw == "nemo":
        for prec, over, text in _NEMO_RECIPES.get(mpreset, []):
            if prec and not precision.startswith(prec):
                continue
            if over is None:
                notes.append(_NOT_MODELLED + text)
            else:
                cluster = {**cluster, **over}
                notes.append(text)
    return precision, cluster, notes
