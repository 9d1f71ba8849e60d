"""Memory per rank: static state by ZeRO stage, activations term by term, the OOM verdict.

What is modelled
----------------
The peak device memory of one rank of each pipeline stage in a training step, as a sum of
named terms (bytes):

* **static state** of the parameters the rank holds: ``weights``, ``gradients``,
  ``master_weights``, ``optimizer_states`` and ``fp8_weight_copies``;
* **activations** held for the backward pass, per term, at the moment the stage holds the
  most (:func:`layer_activation_bytes` gives one layer and one micro-batch);
* ``logits`` of the loss on the stage that computes it;
* transient buffers: ``moe_dispatch`` (one all-to-all's send and receive buffers),
  ``dp_buckets`` (gradient buckets that are not views of a gradient buffer),
  ``param_gather`` (FSDP's gathered layers);
* ``reserve``: CUDA context, NCCL buffers and allocator fragmentation, an assumption
  (:data:`RESERVE_PARTS`).

Not modelled: temporaries inside one op (GEMM workspaces, attention's backward scratch),
gradients of activations in flight during one backward (they live for one layer), the
pinned host buffers of offloading, and the input pipeline's pinned host memory.  Offload
(:mod:`workloads.offload`): ``parallel.offload_activation_layers`` leading layers keep no
activations on the GPU, ``offload_modules`` take their inputs' terms off every layer; ``optimizer_offload_fraction`` of the master weights and optimizer
states lives in host memory.

Parameters a rank holds
-----------------------
The layers of its pipeline chunks (:func:`~workloads.parallel.split_layers`; interleaved
chunk ``c`` of stage ``s`` holds virtual stage ``c*pp + s``; DualPipe's stage ``s`` holds
model chunks ``s`` and ``pp-1-s``, two parameter copies), sharded as Megatron-Core shards
them: attention heads, MLPs, shared experts and the vocabulary over ``tp`` (KV heads
replicated when ``tp`` exceeds them; MLA's down-projections and latent norms duplicated);
routed experts over ``ep`` and ``etp``; norms, routers, the output-projection bias and
learned position embeddings replicated.  The word embedding sits on the rank holding
model chunk 0, the output layer and final norm on the rank holding the last one (with tied
embeddings and more than one stage that rank keeps its own copy of the matrix, as
Megatron does); MTP modules sit with the loss unless ``pipeline_layout`` places them.  The
vocabulary is padded as Megatron pads it, to a multiple of
``make_vocab_size_divisible_by * tp``.

Static memory: bytes per parameter
----------------------------------
``accounting`` names where the bytes per parameter come from (:data:`STATIC_ACCOUNTINGS`):

``megatron`` (default)
    bf16 parameters (2), fp32 main gradients (4), fp32 master weights (4) and the two
    fp32 Adam moments (8): 18 bytes without the distributed optimizer and
    ``6 + 12/d`` with it, ``d = dp*cp`` for dense parameters and ``d = edp`` for routed
    experts (Megatron-LM ``docs/api-guide/dist_optimizer.md`` table;
    ``megatron/training/theoretical_memory_usage.py``, ``compute_weight_and_optimizer_memory``).
``zero_paper``
    Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
    Models", §3.1: fp16 parameters and gradients (2 + 2) and K = 12 bytes of optimizer
    state (fp32 parameters, momentum, variance): 16 bytes per parameter; stage 1
    ``4 + 12/d``, stage 2 ``2 + 14/d``, stage 3 ``16/d`` (their Figure 1).

The effective ZeRO stage is ``parallel.zero_stage`` for stages 2 and 3; for stages 0 and 1
``parallel.distributed_optimizer`` decides (Megatron's distributed optimizer is ZeRO-1;
``--use-distributed-optimizer`` absent means no sharding).  Stage 1 shards master weights
and optimizer states over the data-parallel group, stage 2 also the gradients, stage 3
(FSDP) also the parameters, and then adds two gathered layers (the one computing and the
one prefetched).  Megatron's gradient buckets are views of its contiguous gradient buffer
and its parameter all-gather writes into the parameter buffer, so stages 0-1 add no
bucket or gather memory; with sharded gradients (stages 2-3) two buckets are in flight:
``max(40M, 1M * dp * cp)`` parameters in the gradient dtype at stage 2 (Megatron's
``bucket_size`` rule, ``megatron/core/distributed/distributed_data_parallel.py``), the
largest gathered layer at stage 3 (FSDP reduce-scatters per layer).

Activations
-----------
Per layer and micro-batch, following the structure of Korthikanti et al. 2022 ("Reducing
Activation Recomputation in Large Transformer Models", arXiv 2205.05198, §4 and Table 2:
``sbh(34 + 5as/h)`` bytes for a GPT layer in 16-bit with dropout) with every tensor a
backward pass keeps counted for the actual architecture.  ``s`` is the sequence, ``b`` the
micro-batch, ``h`` the width, ``t = tp``; the sequence is first split over ``cp``; "SP
regions" (norms, dropout, residual) are split over ``t`` with sequence parallelism, the
tensor-parallel regions always are.  ``e`` is the activation dtype's bytes (2), ``l`` the
bytes of saved GEMM inputs (``e``; 1 with FP8 recipes that keep quantised inputs).

Terms, with what each ``recompute_modules`` entry drops under selective recomputation::

    term                 bytes (one layer, one micro-batch, one rank)   dropped by
    norm_inputs          2 norms x s b h e           (SP region)        --
    norm_stats           2 norms x s b x 4 x (2 LayerNorm, 1 RMSNorm)   --
    attn_input           s b h l   (norm output, QKV GEMM input; SP)    ``layernorm``
    q / kv               s b (a/t) d e  /  2 s b k' d e  (k' KV heads   ``mla_up_proj`` (MLA)
                         per rank; GQA keeps K and V small)
    qk_norm_inputs       s b (a/t + k') d e              (Qwen3)        --
    mla_latents          q and kv latents, norm input and up-proj input --
    attn_scores          without FlashAttention: softmax output and     ``core_attn``
                         dropout output, (1 or 2) e (a/t) s^2 b
    attn_dropout_mask    without FlashAttention, attention dropout > 0: ``core_attn``
                         (a/t) s^2 b
    softmax_stats        with FlashAttention: fp32 log-sum-exp,         ``core_attn``
                         4 (a/t) s b
    attn_output          s b (a/t) d_v l  (output-projection input)     --
    ffn_input            s b h l   (pre-FFN norm output; SP)            ``layernorm``
    mlp_fc1_output       s b (1 or 2) f/t e  (GELU: f; SwiGLU: gate+up) ``mlp``
    mlp_fc2_input        s b f/t l                                      ``mlp``
    router               T E (4 + 1)  (fp32 scores and routing map)     ``moe``
    expert_input         R h l, R = T k etp x imbalance rows per rank   ``moe``
    expert_fc1_output    R (1 or 2) f_e/etp e                           ``moe``
    expert_fc2_input     R f_e/etp l                                    ``moe``, ``moe_act``
    moe_combine          T k h e  (expert outputs kept for the          ``moe``
                         probability-weighted combine)
    shared_fc1_output /  as the MLP, with S shared experts of f_s       ``moe``, ``shared_experts``
    shared_fc2_input
    dropout_masks        2 x s b h x 1 byte, only with dropout > 0 (SP) --

``T = s b / t`` are the tokens a rank routes (MoE with TP needs SP in Megatron-Core).
``imbalance`` is 1 for balanced routing, the capacity factor with token dropping, and under
a skewed routing passed as ``moe_routing`` (dropless) the worst EP rank's received tokens
over the stage's MoE layers over the balanced share (:func:`memory_estimate`).
FlashAttention keeps no ``s^2`` term, so selective recomputation of the core attention
is implicit with it.  For Korthikanti's GPT (GELU MLP of 4h, LayerNorm, dropout, no
FlashAttention) the terms sum to ``sbh(34 + 5as/h)`` without parallelism,
``sbh(10 + 24/t + 5as/(ht))`` with TP, ``sbh(34/t + 5as/(ht))`` with TP and SP and
``34 sbh/t`` with selective recomputation, plus the norm statistics
(``16 sb`` bytes, under 0.1 %); the tests check this.

Recomputation (``parallel.recompute``): ``selective`` drops the terms of the modules in
``recompute_modules``; ``full`` keeps only each checkpoint's input (``layer_input``,
``s b h e`` in the SP region) and rebuilds one checkpoint's activations at a time during
the backward (``recompute_working``, counted once): Megatron's ``uniform`` method
checkpoints groups of ``recompute_num_layers`` layers (default 1), ``block`` checkpoints
the first ``recompute_num_layers`` layers of each model chunk one by one (default all)
and stores the rest in full.  Both apply per model chunk, as Megatron-Core's
``TransformerBlock`` applies them.

The first model chunk adds the token ids (int64, ``8 s b``, as Megatron's formula) and the
embedding dropout mask (with dropout); the last adds the final norm's input and the output
layer's input (``output_head``) and the ``logits``: ``s b V/t`` elements held for the
loss in fp32 (``logits_bytes_per_element = 4``), because Megatron's vocab-parallel cross
entropy casts the logits to fp32 and keeps the softmax for the backward; the bf16 logits
the output GEMM writes are freed once cast and are not counted.  Each MTP module adds a
decoder layer, its input norms and projection input, an output head and its own logits.

Context parallelism adds the transient buffers of its exchange (``cp_buffers``, one layer
at a time, :func:`cp_buffer_bytes`): they follow ``parallel.cp_comm_type`` -- the ring's
double buffers for ``p2p``, the whole sequence's K/V for ``all_gather``, the Q/K/V
send and receive buffers for ``a2a``.

Micro-batches in flight
-----------------------
The stage's activations per micro-batch and chunk are multiplied by the schedule's
in-flight counts: the table of ``get_schedule(parallel.schedule)(pp, m, vpp)`` is walked in
program order, a (micro-batch, chunk) set held from its forward to the action that
completes its weight gradient (the rule of :func:`~workloads.schedules.peak_in_flight`),
and the peak taken over the actual bytes of each chunk.  Hence 1F1B's stage ``s`` holds
``pp - s`` micro-batches, GPipe ``m``, interleaved 1F1B's stage 0 ``(pp-1)*2 +
(vpp-1)*pp + 1`` chunk sets (``pp (1 + (pp-1)/(pp vpp))`` stages' worth, Korthikanti
§4.2.3), ZB-H1 ``pp`` on every stage and DualPipe ``pp + 1`` chunk sets on every rank,
whose two chunks also double the static state.

All sizes are bytes; GB in messages is 1e9 bytes, as :class:`~topologies.GPUSpec` states HBM.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass

from topologies import ConfigError

from .blocks import layer_blocks
from .blocks.moe import default_token_imbalance, has_paged_stash, skewed_expert_load
from .moe_routing import parse_routing
from .memory_accounting import (ACTIVATION_TERMS, DEFAULT_RESERVE_BYTES, MEMORY_TERMS, RESERVE_PARTS,
                                STATIC_ACCOUNTINGS, MemoryEstimate, MemoryOptions, StaticAccounting, _options,
                                bytes_per_param, check_fits, effective_zero_stage, get_static_accounting)
from .model import ModelSpec
from .offload import offloaded_terms
from .parallel import ParallelConfig, mtp_per_virtual_stage, split_layers
from .schedules import ActionKind, get_schedule, peak_in_flight

__all__ = ["ACTIVATION_TERMS", "cp_buffer_bytes", "DEFAULT_RESERVE_BYTES", "MEMORY_TERMS", "RESERVE_PARTS", "STATIC_ACCOUNTINGS",
           "MemoryEstimate", "MemoryOptions", "StaticAccounting", "bytes_per_param", "check_fits",
           "effective_zero_stage", "get_static_accounting", "layer_activation_bytes", "memory_estimate",
           "memory_estimates"]

# -- dimensions of one micro-batch on one rank --------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Dims:
    model: ModelSpec
    parallel: ParallelConfig
    opt: MemoryOptions
    seq: int            # full sequence length
    s_loc: int          # sequence on this CP rank
    b: int
    t: int
    etp: int
    tok: float          # tokens of this CP rank's sequence: s_loc * b (TP regions see all of them)
    tok_sp: float       # tokens in SP regions on this rank: tok / t with SP
    e: float            # activation bytes
    lb: float           # saved GEMM-input bytes
    kv_heads: int       # KV heads per TP rank
    attn_dropout: float
    imbalance: float
    vocab: int          # padded vocabulary

    @classmethod
    def build(cls, model: ModelSpec, parallel: ParallelConfig, opt: MemoryOptions) -> _Dims:
        t, cp = parallel.tp, parallel.cp
        seq = parallel.seq_len or model.seq_len
        s_loc = seq // cp
        b = parallel.micro_batch_size
        tok = s_loc * b
        sp = parallel.sequence_parallel and t > 1
        e = float(opt.activation_dtype_bytes)
        lb = e if opt.linear_input_bytes is None else float(opt.linear_input_bytes)
        kv = max(1, model.num_kv_heads // t)
        attn_dropout = model.dropout if opt.attention_dropout is None else opt.attention_dropout
        imb = opt.moe_token_imbalance
        if imb is None:
            imb = default_token_imbalance(model)        # (the paged stash's fixed buffer included)
        div = int(opt.make_vocab_size_divisible_by) * t
        vocab = -(-model.vocab_size // div) * div
        return cls(model, parallel, opt, seq, s_loc, b, t, parallel.expert_tp, float(tok),
                   tok / t if sp else float(tok), e, lb, kv, attn_dropout, imb, vocab)


def _norm_elems(model: ModelSpec) -> int:
    return 2 if model.norm == "layernorm" else 1


# -- activations of one layer -------------------------------------------------------------------------
def _layer_terms(d: _Dims, blocks, modules: frozenset[str]) -> dict[str, float]:
    """Bytes kept by one decoder layer (its ``blocks``) for one micro-batch; ``modules`` are
    recomputed.  Each block keeps its pre-norm's input and statistics and, with dropout, its
    residual's mask; the rest is the block's own (:meth:`workloads.blocks.Block.activation_terms`)."""
    m = d.model
    h, n = m.hidden_size, len(blocks)
    out = dict.fromkeys(ACTIVATION_TERMS, 0.0)
    out["norm_inputs"] = n * d.tok_sp * h * d.e
    out["norm_stats"] = n * d.tok_sp * 4 * _norm_elems(m)
    if m.dropout > 0:
        out["dropout_masks"] = n * d.tok_sp * h
    for block in blocks:
        block.activation_terms(d, modules, out)
    return out


def _recomputed_modules(parallel: ParallelConfig) -> frozenset[str]:
    return frozenset(parallel.recompute_modules) if parallel.recompute == "selective" else frozenset()


def layer_activation_bytes(model: ModelSpec, parallel: ParallelConfig, layer: int = 0, *,
                           options: MemoryOptions | None = None, **knobs) -> dict[str, float]:
    """Activation bytes one rank keeps for decoder layer ``layer`` and one micro-batch, by term.

    Parameters
    ----------
    model, parallel
        The layer's shape (``model.is_moe_layer(layer)`` picks dense or MoE) and the
        parallel knobs that matter per layer: ``tp``, ``cp``, ``etp``, ``sequence_parallel``,
        ``micro_batch_size``, ``seq_len``, ``recompute`` and ``recompute_modules``.
    layer
        0-based decoder layer; ``num_layers + k`` is MTP module ``k``'s layer.
    options, **knobs
        :class:`MemoryOptions`, or its fields as keywords.

    Returns
    -------
    dict
        Keys :data:`ACTIVATION_TERMS` (zeros included).  With ``recompute="full"`` only
        ``layer_input`` is non-zero: what one checkpointed layer keeps.
    """
    opt = _options(options, knobs)
    d = _Dims.build(model, parallel, opt)
    n = model.num_layers + model.mtp_layers
    if not 0 <= layer < n:
        raise IndexError(f"layer {layer} out of range for {model.num_layers} layers + {model.mtp_layers} MTP")
    if parallel.recompute == "full":
        out = dict.fromkeys(ACTIVATION_TERMS, 0.0)
        out["layer_input"] = d.tok_sp * model.hidden_size * d.e
        return out
    return _layer_terms(d, layer_blocks(model, layer), _recomputed_modules(parallel))


# -- parameters one rank holds -------------------------------------------------------------------------
@dataclass(slots=True)
class _Params:
    dense: float = 0.0       # sharded over dp*cp
    expert: float = 0.0      # sharded over edp
    gemm: float = 0.0        # of the dense ones, GEMM weights (FP8 copies)
    gemm_expert: float = 0.0    # of the expert ones, GEMM weights
    largest_unit: float = 0.0   # the largest FSDP unit (a layer, the embedding, the output layer)

    def add(self, dense: float, expert: float = 0.0, gemm: float = 0.0, gemm_expert: float = 0.0) -> None:
        self.dense += dense
        self.expert += expert
        self.gemm += gemm
        self.gemm_expert += gemm_expert
        self.largest_unit = max(self.largest_unit, dense + expert)


def _layer_params(model: ModelSpec, parallel: ParallelConfig, blocks) -> tuple[float, float, float, float]:
    """(dense, expert, dense GEMM, expert GEMM) parameters of one decoder layer (its
    ``blocks``) on one rank: each block's (:meth:`workloads.blocks.Block.rank_params`) and its
    pre-norm, replicated over TP."""
    norm = _norm_elems(model) * model.hidden_size
    first = blocks[0].rank_params(parallel)
    dense, expert, gemm, gemm_expert = first.dense + len(blocks) * norm, first.expert, first.gemm, first.gemm_expert
    for block in blocks[1:]:
        p = block.rank_params(parallel)
        dense += p.dense
        expert += p.expert
        gemm += p.gemm
        gemm_expert += p.gemm_expert
    return dense, expert, gemm, gemm_expert


# -- pipeline placement ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Chunk:
    layers: tuple[int, ...]
    embedding: bool
    loss: bool
    mtp: int


def _placement(model: ModelSpec, parallel: ParallelConfig) -> list[list[_Chunk]]:
    """``[stage][local chunk]`` -> the layers and the extras that chunk holds."""
    pp = parallel.pp
    counts = split_layers(model.num_layers, parallel, mtp_layers=model.mtp_layers)
    bidirectional = parallel.schedule == "dualpipe"
    vpp = 1 if bidirectional else parallel.vpp
    nvs = pp * vpp
    per_vs = [counts[k % pp][k // pp] for k in range(nvs)]      # virtual stage k = chunk k//pp of stage k%pp
    mtp = mtp_per_virtual_stage(parallel, model.mtp_layers, nvs)
    chunks, start = [], 0
    for k in range(nvs):
        chunks.append(_Chunk(tuple(range(start, start + per_vs[k])), k == 0, k == nvs - 1, mtp[k]))
        start += per_vs[k]
    if bidirectional:
        return [[chunks[s], chunks[pp - 1 - s]] for s in range(pp)]
    if parallel.schedule == "zb_v":             # the V: stage s holds model chunks s and 2pp-1-s
        return [[chunks[s], chunks[2 * pp - 1 - s]] for s in range(pp)]
    return [[chunks[c * pp + s] for c in range(vpp)] for s in range(pp)]


# -- schedule walk ---------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=128)
def _held(name: str, pp: int, m: int, vpp: int,
          extra_warmup: int = 0) -> tuple[tuple[tuple[tuple[int, ...], ...], ...], tuple[int, ...]]:
    """Per stage, the distinct per-chunk counts of held activation sets after each forward,
    and :func:`peak_in_flight`."""
    if extra_warmup and name == "interleaved_1f1b" and pp > 1:
        schedule = get_schedule(name)(pp, m, vpp, extra_warmup=extra_warmup)
    else:
        schedule = get_schedule(name)(pp, m, vpp)
    f_kind, free = ActionKind.F, (ActionKind.BW, ActionKind.W)
    out = []
    for actions in schedule.actions:
        held = [0] * schedule.num_chunks
        seen: dict[tuple[int, ...], None] = {}
        for a in actions:
            if a is None:
                continue
            for half in a.halves():
                if half.kind is f_kind:
                    held[half.chunk] += 1
                    seen[tuple(held)] = None
                elif half.kind in free:
                    held[half.chunk] -= 1
        out.append(tuple(seen))
    return tuple(out), tuple(peak_in_flight(schedule))


# -- the estimate ------------------------------------------------------------------------------------------
def _stage_ranks(parallel: ParallelConfig, stage: int) -> str:
    order = parallel.mesh_order.split("-")
    sizes = {"tp": parallel.tp, "cp": parallel.cp, "ep": 1, "dp": parallel.dp, "pp": parallel.pp}
    stride = math.prod(sizes[a] for a in order[:order.index("pp")])
    per_stage = parallel.world_size // parallel.pp
    if order[-1] == "pp":
        first = stage * stride
        return f"pipeline stage {stage} (ranks {first}-{first + per_stage - 1})"
    return f"pipeline stage {stage} ({per_stage} ranks with pp coordinate {stage}, first rank {stage * stride})"


def _add(acc: dict[str, float], terms: Mapping[str, float], times: float = 1.0) -> None:
    for k, v in terms.items():
        if v:
            acc[k] = acc.get(k, 0.0) + times * v


class _Model:
    """Per-call caches shared by the stages of one configuration."""

    def __init__(self, model: ModelSpec, parallel: ParallelConfig, opt: MemoryOptions, num_microbatches: int,
                 routing=None, seed: int = 0):
        self.model, self.parallel, self.opt = model, parallel, opt
        self.d = _Dims.build(model, parallel, opt)
        self.num_microbatches, self.seed = num_microbatches, seed
        # an explicit moe_token_imbalance wins over the routing
        self.routing = routing if opt.moe_token_imbalance is None else None
        self.modules = _recomputed_modules(parallel)
        self.placement = _placement(model, parallel)
        vpp = 1 if parallel.schedule == "dualpipe" else parallel.vpp
        self.held, self.in_flight = _held(parallel.schedule, parallel.pp, num_microbatches, vpp,
                                          int(opt.extra_warmup_microbatches))
        self._layer_cache: dict[tuple[bool, frozenset], dict[str, float]] = {}
        acc = get_static_accounting(opt.accounting)
        self.param_b = acc.param_bytes if opt.param_dtype_bytes is None else opt.param_dtype_bytes
        self.grad_b = acc.grad_bytes if opt.grad_dtype_bytes is None else opt.grad_dtype_bytes
        self.accounting = StaticAccounting(
            acc.name, self.param_b, self.grad_b,
            acc.master_bytes if opt.master_weight_bytes is None else opt.master_weight_bytes,
            acc.optimizer_bytes if opt.optimizer_state_bytes is None else opt.optimizer_state_bytes, acc.source)
        self.zero = effective_zero_stage(parallel)

    def layer(self, i: int, modules: frozenset[str], d: _Dims) -> dict[str, float]:
        blocks = layer_blocks(self.model, i)
        key = (tuple(b.kind for b in blocks), modules, d.imbalance)
        if key not in self._layer_cache:
            self._layer_cache[key] = _layer_terms(d, blocks, modules)
        return self._layer_cache[key]

    def stage_dims(self, stage: int) -> tuple[_Dims, _Dims]:
        """(dims for the stage's held activations, dims for its largest dispatch buffer): the
        call's, unless a skewed routing sizes a dropless run's experts: then the worst EP
        rank's load over the stage's MoE layers, and its worst single layer
        (:func:`workloads.blocks.moe.skewed_expert_load`)."""
        loads = None
        if self.routing is not None and not has_paged_stash(self.model):
            m = self.model
            layers = [(i, layer_blocks(m, i)) for c in self.placement[stage]
                      for i in list(c.layers) + [m.num_layers + k for k in range(c.mtp)]]
            loads = skewed_expert_load(m, self.parallel, self.routing, layers, self.num_microbatches, self.seed,
                                       int(self.d.tok_sp))
        if loads is None:
            return self.d, self.d
        return dataclasses.replace(self.d, imbalance=loads[0]), dataclasses.replace(self.d, imbalance=loads[1])

    # activations of one micro-batch in one chunk: (held terms, logits bytes, recompute working bytes)
    def chunk_activations(self, chunk: _Chunk, d: _Dims) -> tuple[dict[str, float], float, float]:
        m, par = self.model, self.parallel
        h = m.hidden_size
        layers = list(chunk.layers) + [m.num_layers + k for k in range(chunk.mtp)]
        held: dict[str, float] = {}
        working = 0.0
        if par.recompute == "full" and layers:
            inp = {"layer_input": d.tok_sp * h * d.e}
            none = frozenset()
            n_main = len(chunk.layers)
            if par.recompute_method == "uniform":
                n = par.recompute_num_layers or 1
                groups = [layers[i:i + n] for i in range(0, n_main, n)] + [[i] for i in layers[n_main:]]
                _add(held, inp, len(groups))
                working = max(sum(sum(self.layer(i, none, d).values()) for i in g) for g in groups)
            else:
                n = min(par.recompute_num_layers or n_main, n_main)
                _add(held, inp, n)
                for i in layers[n:]:
                    _add(held, self.layer(i, none, d))
                working = max((sum(self.layer(i, none, d).values()) for i in layers[:n]), default=0.0)
        else:
            # activation offload: the leading layers' saved tensors live in host memory
            # (workloads.offload; Megatron-Core allows it only with pp 1 and no recompute)
            for i in layers:
                if i >= par.offload_activation_layers or i >= m.num_layers:
                    terms = self.layer(i, self.modules, d)
                    if par.offload_modules and i < m.num_layers:
                        gone = offloaded_terms(terms, par.offload_modules)
                        terms = {k: v - gone.get(k, 0.0) for k, v in terms.items()}
                    _add(held, terms)
        sp_h = d.tok_sp * h
        if chunk.embedding:
            held["embedding"] = 8 * d.tok + (sp_h if m.dropout > 0 else 0.0)
        logits = 0.0
        heads = (1 if chunk.loss else 0) + chunk.mtp
        if heads:
            held["output_head"] = heads * (sp_h * d.e + sp_h * d.lb + d.tok_sp * 4 * _norm_elems(m))
            logits = heads * d.tok * d.vocab / d.t * self.opt.logits_bytes_per_element
        if chunk.mtp:
            held["mtp_extra"] = chunk.mtp * 4 * sp_h * d.e     # enorm / hnorm inputs and the eh_proj input
        return held, logits, working

    def params(self, chunks: list[_Chunk]) -> _Params:
        m, par, t = self.model, self.parallel, self.parallel.tp
        h, vocab_shard = m.hidden_size, self.d.vocab * m.hidden_size / t
        p = _Params()
        cache: dict[bool, tuple[float, float, float, float]] = {}
        embedding = any(c.embedding for c in chunks)
        loss = any(c.loss for c in chunks)
        for c in chunks:
            for i in c.layers:
                blocks = layer_blocks(m, i)
                key = tuple(b.kind for b in blocks)
                if key not in cache:
                    cache[key] = _layer_params(m, par, blocks)
                p.add(*cache[key])
            for _ in range(1 if (c.mtp and m.mtp_repeated_layer) else c.mtp):
                dense, expert, gemm, gemm_expert = _layer_params(m, par, layer_blocks(m, m.num_layers))
                proj = 2 * h * h / t
                p.add(dense + proj + 3 * _norm_elems(m) * h, expert, gemm + proj, gemm_expert)
        if embedding:
            pos = m.seq_len * h if m.position_embedding == "learned" else 0
            p.add(vocab_shard + pos)
        if loss:
            # untied, or tied on a rank without the embedding: Megatron's copy on the last stage
            output = vocab_shard if (not m.tied_embeddings or not embedding) else 0.0
            p.add(output + _norm_elems(m) * h)
        return p

    def estimate(self, stage: int, hbm_bytes: float | None) -> MemoryEstimate:
        m, par, opt = self.model, self.parallel, self.opt
        d, d_dispatch = self.stage_dims(stage)
        chunks = self.placement[stage]
        # static
        p = self.params(chunks)
        dense_dp, expert_dp = par.dp * par.cp, par.expert_dp
        dense_b = bytes_per_param(self.zero, dense_dp, self.accounting)
        expert_b = bytes_per_param(self.zero, expert_dp, self.accounting)
        static = {k: p.dense * dense_b[k] + p.expert * expert_b[k] for k in dense_b}
        # optimizer offload: the host holds that share of the master weights and moments
        for k in ("master_weights", "optimizer_states"):
            static[k] *= 1.0 - par.optimizer_offload_fraction
        # FP8 copies follow the weights' sharding (ZeRO-3 gathers them per layer)
        shard = (dense_dp, expert_dp) if self.zero >= 3 else (1, 1)
        fp8 = (p.gemm / shard[0] + p.gemm_expert / shard[1]) * opt.fp8_weight_copy_bytes_per_param
        # activations: the peak over the schedule of the held per-chunk sets
        per_chunk = [self.chunk_activations(c, d) for c in chunks]
        chunk_bytes = [sum(t.values()) + lg for t, lg, _ in per_chunk]
        vectors = self.held[stage]
        best = max(vectors, key=lambda v: sum(n * x for n, x in zip(v, chunk_bytes)), default=(0,) * len(chunks))
        activations: dict[str, float] = {}
        logits = 0.0
        for n, (terms, lg, _) in zip(best, per_chunk):
            _add(activations, terms, n)
            logits += n * lg
        working = max((w for _, _, w in per_chunk), default=0.0)
        if working:
            activations["recompute_working"] = working
        activations = {k: activations[k] for k in ACTIVATION_TERMS if activations.get(k)}
        # transient buffers
        layers = [i for c in chunks for i in c.layers] + [m.num_layers] * any(c.mtp for c in chunks)
        dispatch = max((b.dispatch_buffer_bytes(d_dispatch) for i in layers for b in layer_blocks(m, i)), default=0.0)
        held_params = p.dense + p.expert
        buckets = gather = 0.0
        if self.zero == 2:
            bucket = opt.dp_bucket_params if opt.dp_bucket_params is not None else max(40e6, 1e6 * dense_dp)
            buckets = 2 * min(bucket, held_params) * self.grad_b
        elif self.zero == 3:
            buckets = 2 * p.largest_unit * self.grad_b
            gather = 2 * p.largest_unit * self.param_b
        return MemoryEstimate(
            stage=stage, num_stages=par.pp, where=_stage_ranks(par, stage),
            num_layers=sum(len(c.layers) + c.mtp for c in chunks),
            num_params=held_params, num_expert_params=p.expert, zero_stage=self.zero,
            in_flight_microbatches=self.in_flight[stage],
            activation_bytes_per_microbatch=sum(sum(t.values()) for t, _, _ in per_chunk),
            weights_bytes=static["weights"], gradients_bytes=static["gradients"],
            master_weights_bytes=static["master_weights"], optimizer_states_bytes=static["optimizer_states"],
            fp8_weight_copies_bytes=fp8, activations=activations, logits_bytes=logits,
            moe_dispatch_bytes=dispatch, cp_buffers_bytes=cp_buffer_bytes(m, par, d.e), dp_buckets_bytes=buckets, param_gather_bytes=gather,
            reserve_bytes=float(opt.memory_reserve_bytes), hbm_bytes=hbm_bytes,
            moe_worst_rank_load=None if d is self.d else d.imbalance)


def cp_buffer_bytes(model: ModelSpec, parallel: ParallelConfig, activation_bytes: float = 2.0) -> float:
    """Transient buffers of the context-parallel exchange of one layer (one at a time), by
    ``parallel.cp_comm_type``, as Transformer Engine's ``context_parallel.py`` allocates them.

    With ``c`` the bytes of this rank's K and V (its ``s/cp`` tokens, its TP heads; MLA:
    the per-head K and V, not the latent):

    * ``p2p``: the backward's double buffer of K/V plus dK/dV (``p2p_comm_buffers``: two of
      ``[kv, dkv]``), ``4 c`` (the forward holds two K/V buffers, ``2 c``, less);
    * ``all_gather``: the gathered K/V of the whole sequence and, in the backward, the
      full-sequence dK/dV before its reduce-scatter, ``2 cp c``;
    * ``a2a``: send and receive buffers of Q, K and V, ``2 (q + c)``;
    * ``a2a+p2p``: the a2a buffers and the ring's, ``2 (q + c) + 4 c``.
    """
    if parallel.cp <= 1:
        return 0.0
    exchanged = next((dims for i in range(model.num_layers) for b in layer_blocks(model, i)
                      if (dims := b.cp_exchange_elements(parallel.tp)) is not None), None)
    if exchanged is None:
        return 0.0               # (a stack without attention layers exchanges no K/V)
    tok = (parallel.seq_len or model.seq_len) // parallel.cp * parallel.micro_batch_size
    kv, q = exchanged
    c, qb = tok * kv * activation_bytes, tok * q * activation_bytes
    kind = parallel.cp_comm_type
    if kind == "p2p":
        return 4 * c
    if kind == "all_gather":
        return 2 * parallel.cp * c
    if kind == "a2a":
        return 2 * (qb + c)
    return 2 * (qb + c) + 4 * c


def _prepare(model: ModelSpec, parallel: ParallelConfig, num_microbatches: int | None,
             gpu_hbm_bytes, options: MemoryOptions | None, knobs: dict, moe_routing=None, seed: int = 0):
    if not isinstance(model, ModelSpec):
        raise ConfigError("model", model, "expected a ModelSpec (workloads.load_model)")
    if not isinstance(parallel, ParallelConfig):
        raise ConfigError("parallel", parallel, "expected a ParallelConfig")
    if parallel.dp < 1:
        raise ConfigError("parallel.dp", parallel.dp, "resolve dp against the GPU count first (ParallelConfig.resolve)")
    parallel.check()
    parallel.check_model(model)
    opt = _options(options, knobs)
    m = parallel.num_microbatches if num_microbatches is None else num_microbatches
    hbm = getattr(gpu_hbm_bytes, "hbm_bytes", gpu_hbm_bytes)
    if hbm is not None and (isinstance(hbm, bool) or not isinstance(hbm, numbers.Real) or hbm <= 0):
        raise ConfigError("gpu_hbm_bytes", gpu_hbm_bytes, "must be a positive number of bytes or a GPUSpec")
    routing = None if moe_routing is None else parse_routing(moe_routing, "moe_routing")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ConfigError("seed", seed, "must be an integer >= 0")
    return _Model(model, parallel, opt, m, routing, int(seed)), (None if hbm is None else float(hbm))


def memory_estimates(model: ModelSpec, parallel: ParallelConfig, *, num_microbatches: int | None = None,
                     gpu_hbm_bytes=None, options: MemoryOptions | None = None, moe_routing=None, seed: int = 0,
                     **knobs) -> list[MemoryEstimate]:
    """:func:`memory_estimate` for every pipeline stage, in stage order."""
    calc, hbm = _prepare(model, parallel, num_microbatches, gpu_hbm_bytes, options, knobs, moe_routing, seed)
    return [calc.estimate(s, hbm) for s in range(parallel.pp)]


def memory_estimate(model: ModelSpec, parallel: ParallelConfig, *, stage: int | None = None,
                    num_microbatches: int | None = None, gpu_hbm_bytes=None,
                    options: MemoryOptions | None = None, moe_routing=None, seed: int = 0,
                    **knobs) -> MemoryEstimate:
    """Peak memory of one rank of a pipeline stage, by term.

    Parameters
    ----------
    model : ModelSpec
    parallel : ParallelConfig
        Resolved (``dp >= 1``); its degrees, ZeRO stage, distributed optimizer, sequence
        parallelism, recomputation, schedule, ``vpp``, micro-batch size and sequence length
        are used.
    stage : int, optional
        Pipeline stage; None: the stage with the largest total.
    num_microbatches : int, optional
        Micro-batches per step for the schedule; None: ``parallel.num_microbatches``.
    gpu_hbm_bytes : float or GPUSpec, optional
        Device memory the verdict compares with (kept on the result).
    options : MemoryOptions, optional
        Precision and implementation inputs; its fields may also be passed as keywords
        (``fp8_weight_copy_bytes_per_param=2``, ``accounting="zero_paper"``,
        ``memory_reserve_bytes=0``, ...).
    moe_routing, seed : optional
        The run's routing (:func:`workloads.moe_routing.parse_routing`) and seed.  A skewed
        one (``skew``, ``zipf``, a trace) on a dropless MoE model sizes the expert rows by
        the worst EP rank's load (``moe_token_imbalance`` per stage: the rank's tokens summed
        over the stage's MoE layers, in its worst micro-batch, over the balanced sum; the
        dispatch buffer by the worst single layer).  None, ``balanced`` or
        ``forced_balanced``: the balanced estimate.  An explicit ``moe_token_imbalance``
        or a capacity factor wins.

    Returns
    -------
    MemoryEstimate
        Never raises for an out-of-memory configuration: see :meth:`MemoryEstimate.fits`,
        :meth:`~MemoryEstimate.verdict` and :meth:`~MemoryEstimate.check_fits`.

    Raises
    ------
    ConfigError
        The model and the parallel layout do not go together (heads, experts, layer split,
        schedule and micro-batches), or an option is out of range.
    """
    calc, hbm = _prepare(model, parallel, num_microbatches, gpu_hbm_bytes, options, knobs, moe_routing, seed)
    if stage is None:
        return max((calc.estimate(s, hbm) for s in range(parallel.pp)), key=lambda e: e.total_bytes)
    if isinstance(stage, bool) or not isinstance(stage, numbers.Integral) or not 0 <= stage < parallel.pp:
        raise ConfigError("stage", stage, f"must be a pipeline stage in 0..{parallel.pp - 1}")
    return calc.estimate(int(stage), hbm)
