"""Data-parallel lowering: gradient buckets, the distributed optimizer's parameter gathers,
ZeRO-3 / FSDP per-layer gathers, the step's end (tied-embedding and grad-norm reductions,
the optimizer)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from ...blocks.base import norm_params
from ...blocks.kernels import ew
from ...costs import optimizer_ops
from ...offload import optimizer_offload_s
from ...ops import Coll, Group, OpName, Phase, Stream
from ...parallel import ParallelConfig
from ...schedules import model_chunk

from .context import _Ctx, _DTYPE_BYTES, _Emitter, _Stage, _host_of, gpu_of




_GRAD_BUCKET = {"dense": OpName.GRAD_DENSE, "expert": OpName.GRAD_EXPERT}
_PARAM_GATHER = {"dense": OpName.PARAM_GATHER_DENSE, "expert": OpName.PARAM_GATHER_EXPERT}

# PyTorch FSDP2's copies around its collectives (pytorch/pytorch
# torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py at 010ae4a8, the layout since 2.4),
# with BF16 parameters over an FP32 shard (MixedPrecisionPolicy(param_dtype=bfloat16)):
# * copy-in, on the all-gather copy-in stream before each all-gather: _get_param_all_gather_inputs
#   foreach-copies the FP32 shard into a flat BF16 buffer (the cast: read 4 B, write 2 B), then
#   all_gather_copy_in foreach-copies it into this rank's slice of the all-gather buffer
#   (read 2 B, write 2 B): 10 bytes and 2 kernels per shard element;
FSDP2_COPY_IN_BYTES = 6.0 + 4.0
# * copy-out, on the compute stream once the gather is waited for (foreach_all_gather_copy_out:
#   split_with_sizes_copy of the gathered buffer into each parameter): read and write 2 B,
#   4 bytes and 1 kernel per gathered element;
FSDP2_COPY_OUT_BYTES = 4.0
# * the reduce-scatter's copy-in, on the compute stream before each reduce-scatter
#   (foreach_reduce -> foreach_reduce_scatter_copy_in, torch._chunk_cat widening the BF16
#   gradients to reduce_dtype as it copies): read 2 B, write the reduce dtype's bytes, 1 kernel
#   per unsharded gradient element.
FSDP2_GRAD_READ_BYTES = 2.0



def _grads_sharded(par: ParallelConfig) -> bool:
    """ZeRO-2 / ZeRO-3 (Megatron-FSDP's ``optim_grads`` and ``optim_grads_params``): a rank
    keeps only its shard of the gradients, so every micro-batch's gradients are
    reduce-scattered as its backward produces them (Megatron-FSDP's post-backward hook per
    micro-batch; DeepSpeed ZeRO-2 likewise) instead of once per step."""
    return par.zero_stage >= 2 and par.dp * par.cp > 1



def _fsdp_gather_layer(ctx, em, layer, mb, chunk, phase) -> None:
    """ZeRO-3 / FSDP: gather layer ``layer``'s parameters before its forward or backward --
    the dense ones over dp x cp, the routed experts' over the expert data-parallel group --
    in FP8 where the recipe keeps FP8 parameters (``precision_options.fp8_param_gather``)
    on a layer whose GEMMs run in low precision, else in BF16."""
    par = ctx.par
    if par.zero_stage != 3:
        return
    name = OpName.FSDP_GATHER if phase == Phase.F else OpName.FSDP_GATHER_BWD
    d, e = _local_params(ctx, [layer])
    nbytes = ctx.recipe.param_gather_bytes_per_param if ctx.recipe.is_low_precision_layer(
        layer, ctx.model.num_layers) else 2.0
    if par.dp * par.cp > 1 and d > 0:
        em.coll(Stream.DP, Coll.ALL_GATHER, Group.DP_CP, d * nbytes, name, layer, mb, chunk, phase)
    if par.expert_dp > 1 and e > 0:
        em.coll(Stream.DP, Coll.ALL_GATHER, Group.EDP, e * nbytes, name, layer, mb, chunk, phase)
    if nbytes == 2.0:
        _fsdp2_gather_copies(ctx, em, d if par.dp * par.cp > 1 else 0, e if par.expert_dp > 1 else 0,
                             layer, mb, chunk, phase)



def _fsdp_gather_edge(ctx, em, params, layer, mb, chunk, phase) -> None:
    """ZeRO-3 / FSDP: the embedding or the output layer is a sharded module too, gathered
    (BF16) before its forward and backward like a decoder layer."""
    par = ctx.par
    if par.zero_stage == 3 and par.dp * par.cp > 1 and params > 0:
        name = OpName.FSDP_GATHER if phase == Phase.F else OpName.FSDP_GATHER_BWD
        em.coll(Stream.DP, Coll.ALL_GATHER, Group.DP_CP, params * 2.0, name, layer, mb, chunk, phase)
        _fsdp2_gather_copies(ctx, em, params, 0, layer, mb, chunk, phase)



def _fsdp2_gather_copies(ctx, em, dense, expert, layer, mb, chunk, phase) -> None:
    """FSDP2 (a stack with ``Fusion.fsdp2_copies``): the copy-in of the ``dense`` and
    ``expert`` parameters' shards and the copy-out of the gathered ones, after the gather in
    program order (so the gather is still prefetched ahead of the preceding compute).  The
    copy-in runs on FSDP2's copy-in stream beside the preceding layer's kernels; the engine
    runs compute kernels on one stream, so its HBM time is charged there with the copy-out's
    (at most 10 / (4 x shards) of the copy-out's time: 31 % at 8 shards)."""
    par = ctx.par
    if not ctx.fusion.fsdp2_copies or dense + expert <= 0:
        return
    shard = dense / max(par.dp * par.cp, 1) + expert / max(par.expert_dp, 1)
    ops = [ew("fsdp2_copy_in", str(phase), layer, FSDP2_COPY_IN_BYTES * shard, 2),
           ew("fsdp2_copy_out", str(phase), layer, FSDP2_COPY_OUT_BYTES * (dense + expert), 1)]
    em.compute(OpName.FSDP_COPY, layer, mb, chunk, phase, 0.0, float(np.sum(ctx.compute.op_times_s(ops))),
               *_host_of(ctx, ops))



def _local_params(ctx, layers) -> tuple[int, int]:
    """(dense, expert) parameters of ``layers`` held by one rank (TP / EP sharded)."""
    key = tuple(layers)
    hit = ctx.param_cache.get(key)
    if hit is None:
        hit = ctx.param_cache[key] = _count_local_params(ctx, key)
    return hit



def _count_local_params(ctx, layers) -> tuple[int, int]:
    m, par = ctx.model, ctx.par
    dense = expert = 0
    for i in layers:
        if i >= m.num_layers:
            if m.mtp_repeated_layer and i > m.num_layers:
                continue                # one module's parameters, run mtp_layers times
            h = m.hidden_size
            dense += 3 * norm_params(m, h) + 2 * h * h / par.tp     # enorm, hnorm, final norm; eh_proj over TP
        br = m.layer_param_breakdown(i)
        for name, n in br.items():
            if name.startswith("expert") or name.startswith("routed"):
                expert += n / (par.ep * par.expert_tp)
            elif "norm" in name or name.startswith("router") or name == "latent_proj":
                dense += n
            else:
                dense += n / par.tp
    return int(dense), int(expert)



def _embedding_params(ctx) -> int:
    """Input embedding (and learned positions) parameters of one first-stage rank."""
    br = _breakdown(ctx)
    return int((br["embedding"] + br["position_embedding"]) / ctx.par.tp)



def _breakdown(ctx) -> dict:
    """The model's :meth:`~workloads.model.ModelSpec.param_breakdown`, worked out once per
    program (the edges' gathers ask for it every micro-batch)."""
    hit = ctx.param_cache.get(("param_breakdown",))
    if hit is None:
        hit = ctx.param_cache[("param_breakdown",)] = ctx.model.param_breakdown()
    return hit



def _output_params(ctx) -> int:
    """Output layer + final norm parameters of one last-stage rank (its own copy when tied)."""
    m, br = ctx.model, _breakdown(ctx)
    out = br["output_layer"]
    if m.tied_embeddings and len(ctx.chunk_layers) > 1:
        out = br["embedding"]
    return int(out / ctx.par.tp + m.hidden_size)



def _edge_params(ctx, k: int) -> int:
    """Embedding (model chunk 0) and output-layer + final-norm (last chunk) parameters of one rank."""
    return (_embedding_params(ctx) if k == 0 else 0) + \
        (_output_params(ctx) if k == len(ctx.chunk_layers) - 1 else 0)



class _GradBuckets:
    """Gradient buckets of one stage: parameters accumulate in backward order during the
    last micro-batch (ZeRO-2/3: during every micro-batch, :func:`_grads_sharded`), and a bucket of ``max(40M, 1M x dp x cp)`` parameters is reduced over
    its data-parallel group (dense: dp x cp, experts: edp) once full.  Without
    ``grad_reduce`` overlap the reductions wait for the stage's schedule to finish
    (Megatron's ``finalize_model_grads`` after ``forward_backward_func``): :meth:`issue_deferred`."""

    def __init__(self, ctx: _Ctx, em: _Emitter):
        par = ctx.par
        self.ctx, self.em = ctx, em
        self.bucket_params = max(40_000_000, 1_000_000 * par.dp * par.cp)
        self.grad_bytes = _DTYPE_BYTES.get(ctx.recipe.grad_reduce_dtype, 4.0)
        self.coll = Coll.REDUCE_SCATTER if (par.distributed_optimizer or par.zero_stage >= 1) else Coll.ALL_REDUCE
        self.degree = {"dense": par.dp * par.cp, "expert": par.expert_dp}
        self.pending = {"dense": 0, "expert": 0}
        self.deferred: list[tuple] = []

    def flush(self, kind: str, chunk: int) -> None:
        n = self.pending[kind]
        if n <= 0:
            return
        if self.degree[kind] > 1:
            group = Group.DP_CP if kind == "dense" else Group.EDP
            args = (Stream.DP, self.coll, group, n * self.grad_bytes, _GRAD_BUCKET[kind])
            if self.ctx.grad_overlap or _grads_sharded(self.ctx.par):
                self.em.coll(*args, chunk=chunk, phase=Phase.W)
            else:
                self.deferred.append((args, chunk))
        self.pending[kind] = 0

    def flush_all(self, chunk: int) -> None:
        self.flush("dense", chunk)
        self.flush("expert", chunk)

    def ready(self, layers, chunk: int, extra: int = 0) -> None:
        """The gradients of ``layers`` (and ``extra`` dense parameters) are complete."""
        d, e = _local_params(self.ctx, layers)
        d += extra
        self._fsdp2_grad_copy_in(d, e, layers[0] if len(layers) else -1, chunk)
        for kind, n in (("dense", d), ("expert", e)):
            self.pending[kind] += n
            if self.pending[kind] >= self.bucket_params:
                self.flush(kind, chunk)

    def _fsdp2_grad_copy_in(self, dense: int, expert: int, layer: int, chunk: int) -> None:
        """FSDP2 under ZeRO-3: each layer's gradients copied (and widened to the reduce dtype)
        into the reduce-scatter input on the compute stream (``FSDP2_GRAD_READ_BYTES``)."""
        ctx, par = self.ctx, self.ctx.par
        n = (dense if self.degree["dense"] > 1 else 0) + (expert if self.degree["expert"] > 1 else 0)
        if not ctx.fusion.fsdp2_copies or par.zero_stage != 3 or n <= 0:
            return
        ops = [ew("fsdp2_grad_copy_in", "W", layer, (FSDP2_GRAD_READ_BYTES + self.grad_bytes) * n, 1)]
        self.em.compute(OpName.FSDP_GRAD_COPY, layer, -1, chunk, Phase.W, 0.0,
                        float(np.sum(ctx.compute.op_times_s(ops))), *_host_of(ctx, ops))

    def issue_deferred(self) -> None:
        for args, chunk in self.deferred:
            self.em.coll(*args, chunk=chunk, phase=Phase.W)



def _step_end(ctx: _Ctx, em: _Emitter, st: _Stage) -> None:
    """Tied-embedding gradients, the gradient norm, the optimizer step and (distributed
    optimizer) the parameter all-gathers of the next step."""
    par, model, sched = ctx.par, ctx.model, ctx.sched
    # DualPipe's rank s holds model chunks s and pp - 1 - s: the embedding (chunk 0) and the
    # output layer (chunk pp - 1) both sit on the two edge ranks; a middle rank holds neither,
    # so it has no tied-embedding gradient to all-reduce
    at_edge = st.index in (0, par.pp - 1)
    first_stage = st.index == 0 or (sched.layout == "bidirectional" and at_edge)
    last_stage = st.index == par.pp - 1 or (sched.layout == "bidirectional" and at_edge)
    # ZB-V's V puts the embedding and the output layer both on stage 0: a tied embedding's
    # two copies are one, and nothing is all-reduced between stages
    if model.tied_embeddings and par.pp > 1 and (first_stage or last_stage) and sched.layout != "v":
        emb = model.vocab_size * model.hidden_size / par.tp * st.buckets.grad_bytes
        em.coll(Stream.DP, Coll.ALL_REDUCE, Group.EMBEDDING, emb, OpName.TIED_EMBEDDING_GRAD, phase=Phase.S)
    em.coll(Stream.DP, Coll.ALL_REDUCE, Group.WORLD, 8.0, OpName.GRAD_NORM, phase=Phase.S)
    d, e = _local_params(ctx, [i for r in st.layers for i in r])
    edge = sum(_edge_params(ctx, model_chunk(sched, st.index, c)) for c in range(sched.num_chunks))
    d += edge
    shard = d / max(par.dp * par.cp, 1) + e / max(par.expert_dp, 1) if par.distributed_optimizer else d + e
    _optimizer_step(ctx, em, shard)
    if par.distributed_optimizer and par.zero_stage < 3:
        _param_gathers(ctx, em, [i for r in st.layers for i in r], float(edge), st.buckets.bucket_params)



def _optimizer_step(ctx: _Ctx, em: _Emitter, shard: float) -> None:
    """The optimizer step over a rank's ``shard`` of parameters: the stack's optimizer kernels,
    plus the host's share of an offloaded fraction (gradients out, CPU Adam, parameters back:
    workloads.offload)."""
    par = ctx.par
    f = par.optimizer_offload_fraction
    opt = optimizer_ops(int(shard * (1.0 - f)) if f else int(shard), ctx.fusion.optimizer)
    step_s = float(np.sum(ctx.compute.op_times_s(opt)))
    if f:
        step_s += optimizer_offload_s(shard, f, gpu_of(ctx), par.overlap_optimizer_copies)
    em.compute(OpName.OPTIMIZER, -1, -1, 0, Phase.S, 0.0, step_s, *_host_of(ctx, opt))


def _param_gathers(ctx: _Ctx, em: _Emitter, order: list[int], edge_params: float, bucket_params: int) -> None:
    """The distributed optimizer's parameter all-gathers, buckets in forward order (the
    first layers' parameters are gathered first).  Each op's tag is the (first, last) layer
    whose parameters it carries, so the engine can hold a layer's forward until its bucket
    has arrived; the embedding and output layer go with the first dense bucket."""
    par = ctx.par
    for kind, group, deg in (("dense", Group.DP_CP, par.dp * par.cp), ("expert", Group.EDP, par.expert_dp)):
        if deg <= 1:
            continue
        acc = edge_params if kind == "dense" else 0.0
        first = None
        for pos, layer in enumerate(order):
            dl, el = _local_params(ctx, [layer])
            acc += dl if kind == "dense" else el
            first = layer if first is None else first
            if acc >= bucket_params or pos == len(order) - 1:
                if acc > 0:
                    em.coll(Stream.DP, Coll.ALL_GATHER, group, acc * ctx.recipe.param_gather_bytes_per_param,
                            _PARAM_GATHER[kind], phase=Phase.S, tag=(first, layer))
                acc, first = 0.0, None



class DataParallelRules(NamedTuple):
    """How a stack runs data parallelism inside the shared stage program (:mod:`.pipeline`):
    the gradient buckets of a stage, the per-layer and edge (embedding, output layer)
    parameter gathers before a forward or backward, and the step's end.  Megatron-Core's are
    :data:`MEGATRON_DP`; another stack puts its own on the build context (``_Ctx.dp_rules``)."""

    buckets: Callable         #: (ctx, em) -> a gradient-bucket object (ready, flush_all, issue_deferred, bucket_params, grad_bytes)
    gather_layer: Callable    #: (ctx, em, layer, mb, chunk, phase) -> None
    gather_edge: Callable     #: (ctx, em, params, layer, mb, chunk, phase) -> None
    step_end: Callable        #: (ctx, em, stage) -> None


MEGATRON_DP = DataParallelRules(_GradBuckets, _fsdp_gather_layer, _fsdp_gather_edge, _step_end)


def dp_rules(ctx) -> DataParallelRules:
    """The data-parallel rules of the stack building ``ctx`` (Megatron-Core's unless set)."""
    return ctx.dp_rules or MEGATRON_DP
