"""DeepSpeed ZeRO's data parallelism inside the shared stage program: the gradient buckets,
ZeRO-3's per-layer parameter gathers and the step's end (see the package docstring for the
rules and their sources)."""

from __future__ import annotations

import math


from ...blocks import layer_blocks
from ...ops import Coll, Group, Issue, OpName, Phase, Stream
from ..megatron_te.context import _Ctx, _Emitter, _Stage
from ..megatron_te.data_parallel import (DataParallelRules, _edge_params, _local_params, _optimizer_step,
                                         _output_params)
from .options import DeepSpeedOptions

__all__ = ["DEEPSPEED_DP", "gathered_params", "options_of"]

#: ZeRO-0's reduction bucket: ``DeepSpeedEngine.allreduce_gradients``' default
#: ``MEMORY_OPT_ALLREDUCE_SIZE`` (deepspeed/runtime/engine.py@v0.16.4), not reduce_bucket_size.
ZERO0_BUCKET = 500_000_000


def options_of(ctx: _Ctx) -> DeepSpeedOptions:
    """The DeepSpeed options the program is built with (DeepSpeed's defaults unless given)."""
    opts = ctx.stack_options
    return opts if isinstance(opts, DeepSpeedOptions) else DeepSpeedOptions()


def _issue(em: _Emitter, mode: Issue) -> None:
    """Set the issue mode of the op just emitted (the stack decides it, not the overlap switches)."""
    if mode is not Issue.BLOCKING:
        em.ops[-1] = em.ops[-1]._replace(issue=mode)


class _DeepSpeedBuckets:
    """DeepSpeed's gradient buckets of one rank.

    Gradients join the bucket in backward order as their hooks fire; a bucket is reduced
    before a gradient that would overflow it joins (``reduce_independent_p_g_buckets_and_remove_grads``,
    stage_1_and_2.py and stage3.py @v0.16.4).  Clustersim adds a layer's (or the edge
    modules') gradients at once.  What is reduced, and when:

    * ZeRO-0: ``buffered_allreduce_fallback`` after the backward, all-reduces of 5e8 elements
      (:data:`ZERO0_BUCKET`), on the compute stream;
    * ZeRO-1/2: all-reduce of each bucket -- ``average_tensor`` with ``reduce_scatter`` on goes
      through ``allreduce_and_scatter`` -> ``allreduce_bucket`` -> ``dist.all_reduce``
      (``use_multi_rank_bucket_allreduce`` default True), every rank keeping its slice;
      stage 1 only at the accumulation boundary, stage 2 every micro-batch
      (``reduce_ready_partitions_and_remove_grads``); without ``overlap_comm`` stage 1 reduces
      after the backward (``reduce_gradients``: no hooks unless ``partition_gradients or
      overlap_comm``) and stage 2 from its hooks on the compute stream (blocking), with it on
      the ``reduction_stream``;
    * ZeRO-3: ``reduce_scatter_coalesced`` (stage3.py ``__avg_scatter_grads``) every
      micro-batch, on the ``reduce_and_partition_stream`` with ``overlap_comm``, else the
      default stream.

    All in ``communication_data_type`` (default the training dtype: 2 bytes under BF16)."""

    def __init__(self, ctx: _Ctx, em: _Emitter):
        par, opts = ctx.par, options_of(ctx)
        self.ctx, self.em, self.stage = ctx, em, par.zero_stage
        self.overlap = opts.overlap(par.zero_stage)
        self.bucket_params = ZERO0_BUCKET if par.zero_stage == 0 else opts.reduce_bucket_size
        self.grad_bytes = opts.grad_bytes
        self.coll = Coll.REDUCE_SCATTER if par.zero_stage == 3 else Coll.ALL_REDUCE
        # after the backward: ZeRO-0 always, ZeRO-1 without overlap_comm (no hooks)
        self.after_backward = par.zero_stage == 0 or (par.zero_stage == 1 and not self.overlap)
        self.pending = 0
        self.deferred: list[tuple[float, int]] = []

    def flush(self, chunk: int) -> None:
        n, self.pending = self.pending, 0
        if n <= 0 or self.ctx.par.dp <= 1:
            return
        if self.after_backward:
            self.deferred.append((n, chunk))
            return
        self.em.coll(Stream.DP, self.coll, Group.DP_CP, n * self.grad_bytes, OpName.GRAD_DENSE, chunk=chunk,
                     phase=Phase.W)
        _issue(self.em, Issue.DP_STREAM if self.overlap else Issue.BLOCKING)

    def flush_all(self, chunk: int) -> None:
        self.flush(chunk)

    def ready(self, layers, chunk: int, extra: int = 0) -> None:
        n = _local_params(self.ctx, layers)[0] + extra
        if self.pending and self.pending + n > self.bucket_params:
            self.flush(chunk)
        self.pending += n

    def issue_deferred(self) -> None:
        for n, chunk in self.deferred:
            self.em.coll(Stream.DP, self.coll, Group.DP_CP, n * self.grad_bytes, OpName.GRAD_DENSE, chunk=chunk,
                         phase=Phase.W)


def _tensors(ctx: _Ctx, layer: int) -> list[int]:
    """Decoder layer ``layer``'s parameter tensors as clustersim sees them: each pre-norm one
    tensor, every other component (attention, MLP, mixer) one tensor of its whole size."""
    m = ctx.model
    br = m.layer_param_breakdown(layer)
    norms = len(layer_blocks(m, layer))
    out = [br["norms"] // norms] * norms if br["norms"] else []
    return out + [n for name, n in br.items() if name != "norms" and n > 0]


def gathered_params(ctx: _Ctx, layer: int) -> int:
    """Parameters of ``layer`` ZeRO-3 gathers: its tensors above
    ``stage3_param_persistence_threshold`` (smaller ones are kept whole on every rank:
    ``ds_persist``, deepspeed/runtime/zero/partition_parameters.py@v0.16.4 and
    parameter_offload.py ``mark_persistent_parameters``)."""
    key = ("ds_gathered", layer)
    hit = ctx.param_cache.get(key)
    if hit is None:
        limit = options_of(ctx).stage3_param_persistence_threshold
        hit = ctx.param_cache[key] = sum(n for n in _tensors(ctx, layer) if n > limit)
    return hit


def _reused(ctx: _Ctx, layer: int) -> bool:
    """Whether ``layer``'s parameters stay gathered from its forward into its backward
    (``layer == -1``: the output layer).  The coordinator keeps a module's parameters when
    they recur within ``stage3_max_reuse_distance`` elements of the module trace
    (``__params_to_release``, partitioned_param_coordinator.py@v0.16.4); between a layer's
    forward and its backward lie the later layers and the output layer, each twice."""
    key = ("ds_reused", layer)
    hit = ctx.param_cache.get(key)
    if hit is None:
        between = 0 if layer == -1 else 2 * (_output_params(ctx) + sum(
            _local_params(ctx, [i])[0] for i in range(layer + 1, ctx.model.num_layers)))
        hit = ctx.param_cache[key] = between < options_of(ctx).stage3_max_reuse_distance
    return hit


def _gather(ctx: _Ctx, em: _Emitter, params: int, layer: int, mb: int, chunk: int, phase: str) -> None:
    """All-gathers of ``params`` elements (BF16) before a forward or backward: with prefetch,
    in calls of about ``stage3_prefetch_bucket_size`` issued ahead on the all-gather stream
    (``fetch_sub_module``: the next parameters of the trace, up to ``min(max_live -
    available, prefetch_bucket_size)`` elements per call); without (prefetch bucket 0, or a
    layer larger than ``stage3_max_live_parameters``), one call per parameter tensor,
    waited for at once (the persistent ones have none)."""
    if params <= 0 or ctx.par.dp <= 1:
        return
    opts = options_of(ctx)
    prefetch = opts.stage3_prefetch_bucket_size > 0 and params < opts.stage3_max_live_parameters
    limit = opts.stage3_param_persistence_threshold
    calls = math.ceil(params / opts.stage3_prefetch_bucket_size) if prefetch else \
        max(1, sum(n > limit for n in _tensors(ctx, layer)) if layer >= 0 else 1)
    name = OpName.FSDP_GATHER if phase == Phase.F else OpName.FSDP_GATHER_BWD
    for _ in range(calls):
        em.coll(Stream.DP, Coll.ALL_GATHER, Group.DP_CP, params / calls * 2.0, name, layer, mb, chunk, phase)
        _issue(em, Issue.PREFETCH if prefetch else Issue.BLOCKING)


def _gather_layer(ctx: _Ctx, em: _Emitter, layer: int, mb: int, chunk: int, phase: str) -> None:
    """ZeRO-3: gather ``layer``'s partitioned parameters before its forward, and before its
    backward unless they were kept (:func:`_reused`)."""
    if ctx.par.zero_stage != 3 or (phase != Phase.F and _reused(ctx, layer)):
        return
    _gather(ctx, em, gathered_params(ctx, layer), layer, mb, chunk, phase)


def _gather_edge(ctx: _Ctx, em: _Emitter, params: int, layer: int, mb: int, chunk: int, phase: str) -> None:
    """ZeRO-3: the embedding, or the output layer with the final norm (which, under the
    persistence threshold, stays whole), gathered like a layer; the output layer's
    parameters are kept into the backward that follows at once."""
    if ctx.par.zero_stage != 3:
        return
    is_output = params == _output_params(ctx)       # (the embedding has no final norm: the two differ)
    if is_output:
        if phase != Phase.F and _reused(ctx, -1):
            return
        if ctx.model.hidden_size <= options_of(ctx).stage3_param_persistence_threshold:
            params -= ctx.model.hidden_size
    _gather(ctx, em, params, -1, mb, chunk, phase)


def _step_end(ctx: _Ctx, em: _Emitter, st: _Stage) -> None:
    """The gradient norm, the optimizer step over the rank's shard (ZeRO >= 1: 1/dp of the
    parameters) and, at ZeRO-1/2, the all-gather of the updated BF16 parameters inside
    ``step()`` (stage_1_and_2.py@v0.16.4 ``step`` -> ``all_gather_dp_groups``: one
    ``all_gather_into_tensor`` per parameter group, on the compute stream, before the next
    forward can start)."""
    par = ctx.par
    em.coll(Stream.DP, Coll.ALL_REDUCE, Group.WORLD, 8.0, OpName.GRAD_NORM, phase=Phase.S)
    d = _local_params(ctx, [i for r in st.layers for i in r])[0] + _edge_params(ctx, 0)     # pp = 1: one chunk
    shard = d / par.dp if par.zero_stage >= 1 else d
    _optimizer_step(ctx, em, shard)
    if par.zero_stage in (1, 2) and par.dp > 1:
        em.coll(Stream.DP, Coll.ALL_GATHER, Group.DP_CP, d * 2.0, OpName.PARAM_GATHER_DENSE, phase=Phase.S)


DEEPSPEED_DP = DataParallelRules(_DeepSpeedBuckets, _gather_layer, _gather_edge, _step_end)
