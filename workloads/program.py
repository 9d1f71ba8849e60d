"""Programs: the exact work of one training step, per class of identical ranks.

``build_program(model, parallel, gpu, ...)`` turns a validated configuration into a
:class:`Program`: rank classes (ranks whose op sequences are identical -- same stage,
layers, schedule and sizes -- differing only in which groups they talk to), each with one
ordered op list, plus the groups, the model FLOPs per step and the memory per stage.

The op list of a class is its program order across streams:

* ``compute`` ops: per schedule action and layer, the layer's ops between two
  communication points fused into one segment (attention block, MLP / expert block),
  with FLOPs and a duration from the compute model; recomputation ahead of the backward;
  embedding, output layer and loss on the first / last stage; the optimizer step.
* collectives, each with its group kind (a row of :data:`workloads.mesh.GROUP_AXES`, or
  ``embedding`` / ``world``), its collective kind, size in bytes (nccl-tests convention,
  as :meth:`simulator.collectives.CollectiveEngine.issue` takes it) and a per-group-kind
  sequence number (Megatron + Transformer Engine placement):

  ====================  ================================================================
  tensor parallel       no SP: all-reduce after attention and after the MLP, forward and
                        backward.  SP: all-gather before and reduce-scatter after each
                        block forward; backward 4 all-gathers (output gradients of the two
                        row-parallel layers, inputs re-gathered for the two column-parallel
                        wgrads) and 2 reduce-scatters per layer.  Recomputed forwards repeat
                        their collectives.
  context parallel      by ``parallel.cp_comm_type`` (:func:`_cp_attention`): ``p2p`` a
                        ring of K/V hops, one before each core-attention block but the
                        last (backward: K/V and dK/dV hops); ``all_gather`` a K/V
                        all-gather (backward: again, and a dK/dV reduce-scatter); ``a2a``
                        all-to-alls of Q/K/V before and the output after (backward: dO,
                        then dQ/dK/dV); ``a2a+p2p`` both.
  expert parallel       all-to-all dispatch and combine around the experts, forward and
                        backward, sizes from the MoE routing (``Program.a2a_sizes``).
  pipeline              send/recv of activations (forward) and gradients (backward) with a
                        tag (source stage, destination stage, chunk, micro-batch, phase).
  data parallel         gradient buckets of ``max(40M, 1M x dp x cp)`` parameters in
                        ``grad_reduce_dtype``, reduce-scattered (distributed optimizer) or
                        all-reduced over dp x cp (dense) / edp (experts), emitted as the last
                        micro-batch's backward of each chunk completes them (without
                        ``grad_reduce`` overlap: all of them after the stage's last
                        action, as Megatron's ``finalize_model_grads``); after the
                        optimizer step the distributed optimizer all-gathers parameters by
                        bucket; ZeRO-3 gathers each layer's parameters (dense over dp x cp,
                        experts over edp; FP8 with ``fp8_param_gather``), the embedding and
                        the output layer before their forward and backward; ZeRO-2/3
                        reduce-scatter every micro-batch's gradients.
  step end              tied-embedding gradient all-reduce (first and last stage),
                        grad-norm all-reduce over all ranks, optimizer step.
  ====================  ================================================================

Every op also carries the host time to issue it (``Op.host_s``: per kernel for compute, per
call for collectives and per batch of pipeline transfers; ``build_program(host=...)``),
which the engine's host cursor uses.

Which ops overlap which is the engine's business (docs/design.md, "Streams and overlap"): the program only
orders them.  Per-rank views are built on demand (:meth:`Program.rank_ops`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple
import numpy as np

from topologies import ConfigError, GPUSpec

from .costs import RooflineComputeModel, embedding_ops, get_recipe, layer_ops, model_flops_per_step, \
    optimizer_ops, output_ops
from .costs.compute import LAUNCH_OVERHEAD_S, HostCosts, host_costs
from .blocks import layer_blocks
from .costs.precision import weight_quantize_op, with_quantize_ops
from .mesh import RankGrid
from .model import ModelSpec
from .moe_routing import (_trace_has_sources, apply_rank_budget, apply_source_capacity, dispatch_matrix, expert_load,
                          parse_routing, source_dispatch_matrix, source_loads)
from .ops import Coll, Group, Op, OpKind, OpName, Phase, Stream, is_p2p
from .parallel import ParallelConfig, split_layers
from .schedules import ActionKind, get_schedule, model_chunk, route
from .schedules.actions import COMM_KINDS
from .schedules.comm import p2p_order

__all__ = ["Op", "RankClass", "Program", "build_program"]

_DTYPE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0}
_RECOMPUTE_PARTS = (("attn", OpName.RECOMPUTE_ATTN), ("mlp", OpName.RECOMPUTE_MLP), ("pre", OpName.RECOMPUTE_PRE),
                    ("post", OpName.RECOMPUTE_POST))
"""Selective recompute: the segment of each part recomputed ahead of the backward, and its op."""
_GRAD_BUCKET = {"dense": OpName.GRAD_DENSE, "expert": OpName.GRAD_EXPERT}
_PARAM_GATHER = {"dense": OpName.PARAM_GATHER_DENSE, "expert": OpName.PARAM_GATHER_EXPERT}


@dataclass
class RankClass:
    """Ranks with identical programs: ``members`` (global ranks) and their ``ops``."""

    class_id: int
    stage: int
    members: tuple[int, ...]
    ops: list[Op]

    @property
    def size(self) -> int:
        return len(self.members)


@dataclass
class Program:
    """The classes, groups and totals of one training step."""

    model: ModelSpec
    parallel: ParallelConfig
    schedule: object
    grid: RankGrid
    classes: list[RankClass]
    class_of_rank: np.ndarray
    model_flops_per_step: float
    a2a_sizes: dict = field(default_factory=dict)
    memory: list | None = None
    moe_drops: dict | None = None
    """With token dropping (``moe.capacity_factor`` or HybridEP's rank budget): ``routed`` and
    ``dropped`` token-expert assignments of one EP group over the step's MoE layers and
    micro-batches (every EP group sees the same sampled routing), and ``fraction``."""
    _groups: dict | None = None
    _gindex: dict | None = None

    @property
    def num_ops(self) -> int:
        return sum(len(c.ops) for c in self.classes)

    @property
    def async_sends(self) -> bool:
        """Whether the schedule's runtime posts pipeline sends without waiting for them.

        PyTorch pipelining's runtime (the one ZB-V comes from) issues each send as a batched
        ``isend`` and waits on the handles only at the end of the step
        (``_PipelineScheduleRuntime._step_microbatches``); with rendezvous sends ZB-V's
        order deadlocks (stage s sends a chunk-0 activation down while stage s+1 sends a
        chunk-1 activation up).  Megatron-Core's schedules post sends and receives as one
        batch instead, which the engine models as rendezvous unless ``overlap.p2p``.
        """
        return getattr(self.schedule, "layout", None) == "v"

    def rank_ops(self, rank: int) -> list[Op]:
        """The op list of one rank (its class's ops)."""
        return self.classes[int(self.class_of_rank[rank])].ops

    def expand(self, rank: int) -> list[Op]:
        """Rank ``rank``'s program with concrete peers: collectives carry their group id in
        ``peer`` (see :meth:`groups`), send/recv the peer's rank."""
        index = self._group_index()
        stage = self.grid.stage_of(rank)
        gid: dict[str, int] = {}
        peers: dict[int, int] = {}
        out = []
        for op in self.rank_ops(rank):
            if op.kind == OpKind.COLLECTIVE:
                g = gid.get(op.group)
                if g is None:
                    g = gid[op.group] = index[(op.group, self.group_members(op.group, rank))]
                op = op._replace(peer=g)
            elif is_p2p(op):
                p = peers.get(op.peer)
                if p is None:
                    p = peers[op.peer] = self.grid.pp_neighbour(rank, op.peer - stage)
                op = op._replace(peer=p)
            out.append(op)
        return out

    def _group_index(self) -> dict:
        if getattr(self, "_gindex", None) is None:
            kinds = sorted({op.group for c in self.classes for op in c.ops if op.group})
            groups = self.groups()
            by_members = {}
            for gid, members in groups.items():
                by_members.setdefault(members, []).append(gid)
            index = {}
            for kind in kinds:
                for members, gids in by_members.items():
                    index[(kind, members)] = gids[0]
            self._gindex = index
        return self._gindex

    def group_members(self, kind: str, rank: int) -> tuple[int, ...]:
        """The members (ranks) of ``rank``'s group of kind ``kind``."""
        if kind == Group.WORLD:
            return tuple(range(self.grid.world_size))
        if kind == Group.EMBEDDING:
            return self.grid.embedding_group(rank)
        return self.grid.group(kind, rank)

    def groups(self) -> dict[int, tuple[int, ...]]:
        """Every group every op refers to, by id (built on first use)."""
        if self._groups is None:
            kinds = sorted({op.group for c in self.classes for op in c.ops if op.group})
            out, seen = {}, set()
            for kind in kinds:
                if kind == Group.WORLD:
                    grps = [tuple(range(self.grid.world_size))]
                elif kind == Group.EMBEDDING:
                    grps = sorted({self.grid.embedding_group(r) for r in range(self.grid.world_size)})
                else:
                    grps = self.grid.groups(kind)
                for g in grps:
                    if (kind, g) not in seen:
                        seen.add((kind, g))
                        out[len(out)] = g
            self._groups = out
        return self._groups


@dataclass
class _Ctx:
    model: ModelSpec
    par: ParallelConfig
    compute: object
    recipe: object
    mbs: int
    seq: int
    chunk_layers: list[range]
    sched: object
    routing: object
    seed: int
    seg_cache: dict = field(default_factory=dict)
    param_cache: dict = field(default_factory=dict)
    a2a_scale: dict = field(default_factory=dict)      #: (layer, mb) -> assignments sent / routed (dropping, padding)
    drops: list = field(default_factory=lambda: [0, 0])   #: [routed, dropped] assignments of one EP group
    p2p_overlap: bool = False
    grad_overlap: bool = True
    moe_ep_overlap: bool = False
    host: HostCosts = HostCosts(0.0, 0.0, 0.0)
    cp_pos: int = 0               #: ring position of the CP ranks being built (sequential split)
    a2a_sizes: dict = field(default_factory=dict)


_NOSEG = (0.0, 0.0, 0.0, 0)
"""An absent segment: (FLOPs, seconds, host seconds, kernels)."""


def _segments(ctx: _Ctx, layer: int, tokens_per_expert, recompute: str) -> dict[str, list]:
    """One layer's compute ops grouped into the segments between communication points:
    ``{"<phase>:<part>": [FLOPs, seconds, host seconds, kernels]}``."""
    # everything that makes one layer's ops differ from another's: MoE or dense, MTP, the
    # routed load, recompute, whether the recipe runs this layer's GEMMs in low precision
    # (precision_options may keep layers at the ends in BF16), and its attention window
    blocks = layer_blocks(ctx.model, layer)
    key = (tuple(b.kind for b in blocks), layer >= ctx.model.num_layers,
           None if tokens_per_expert is None else tuple(tokens_per_expert), recompute,
           ctx.recipe.is_low_precision_layer(layer, ctx.model.num_layers), ctx.model.attention_window(layer))
    hit = ctx.seg_cache.get(key)
    if hit is not None:
        return hit
    ops = layer_ops(ctx.model, ctx.par, layer, ctx.mbs, ctx.seq, tokens_per_expert=tokens_per_expert,
                    recompute=recompute)
    ops = with_quantize_ops(ctx.recipe, ops, ctx.model.num_layers)
    times = ctx.compute.op_times_s(ops)
    parts = {name: part for b in blocks for name, part in b.SEGMENTS.items()}
    cp_parts = {name: part for b in blocks for name, part in b.CP_SEGMENTS.items()} if ctx.par.cp > 1 else {}
    seg: dict[str, list] = {}
    graphed = ctx.host.graphed if layer < ctx.model.num_layers else frozenset()     # MTP modules stay eager
    # a graphed kernel leaves the GPU the graph's launch gap instead of the eager one
    gap = (LAUNCH_OVERHEAD_S[False] - LAUNCH_OVERHEAD_S[True]
           if graphed and isinstance(ctx.compute, RooflineComputeModel) and not ctx.compute.cuda_graphs else 0.0)
    for op, t in zip(ops, times):
        phase = "R" if op.recompute else op.phase
        base = op.quantizes or op.name        # a quantisation op belongs with its GEMM
        # Transformer Engine issues a grouped GEMM (and the quantisation of its input) once per
        # local expert with tokens, from a C++ loop: launches beyond the first expert's
        looped = op.kernel_rounds - 1 if ctx.host.expert_launch_s else 0
        host_s = op.num_kernels * ctx.host.kernel_s + looped * ctx.host.expert_launch_s
        scope = graph_scope_of(base, blocks) if graphed else None
        if scope in graphed or (scope in ("moe_router", "moe") and "moe" in graphed):
            host_s = 0.0
            t = float(t) - op.launches * gap
        part = cp_parts.get(base)               # with CP: core attention per ring step, between the exchanges
        if part is None or (part == "attn_post" and phase == "R"):
            part = parts.get(base, "mlp")
        acc = seg.setdefault(f"{phase}:{part}", [0.0, 0.0, 0.0, 0])
        acc[0] += op.flops
        acc[1] += float(t)
        acc[2] += host_s
        acc[3] += op.num_kernels + looped
        if base == "moe_permute" and phase != "B":
            # (also kept apart: the GPU work after the dispatcher's host sync, _dispatch_sync)
            seg[f"{phase}:permute_s"] = seg.get(f"{phase}:permute_s", 0.0) + float(t)
    ctx.seg_cache[key] = seg
    return seg


def _dispatch_sync(ctx) -> str | None:
    """Where Megatron-Core's token dispatcher makes the host wait for the GPU in every MoE
    layer's forward (and a recomputed one), to read the per-expert token counts it sizes
    buffers, all-to-all splits and Transformer Engine's grouped-GEMM ``m_splits`` with:
    ``"pre"`` (ahead of the dispatch: the point the GPU must reach lies before the token
    permutation), ``"dispatch"`` (after the dispatch collective), or None (no sync).

    From megatron/core/transformer/moe/token_dispatcher.py (NVIDIA/Megatron-LM):

    * ``alltoall`` (``MoEAlltoAllTokenDispatcher``): unless ``moe_pad_expert_input_to_capacity``
      (``drop_and_pad``: the counts are known on the host), ``_maybe_dtoh_and_synchronize``
      copies the counts and splits to the host on a side stream at ``cuda_dtoh_point``
      (``before_permutation_1``; ``before_ep_alltoall`` when the ``moe_preprocess`` module
      is CUDA-graphed) and waits for the copy (``d2h_event.synchronize()``) at
      ``cuda_sync_point``: ``before_ep_alltoall`` with EP or TP > 1, ``before_finish``
      otherwise, ``before_permutation_1`` with a capacity factor.  The host then issues the
      all-to-all, the sort by local expert and the experts.
    * ``allgather`` (``MoEAllGatherTokenDispatcher.dispatch_postprocess``):
      ``local_map.sum(dim=0).long().cpu()`` after the all-gather, always.
    * ``flex`` with DeepEP (``_DeepepManager`` -> ``fused_a2a.FusedDispatch``): DeepEP's
      normal-mode ``Buffer.dispatch`` waits on the host for the received-token counts
      ("the CPU will wait for GPU's signal to arrive"), always; with HybridEP
      (``_HybridEPManager`` -> ``HybridEPDispatch``): ``non_blocking`` only when
      ``num_permuted_tokens`` is known, i.e. with ``moe_expert_rank_capacity_factor`` or
      padding to capacity.

    The backward needs no sync (the splits are kept from the forward), and Transformer
    Engine's ``GroupedLinear`` then gets host ``m_splits`` (``TEGroupedMLP.forward``'s
    ``tokens_per_expert.tolist()`` of a host tensor).  A full-iteration CUDA graph cannot hold
    a sync (Megatron-Core needs the rank budget for it): host modes without host costs
    (``cuda_graphs``, ``none``) emit none, as the host never gates the GPU there."""
    moe = ctx.model.moe
    if moe is None or not any(ctx.host[:3]):
        return None
    if moe.token_dispatcher == "alltoall":
        return None if moe.pad_expert_input_to_capacity else "pre"
    if moe.token_dispatcher == "allgather":
        return "dispatch" if ctx.par.ep > 1 else "pre"
    if moe.flex_dispatcher_backend == "hybridep" and (moe.expert_rank_capacity_factor is not None
                                                      or moe.pad_expert_input_to_capacity):
        return None
    return "pre"


def _emit_dispatch_sync(ctx, em, seg, where: str, layer, mb, chunk, phase) -> None:
    """The dispatcher's host sync (:func:`_dispatch_sync`) if it falls ``where`` (``pre`` or
    ``dispatch``).  Its lag (the GPU seconds of the preceding op after the point the host
    waits for): ``pre``, the permutation the program places in ``moe_pre`` -- all of it when
    the counts are copied before permutation 1, only the sort by local expert after the
    all-to-all (its ``2 k / (1 + 3 k)`` of the permutation's bytes, ``workloads.costs.flops``
    ``_moe_block``, dropless) when the ``moe_preprocess`` graph holds permutation 1 and the
    copy follows it (alltoall); ``dispatch``, none."""
    if _dispatch_sync(ctx) != where:
        return
    lag = 0.0
    if where == "pre":
        lag = seg.get("F:permute_s", 0.0)          # a recomputed permutation is the forward's
        if ctx.model.moe.token_dispatcher == "alltoall" and "moe_preprocess" in ctx.host.graphed:
            k = ctx.model.moe.top_k
            lag *= 2 * k / (1 + 3 * k)
    em.host_sync(OpName.MOE_HOST_SYNC, layer, mb, chunk, phase, lag)


def graph_scope_of(name: str, blocks) -> str:
    """The per-module CUDA-graph scope (:data:`~workloads.costs.compute.CUDA_GRAPH_SCOPES`)
    whose graph would hold op ``name`` of a layer of ``blocks``: the first block that claims
    it (:meth:`workloads.blocks.Block.graph_scope`), else ``mlp``.

    >>> from workloads import load_model
    >>> from workloads.blocks import layer_blocks
    >>> m = load_model("tiny-moe")
    >>> graph_scope_of("core_attn", layer_blocks(m, 0)), graph_scope_of("router", layer_blocks(m, 0))
    ('attn', 'moe_router')
    >>> graph_scope_of("expert_fc1", layer_blocks(m, 0))
    'moe'
    """
    for block in blocks:
        scope = block.graph_scope(name)
        if scope is not None:
            return scope
    return "mlp"


class _Emitter:
    """Builds one class's op list, numbering collectives per group kind."""

    def __init__(self, host_call_s: float = 0.0):
        self.ops: list[Op] = []
        self.seq: dict[str, int] = {}
        self.lane = 0            # set while emitting one half of a DualPipe F&B pair
        self.host_call_s = host_call_s

    def compute(self, name, layer, mb, chunk, phase, flops, dur, host=0.0, kernels=0):
        if dur > 0 or flops > 0:
            self.ops.append(Op(Stream.COMPUTE, OpKind.COMPUTE, name, layer, mb, chunk, phase, flops, dur, Coll.NONE,
                               Group.NONE, -1, 0.0, -1, None,
                               self.lane, float(host), int(kernels)))

    def host_sync(self, name, layer, mb, chunk, phase, lag=0.0):
        self.ops.append(Op(Stream.COMPUTE, OpKind.HOST_SYNC, name, layer, mb, chunk, phase, 0.0, float(lag), Coll.NONE,
                           Group.NONE, -1, 0.0, -1, None, self.lane, 0.0, 0))

    def coll(self, stream, coll, group, size, name, layer=-1, mb=-1, chunk=0, phase=Phase.F, tag=None):
        n = self.seq.get(group, 0)
        self.seq[group] = n + 1
        self.ops.append(Op(stream, OpKind.COLLECTIVE, name, layer, mb, chunk, phase, 0.0, 0.0, coll, group, n, float(size),
                           -1, tag, self.lane, self.host_call_s, 1))

    def p2p(self, kind, name, peer, size, tag, mb, chunk, phase):
        self.ops.append(Op(Stream.PP, kind, name, -1, mb, chunk, phase, 0.0, 0.0, Coll.SEND_RECV, Group.NONE, -1,
                           float(size), peer, tag,
                           self.lane, self.host_call_s, 1))


def build_program(model: ModelSpec, parallel: ParallelConfig, gpu: GPUSpec, *, num_gpus: int | None = None,
                  precision: str = "bf16", compute_model=None, moe_routing="balanced", seed: int = 0,
                  with_memory: bool = False, grad_reduce_dtype: str | None = None,
                  p2p_overlap: bool = False, grad_reduce_overlap: bool = True, host="eager",
                  moe_ep_overlap: bool = False) -> Program:
    """The class-level program of one training step.

    Parameters
    ----------
    model, parallel : the model and a parallel layout (``dp = -1`` resolved with ``num_gpus``)
    gpu : GPUSpec of the cluster (peak FLOP/s, HBM)
    precision : recipe name (``workloads.costs.PRECISION_RECIPES``)
    grad_reduce_dtype : override the recipe's gradient-reduction dtype (``fp32`` | ``bf16``)
    compute_model : a ``ComputeModel``; default :class:`RooflineComputeModel` for ``gpu``
    moe_routing : routing spec for MoE layers (``workloads.moe_routing``), sampled from ``seed``
    p2p_overlap : Megatron's ``overlap_p2p_comm`` (the scenario's ``overlap.p2p``): the
        interleaved schedule posts each transfer asynchronously next to its compute action
        instead of in Megatron's per-step batches (:mod:`workloads.schedules.comm`)
    moe_ep_overlap : Megatron-Core's ``overlap_moe_expert_parallel_comm`` (with
        ``delay_wgrad_compute``; the scenario's ``overlap.moe_ep_comm``): adjacent forward and
        backward actions of different micro-batches run as an F&B pair, so one's EP
        all-to-alls overlap the other's compute (:func:`_moe_pairs`)
    grad_reduce_overlap : the scenario's ``overlap.grad_reduce``: gradient buckets are
        issued as their last micro-batch's backward fills them (Megatron-Core's
        ``overlap_grad_reduce``); off, all of them are issued after the stage's last
        action, as Megatron's ``finalize_model_grads`` does once the pipeline schedule has
        returned (the engine then runs them blocking)
    host : how the host issues the work (a mode of
        :data:`~workloads.costs.compute.HOST_MODES` or a mapping of measured costs,
        :func:`~workloads.costs.compute.host_costs`): every op carries its host issue time
        (``Op.host_s``: per kernel, per call or p2p batch, plus the checkpoint function on
        a fully recomputed layer) for the engine's host cursor; ``cuda_graphs`` also gives
        the default compute model the graph launch cost per kernel
    """
    hc = host_costs(host)
    par = parallel.resolve(num_gpus) if num_gpus is not None else parallel
    par.check_model(model)
    par.check_schedule()
    if model.moe is not None and model.moe.token_dispatcher == "allgather" and par.expert_tp > 1:
        raise ConfigError("model.moe.token_dispatcher", "allgather", f"with expert tensor parallelism (etp = "
                          f"{par.expert_tp}) is not modelled: use alltoall or flex, or etp 1")
    recipe = get_recipe(precision, gpu=gpu, grad_reduce_dtype=grad_reduce_dtype)
    compute = compute_model or RooflineComputeModel(gpu, precision, cuda_graphs=(host == "cuda_graphs"),
                                                    num_layers=model.num_layers,
                                                    num_gpus=par.world_size if par.dp > 0 else None)
    seq = par.seq_len or model.seq_len
    grid = RankGrid(par)
    if moe_ep_overlap and par.schedule == "interleaved_1f1b" and par.pp > 1:
        # Megatron-Core warms up one more forward for the combined 1F1B (interleaved.py)
        sched = get_schedule(par.schedule)(par.pp, par.num_microbatches, par.vpp, extra_warmup=1)
    else:
        sched = get_schedule(par.schedule)(par.pp, par.num_microbatches, par.vpp)
    ctx = _Ctx(model, par, compute, recipe, par.micro_batch_size, seq, _chunk_layers(model, par, sched), sched,
               parse_routing(moe_routing), seed)
    ctx.p2p_overlap = p2p_overlap
    if moe_ep_overlap:
        _check_moe_overlap(model, par, sched)
    ctx.moe_ep_overlap = moe_ep_overlap
    ctx.grad_overlap = grad_reduce_overlap
    ctx.host = hc
    a2a_sizes: dict = {}
    classes, class_of_rank = _rank_classes(ctx, grid, a2a_sizes)
    a2a_sizes.update(ctx.a2a_sizes)           # the CP exchanges' per-pair sizes
    prog = Program(model, par, sched, grid, classes, class_of_rank,
                   model_flops_per_step(model, par.batch_size, seq), a2a_sizes)
    if _drops_tokens(ctx):
        routed, dropped = ctx.drops
        prog.moe_drops = {"routed": routed, "dropped": dropped, "fraction": dropped / routed if routed else 0.0}
    _check_matching(prog)
    if with_memory:
        from .memory import memory_estimate     # noqa: PLC0415 (optional, heavier)
        prog.memory = [memory_estimate(model, par, stage=s) for s in range(par.pp)]
    return prog


def _chunk_layers(model: ModelSpec, par: ParallelConfig, sched) -> list[range]:
    """The layers of each model chunk, in pipeline order (DualPipe: one chunk per stage of
    the bidirectional layout)."""
    counts = split_layers(model.num_layers, par, mtp_layers=model.mtp_layers)
    if sched.layout == "bidirectional":
        per_k = [counts[k][0] for k in range(par.pp)]
    else:
        per_k = [counts[k % par.pp][k // par.pp] for k in range(par.pp * par.vpp)]
    chunk_layers, start = [], 0
    for n in per_k:
        chunk_layers.append(range(start, start + n))
        start += n
    return chunk_layers


def _rank_classes(ctx: _Ctx, grid: RankGrid, a2a_sizes: dict) -> tuple[list[RankClass], np.ndarray]:
    """Group ranks into classes with identical programs: same pipeline stage and, for MoE,
    the same tokens per local expert in every (layer, micro-batch) -- EP coordinates whose
    routed loads are equal share a class.  Fills ``a2a_sizes`` with the dispatch matrices."""
    model, par = ctx.model, ctx.par
    ep_coords = range(par.ep) if model.moe is not None else [0]
    loads: dict = {}           # (layer, mb) -> tokens per expert: sampled once, sliced per EP coordinate
    sig_of_ep = {e: _moe_signature(ctx, e, a2a_sizes, loads) for e in ep_coords}
    classes: list[RankClass] = []
    a2a, ring = par.cp_sizes()
    per_cp_rank = par.cp_split == "sequential" and ring > 1 and par.cp_comm_type != "a2a"
    # every rank's (stage, EP signature, CP ring position) in arrays (grid.coords, all at once)
    ranks = np.arange(grid.world_size, dtype=np.int64)

    def coord(axis: str, mesh: str = "dense") -> np.ndarray:
        return (ranks // grid.strides[mesh][axis]) % grid.sizes[mesh][axis]

    stage = coord("pp")
    sig_id: dict = {}
    sig_of = np.array([sig_id.setdefault(sig_of_ep[e][0], len(sig_id)) for e in ep_coords], dtype=np.int64)
    e_of = coord("ep", "expert") if model.moe is not None else np.zeros_like(ranks)
    # a sequential CP split (what-if) gives each ring position its own attention work
    pos = coord("cp") // a2a if per_cp_rank else np.zeros_like(ranks)
    key = (stage * len(sig_id) + sig_of[e_of]) * (int(pos.max()) + 1 if pos.size else 1) + pos
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    cid_of = np.empty(first.size, dtype=np.int64)
    for cid, k in enumerate(np.argsort(first, kind="stable").tolist()):     # classes in order of first rank
        r = int(first[k])
        cid_of[k] = cid
        ctx.cp_pos = int(pos[r])
        e = int(e_of[r])
        ops = _stage_program(ctx, int(stage[r]), sig_of_ep[e][1])
        classes.append(RankClass(cid, int(stage[r]), (), ops))
    class_of_rank = cid_of[inv.ravel()]
    order = np.argsort(class_of_rank, kind="stable")
    bounds = np.searchsorted(class_of_rank[order], np.arange(len(classes) + 1))
    for c in classes:
        c.members = tuple(order[bounds[c.class_id]:bounds[c.class_id + 1]].tolist())
    return classes, class_of_rank


def _moe_signature(ctx: _Ctx, e: int, a2a_sizes: dict, loads: dict):
    """(hashable signature, {(layer, mb): tokens per local expert}) of EP coordinate ``e``."""
    m, par = ctx.model, ctx.par
    if m.moe is None:
        return (), {}
    E, k = m.moe.num_experts, m.moe.top_k
    tn = ctx.mbs * ctx.seq // (par.cp * par.tp) if par.sequence_parallel or par.tp == 1 else ctx.mbs * ctx.seq // par.cp
    pool = par.expert_tp * par.ep * tn
    local = E // par.ep
    bytes_per_token = (m.moe.latent_size or m.hidden_size) * 2.0     # latent MoE dispatches latent-wide tokens
    table = {}
    per_source = _drops_tokens(ctx) or _trace_has_sources(ctx.routing)
    for layer in range(m.num_layers):
        if not m.is_moe_layer(layer):
            continue
        for mb in range(par.num_microbatches):
            load = loads.get((layer, mb))
            if load is None:
                if per_source:
                    load = loads[(layer, mb)] = _routed_per_source(ctx, tn, layer, mb, a2a_sizes, bytes_per_token)
                else:
                    load = loads[(layer, mb)] = expert_load(ctx.routing, pool, E, k, layer=layer, microbatch=mb,
                                                            seed=ctx.seed)
            table[(layer, mb)] = tuple(map(int, load[e * local:(e + 1) * local].tolist()))
            if (layer, mb) not in a2a_sizes and par.ep > 1:
                a2a_sizes[(layer, mb)] = dispatch_matrix(load, par.ep, bytes_per_token)
    return tuple(sorted(table.items())), table


def _drops_tokens(ctx) -> bool:
    moe = ctx.model.moe
    return moe is not None and (moe.capacity_factor is not None or moe.expert_rank_capacity_factor is not None)


def _routed_per_source(ctx, tn: int, layer: int, mb: int, a2a_sizes: dict, bytes_per_token: float) -> np.ndarray:
    """Tokens each expert computes on in (layer, mb), routed per source rank: each of the
    ``ep x etp`` source ranks routes its ``tn`` local tokens, keeps at most the capacity per
    expert (Megatron-Core's per-router-call capacity), HybridEP's rank budget trims what an EP
    rank receives; the all-to-all carries what is kept (or the padded capacity).  Records the
    dispatch matrix, the bytes' scale for the expert-TP collectives and the drop counts."""
    m, par = ctx.model, ctx.par
    E, k, moe = m.moe.num_experts, m.moe.top_k, m.moe
    sources = par.ep * par.expert_tp
    routed = source_loads(ctx.routing, tn, sources, E, k, layer=layer, microbatch=mb, seed=ctx.seed)
    kept, dropped = apply_source_capacity(routed, tn, k, moe.capacity_factor, moe.pad_expert_input_to_capacity)
    kept, over = apply_rank_budget(kept, par.ep, tn, k, moe.expert_rank_capacity_factor)
    ctx.drops[0] += int(routed.sum())
    ctx.drops[1] += dropped + over
    ctx.a2a_scale[(layer, mb)] = float(kept.sum()) / float(sources * tn * k)
    if par.ep > 1:
        a2a_sizes[(layer, mb)] = source_dispatch_matrix(kept, par.ep, bytes_per_token)
    return kept.sum(axis=0)


def _tp_sizes(ctx, layer: int) -> tuple[float, float, bool]:
    """``(gathered bytes, activation bytes, sequence parallel?)`` of one block's TP
    collectives in ``layer``.  Transformer Engine quantises before it gathers under a
    low-precision recipe (``gather_along_first_dim`` with the quantiser: the forward input of
    a column-parallel linear in ``linear.py``, the output gradient of a row-parallel one in
    ``base.py`` ``grad_output_preprocess``), so both all-gathers move the recipe's format in
    the layers it quantises; reduce-scatters and all-reduces move BF16."""
    par, model = ctx.par, ctx.model
    tokens = ctx.mbs * ctx.seq / par.cp
    act = tokens * model.hidden_size * 2.0
    low = ctx.recipe.is_low_precision_layer(layer, ctx.model.num_layers)
    gathered = tokens * model.hidden_size * ctx.recipe.tp_gather_bytes_per_element if low else act
    return gathered, act, par.sequence_parallel and par.tp > 1


def _tp_forward_collectives(ctx, em, layer, mb, chunk, phase):
    """``(tp_in, tp_out)``: the forward's tensor-parallel collectives around one block, as
    Megatron places them: with sequence parallelism an all-gather of the (quantised) input
    before and a reduce-scatter of the output after; without it an all-reduce after."""
    par = ctx.par
    tp_bytes, act_bytes, sp = _tp_sizes(ctx, layer)

    def tp_in():
        if sp:
            em.coll(Stream.TP, Coll.ALL_GATHER, Group.TP, tp_bytes, OpName.SP_AG, layer, mb, chunk, phase)

    def tp_out():
        if sp:
            em.coll(Stream.TP, Coll.REDUCE_SCATTER, Group.TP, act_bytes, OpName.SP_RS, layer, mb, chunk, phase)
        elif par.tp > 1:
            em.coll(Stream.TP, Coll.ALL_REDUCE, Group.TP, act_bytes, OpName.TP_AR, layer, mb, chunk, phase)

    return tp_in, tp_out


def _layer_forward(ctx, em, layer, mb, chunk, tpe, phase, recompute):
    """Forward (or recomputed forward, phase 'R') of one layer: each of its blocks
    (:func:`workloads.blocks.layer_blocks`) with the collectives around it.  A recomputed
    layer's checkpoint function costs the host once, with the layer's first block."""
    seg = _segments(ctx, layer, tpe, recompute)
    tp = _tp_forward_collectives(ctx, em, layer, mb, chunk, phase)
    host_extra = ctx.host.checkpoint_s if phase == Phase.R else 0.0
    for block in layer_blocks(ctx.model, layer):
        _LOWERING[block.kind][0](ctx, em, seg, layer, mb, chunk, phase, tp, host_extra)
        host_extra = 0.0


def _layer_backward(ctx, em, layer, mb, chunk, tpe, recompute, with_w: bool):
    """Backward of one layer: the recomputation it needs, then its blocks in reverse order
    with the forward's collectives mirrored, then (``with_w``) its weight gradients."""
    seg = _segments(ctx, layer, tpe, recompute)
    if recompute == "full":
        _layer_forward(ctx, em, layer, mb, chunk, tpe, Phase.R, recompute)
    else:
        _selective_recompute(ctx, em, seg, layer, mb, chunk)
    tp = _tp_sizes(ctx, layer)
    for block in reversed(layer_blocks(ctx.model, layer)):
        _LOWERING[block.kind][1](ctx, em, seg, layer, mb, chunk, tp)
    if with_w:
        _layer_wgrad(ctx, em, layer, mb, chunk, tpe, recompute)


# -- each block kind with its collectives ----------------------------------------------------------
def _attention_forward(ctx, em, seg, layer, mb, chunk, phase, tp, host_extra):
    """Attention between the TP collectives, with its CP exchanges (:func:`_cp_attention`)."""
    tp_in, tp_out = tp
    tp_in()
    f, t, hs, k = seg.get("F:attn", _NOSEG)
    em.compute(OpName.ATTN, layer, mb, chunk, phase, f, t, hs + host_extra, k)
    if ctx.par.cp > 1:
        _cp_attention(ctx, em, seg, "F", layer, mb, chunk, phase)
    tp_out()


def _mamba_forward(ctx, em, seg, layer, mb, chunk, phase, tp, host_extra):
    """A Mamba mixer between the TP collectives; with context parallelism in_proj's output
    (z, x, B, C, dt) is transposed from sequence- to head-split before the conv1d and the
    scan's output back after it (Megatron-Core ``MambaContextParallel``, whatever
    ``cp_comm_type`` says)."""
    tp_in, tp_out = tp
    cp = ctx.par.cp > 1
    tp_in()
    if cp:
        em.coll(Stream.CP, Coll.ALL_TO_ALL, Group.CP, _mamba_cp_bytes(ctx, ctx.model.mamba.in_proj_width),
                OpName.CP_MAMBA_A2A, layer, mb, chunk, phase)
    f, t, hs, k = seg.get("F:attn", _NOSEG)
    em.compute(OpName.MAMBA, layer, mb, chunk, phase, f, t, hs + host_extra, k)
    if cp:
        em.coll(Stream.CP, Coll.ALL_TO_ALL, Group.CP, _mamba_cp_bytes(ctx, ctx.model.mamba.d_inner),
                OpName.CP_MAMBA_A2A, layer, mb, chunk, phase)
    tp_out()


def _mlp_forward(ctx, em, seg, layer, mb, chunk, phase, tp, host_extra):
    """A dense MLP between the TP collectives."""
    tp_in, tp_out = tp
    tp_in()
    f, t, hs, k = seg.get("F:mlp", _NOSEG)
    em.compute(OpName.MLP, layer, mb, chunk, phase, f, t, hs + host_extra, k)
    tp_out()


def _moe_forward(ctx, em, seg, layer, mb, chunk, phase, tp, host_extra):
    """The MoE path: router and permutation (``moe_pre``), the dispatcher's host sync, the
    EP dispatch, the experts between the expert-TP collectives, the combine, the
    unpermutation (``moe_post``)."""
    par = ctx.par
    f, t, hs, k = seg.get("F:pre", _NOSEG)
    n = _preprocess_calls(ctx)
    em.compute(OpName.MOE_PRE, layer, mb, chunk, phase, f, t, hs + host_extra + n * ctx.host.call_s, k + n)
    _emit_dispatch_sync(ctx, em, seg, "pre", layer, mb, chunk, phase)
    if par.ep > 1:
        _ep_comm(ctx, em, OpName.EP_DISPATCH, layer, mb, chunk, phase)
        _emit_dispatch_sync(ctx, em, seg, "dispatch", layer, mb, chunk, phase)
    _expert_tp(ctx, em, Coll.ALL_GATHER, OpName.ETP_AG, layer, mb, chunk, phase)
    em.compute(OpName.EXPERTS, layer, mb, chunk, phase, *seg.get("F:mlp", _NOSEG))
    _expert_tp(ctx, em, Coll.REDUCE_SCATTER, OpName.ETP_RS, layer, mb, chunk, phase)
    if par.ep > 1:
        _ep_comm(ctx, em, OpName.EP_COMBINE, layer, mb, chunk, phase)
    em.compute(OpName.MOE_POST, layer, mb, chunk, phase, *seg.get("F:post", _NOSEG))


def _tp_block_backward(ctx, em, layer, mb, chunk, tp, name, part, seg, inner=None) -> None:
    """The backward of a block between TP collectives: the row-parallel output gradient
    gathered and the column-parallel input re-gathered (SP), the block's ``B`` segment
    ``part`` (``inner`` emits what runs around it), the dgrad reduce-scattered (SP) or
    all-reduced."""
    tp_bytes, act_bytes, sp = tp
    if sp:
        em.coll(Stream.TP, Coll.ALL_GATHER, Group.TP, tp_bytes, OpName.SP_AG_DOUT, layer, mb, chunk, Phase.B)
        em.coll(Stream.TP, Coll.ALL_GATHER, Group.TP, tp_bytes, OpName.SP_AG_INPUT, layer, mb, chunk, Phase.B)
    if inner is not None:
        inner(True)
    em.compute(name, layer, mb, chunk, Phase.B, *seg.get(f"B:{part}", _NOSEG))
    if inner is not None:
        inner(False)
    if sp:
        em.coll(Stream.TP, Coll.REDUCE_SCATTER, Group.TP, act_bytes, OpName.SP_RS_DGRAD, layer, mb, chunk, Phase.B)
    elif ctx.par.tp > 1:
        em.coll(Stream.TP, Coll.ALL_REDUCE, Group.TP, act_bytes, OpName.TP_AR_DGRAD, layer, mb, chunk, Phase.B)


def _attention_backward(ctx, em, seg, layer, mb, chunk, tp):
    def cp(before):
        if before and ctx.par.cp > 1:
            _cp_attention(ctx, em, seg, "B", layer, mb, chunk, Phase.B)
    _tp_block_backward(ctx, em, layer, mb, chunk, tp, OpName.ATTN_BWD, "attn", seg, cp)


def _mamba_backward(ctx, em, seg, layer, mb, chunk, tp):
    def cp(before):
        if ctx.par.cp > 1:
            width = ctx.model.mamba.d_inner if before else ctx.model.mamba.in_proj_width
            em.coll(Stream.CP, Coll.ALL_TO_ALL, Group.CP, _mamba_cp_bytes(ctx, width), OpName.CP_MAMBA_A2A_BWD,
                    layer, mb, chunk, Phase.B)
    _tp_block_backward(ctx, em, layer, mb, chunk, tp, OpName.MAMBA_BWD, "attn", seg, cp)


def _mlp_backward(ctx, em, seg, layer, mb, chunk, tp):
    _tp_block_backward(ctx, em, layer, mb, chunk, tp, OpName.MLP_BWD, "mlp", seg)


def _moe_backward(ctx, em, seg, layer, mb, chunk, tp):
    par = ctx.par
    em.compute(OpName.MOE_POST_BWD, layer, mb, chunk, Phase.B, *seg.get("B:post", _NOSEG))
    if par.ep > 1:
        _ep_comm(ctx, em, OpName.EP_COMBINE_BWD, layer, mb, chunk, Phase.B)
    _expert_tp(ctx, em, Coll.ALL_GATHER, OpName.ETP_AG_BWD, layer, mb, chunk, Phase.B)
    em.compute(OpName.EXPERTS_BWD, layer, mb, chunk, Phase.B, *seg.get("B:mlp", _NOSEG))
    _expert_tp(ctx, em, Coll.REDUCE_SCATTER, OpName.ETP_RS_BWD, layer, mb, chunk, Phase.B)
    if par.ep > 1:
        _ep_comm(ctx, em, OpName.EP_DISPATCH_BWD, layer, mb, chunk, Phase.B)
    em.compute(OpName.MOE_PRE_BWD, layer, mb, chunk, Phase.B, *seg.get("B:pre", _NOSEG))


_LOWERING = {"attention": (_attention_forward, _attention_backward), "mamba": (_mamba_forward, _mamba_backward),
             "mlp": (_mlp_forward, _mlp_backward), "moe": (_moe_forward, _moe_backward)}
"""Each block kind's forward and backward with the collectives between its kernels, as
Megatron-Core with Transformer Engine places them."""


def _mamba_cp_bytes(ctx, width: int) -> float:
    """Bytes one rank sends and receives in a Mamba layer's CP all-to-all: its ``T / cp``
    tokens x ``width / tp`` channels, BF16."""
    return ctx.mbs * ctx.seq / ctx.par.cp * width / ctx.par.tp * 2.0


def _selective_recompute(ctx, em, seg, layer, mb, chunk) -> None:
    """The selectively recomputed parts of a layer ahead of its backward.  With CP the
    recomputed core attention is this rank's share of the causal work (its exchanges are
    not re-run)."""
    for part, name in _RECOMPUTE_PARTS:
        v = seg.get(f"R:{part}", _NOSEG)
        if part == "attn" and ctx.par.cp > 1:
            c, share = seg.get("R:core", _NOSEG), _cp_work_share(ctx)
            v = (v[0] + c[0] * share, v[1] + c[1] * share, v[2] + c[2], v[3] + c[3])
        em.compute(name, layer, mb, chunk, Phase.R, *v)
        if part == "pre" and "R:permute_s" in seg and "moe" in ctx.par.recompute_modules:
            # the recomputed MoE layer (Megatron-Core's moe_layer_recompute checkpoints the
            # whole forward) runs its dispatcher again, sync included
            _emit_dispatch_sync(ctx, em, seg, "pre", layer, mb, chunk, Phase.R)


def _layer_wgrad(ctx, em, layer, mb, chunk, tpe, recompute):
    seg = _segments(ctx, layer, tpe, recompute)
    parts = [v for k, v in seg.items() if k.startswith("W:")]
    em.compute(OpName.WGRAD, layer, mb, chunk, Phase.W, *(sum(v[i] for v in parts) for i in range(4)))


def _kv_bytes(ctx) -> float:
    """Bytes of K and V per token of one TP rank's heads (bf16).

    MLA exchanges the keys and values attention consumes, materialised per head by the
    up-projection -- ``heads/tp x (qk_head_dim + v_head_dim)`` per token -- not the
    compressed latent: Megatron-Core's ``MLASelfAttention`` up-projects K and V before it
    calls Transformer Engine's ``DotProductAttention``, whose CP exchange moves its ``k`` and
    ``v`` inputs (``context_parallel.py``, ``AttnFuncWithCPAndKVP2P``)."""
    m, par = ctx.model, ctx.par
    if m.mla is not None:
        heads = m.num_attention_heads // par.tp
        return heads * (m.mla.qk_head_dim + m.mla.v_head_dim) * 2.0
    kv_heads = max(m.num_kv_heads // par.tp, 1)
    return 2 * kv_heads * m.head_dim * 2.0


#: The allgather dispatcher's collective for each EP communication point: tokens are
#: gathered before the experts and the outputs reduce-scattered after them; the backward of
#: an all-gather is a reduce-scatter and the other way round.
_ALLGATHER_COLL = {OpName.EP_DISPATCH: Coll.ALL_GATHER, OpName.EP_COMBINE: Coll.REDUCE_SCATTER,
                   OpName.EP_COMBINE_BWD: Coll.ALL_GATHER, OpName.EP_DISPATCH_BWD: Coll.REDUCE_SCATTER}


def _ep_comm(ctx, em, name, layer, mb, chunk, phase):
    """One expert-parallel communication point, as the dispatcher moves tokens.

    ``alltoall`` and ``flex`` (DeepEP, HybridEP): an all-to-all with per-peer sizes from the
    routing (``Program.a2a_sizes``; the flex kernels' bandwidth and SM use are the engine's,
    :mod:`simulator.collectives.ep_dispatch`).  ``allgather`` (Megatron-Core's
    ``MoEAllGatherTokenDispatcher``): every rank all-gathers the EP group's tokens (not
    multiplied by top-k: each rank picks the tokens of its own experts from the gathered
    buffer), and the expert outputs are reduce-scattered back, ``ep x local tokens x hidden``
    BF16 each way."""
    par, m = ctx.par, ctx.model
    if m.moe.token_dispatcher == "allgather":
        tn = ctx.mbs * ctx.seq // (par.cp * par.tp) if par.sequence_parallel or par.tp == 1 else ctx.mbs * ctx.seq // par.cp
        em.coll(Stream.EP, _ALLGATHER_COLL[name], Group.EP, float(par.ep * tn * m.hidden_size * 2.0), name, layer, mb,
                chunk, phase)
    else:
        em.coll(Stream.EP, Coll.ALL_TO_ALL, Group.EP, _a2a_total(ctx, layer, mb), name, layer, mb, chunk, phase,
                tag=(layer, mb))
    _ep_host_calls(ctx, em, name, phase)


def _ep_calls(ctx, name, phase) -> int:
    """The collective calls the host issues at one EP communication point (the program
    models their bytes as one collective).  From Megatron-Core's token_dispatcher.py:
    ``alltoall`` dispatches the tokens and, in a second ``all_to_all``, their routing
    probabilities (``token_dispatch``; their gradients likewise in the backward; the counts'
    all-gather before is :func:`_preprocess_calls`); ``allgather`` gathers the routing map,
    the probabilities and the tokens (the backward reduce-scatters the last two); the flex
    dispatchers make one fused call; a combine is one call everywhere."""
    disp = ctx.model.moe.token_dispatcher
    if name not in (OpName.EP_DISPATCH, OpName.EP_DISPATCH_BWD) or disp == "flex":
        return 1
    if disp == "allgather":
        return 3 if name == OpName.EP_DISPATCH else 2
    return 2


def _preprocess_calls(ctx) -> int:
    """Collective calls inside an MoE layer's eager preprocessing (issued with ``moe_pre``):
    the ``alltoall`` dispatcher all-gathers the per-expert counts over the TP x EP group
    (token_dispatcher.py ``preprocess``) with EP or TP > 1, unless it pads to capacity or the
    ``moe_preprocess`` graph holds it."""
    m, par = ctx.model, ctx.par
    if (m.moe is None or m.moe.token_dispatcher != "alltoall" or m.moe.pad_expert_input_to_capacity
            or (par.ep == 1 and par.tp == 1) or "moe_preprocess" in ctx.host.graphed or not ctx.host.call_s):
        return 0
    return 1


def _ep_host_calls(ctx, em, name, phase) -> None:
    """Charge the host for every call of the EP communication point just emitted."""
    n = _ep_calls(ctx, name, phase)
    op = em.ops[-1]
    if n > 1 and op.host_s > 0.0:
        em.ops[-1] = op._replace(host_s=op.host_s * n, host_ops=n)


def _qkv_out_bytes(ctx) -> tuple[float, float]:
    """(Q, K and V ; output) bytes per token of one TP rank's heads (bf16): what the a2a
    (Ulysses) exchange moves before and after core attention."""
    m, par = ctx.model, ctx.par
    heads = m.num_attention_heads // par.tp
    if m.mla is not None:
        return heads * m.mla.qk_head_dim * 2.0 + _kv_bytes(ctx), heads * m.mla.v_head_dim * 2.0
    return heads * m.head_dim * 2.0 + _kv_bytes(ctx), heads * m.head_dim * 2.0


def cp_block_shares(cp_split: str, ring: int, pos: int) -> list[float]:
    """The share of a rank's (zigzag-balanced) core-attention work in each ring step.

    Causal attention over a ring of ``ring`` ranks, rank ``pos`` of it.  ``zigzag``
    (Megatron-Core / Transformer Engine: 2 x ring chunks, rank r holding chunks r and
    2 ring - 1 - r): every step does the same work, ``1/ring`` each (TE's
    ``AttnFuncWithCPAndKVP2P``: the diagonal step runs causal on both local chunks, the
    others half of the block).  ``sequential`` (a what-if): rank r holds the r-th
    contiguous chunk; step 0 is the causal diagonal block (half a block), steps 1..r full
    blocks of earlier keys, later steps nothing -- ``(2r + 1) / ring`` of the balanced work
    in all, i.e. ``(2r + 1) / ring^2`` of the whole causal attention.  Shares are relative
    to the balanced per-rank work (they sum to 1 under zigzag)."""
    if cp_split == "zigzag" or ring == 1:
        return [1.0 / ring] * ring
    return [1.0 / ring if i == 0 else (2.0 / ring if i <= pos else 0.0) for i in range(ring)]


def _ring_matrix(n: int, step: int, nbytes: float) -> np.ndarray:
    """Bytes member i sends to member (i + step) mod n: one hop of a ring (an all-to-all
    whose only pairs are ring neighbours, so the network carries exactly the hop)."""
    m = np.zeros((n, n))
    for i in range(n):
        m[i, (i + step) % n] = nbytes
    return m


def _block_matrix(n: int, a: int, nbytes: float) -> np.ndarray:
    """An all-to-all within consecutive blocks of ``a`` members, ``nbytes`` per member split
    evenly over its block (the a2a part of a2a+p2p, over the CP group)."""
    m = np.zeros((n, n))
    for i in range(n):
        b = (i // a) * a
        m[i, b:b + a] = nbytes / a
    return m


def _cp_attention(ctx, em, seg, src, layer, mb, chunk, phase) -> None:
    """Core attention under context parallelism with its exchanges, as the variant
    (``parallel.cp_comm_type``) runs it in Transformer Engine's ``context_parallel.py``:

    * ``p2p`` (ring attention, ``AttnFuncWithCPAndKVP2P``): the forward runs ``cp`` blocks
      of core attention and posts the next K/V hop before each block but the last, so hop
      ``i + 1`` is in flight while block ``i`` computes (double buffered); the backward
      runs ``cp`` blocks and before each posts a hop carrying K/V (step 0), K/V and the
      dK/dV accumulated so far (steps 1..cp-2) or dK/dV alone (step cp-1): about twice
      the forward's bytes.
    * ``all_gather`` (``AttnFuncWithCPAndKVAllGather``): K/V all-gathered before core
      attention, not overlapped; the backward gathers them again and reduce-scatters dK/dV.
    * ``a2a`` (Ulysses, ``AttnFuncWithCPAndQKVOA2A``): Q, K, V all-to-all from sequence-
      to head-split before, the output back after; the backward does dO before and dQ,
      dK, dV after.  Each rank then runs the whole sequence for ``heads / cp`` heads.
    * ``a2a+p2p``: the all-to-all inside blocks of ``a2a size`` adjacent CP ranks, then
      the ring across blocks (``p2p size`` steps; TE's ``send_dst`` is the same a2a rank
      of the next block).

    Every exchange is a collective on the CP group; a hop is an all-to-all whose only
    pairs are ring neighbours (:func:`_ring_matrix`, sizes in ``Program.a2a_sizes``).
    """
    par = ctx.par
    kind = par.cp_comm_type
    a2a, ring = par.cp_sizes()
    bwd = phase == Phase.B
    core = seg.get(f"{src}:core", _NOSEG)
    post = seg.get(f"{src}:attn_post", _NOSEG)
    tokens = ctx.mbs * ctx.seq / par.cp          # this rank's tokens
    kv_chunk = _kv_bytes(ctx) * tokens           # its K and V (after an a2a: the same bytes)
    qkv_b, out_b = (x * tokens for x in _qkv_out_bytes(ctx))
    core_name = OpName.CORE_ATTN_BWD if bwd else OpName.CORE_ATTN
    if bwd:
        em.compute(OpName.ATTN_OUT_BWD, layer, mb, chunk, phase, *post)
    # the work of this rank: balanced by zigzag; a sequential split (what-if) follows the
    # causal triangle over the ring (the all-to-all part splits heads, not the sequence)
    shares = cp_block_shares(par.cp_split, ring, ctx.cp_pos)
    if a2a > 1:
        tag = _a2a_tag(ctx, a2a, ring, out_b if bwd else qkv_b)
        em.coll(Stream.CP, Coll.ALL_TO_ALL, Group.CP, out_b if bwd else qkv_b,
                OpName.CP_A2A_DOUT if bwd else OpName.CP_A2A_QKV, layer, mb, chunk, phase, tag=tag)
    if kind == "all_gather":
        em.coll(Stream.CP, Coll.ALL_GATHER, Group.CP, kv_chunk * par.cp, OpName.CP_KV_BWD if bwd else OpName.CP_KV,
                layer, mb, chunk, phase)
        _core_block(em, core_name, layer, mb, chunk, phase, core, sum(shares), 1.0)
        if bwd:
            em.coll(Stream.CP, Coll.REDUCE_SCATTER, Group.CP, kv_chunk * par.cp, OpName.CP_DKV, layer, mb, chunk,
                    phase)
    elif ring > 1:
        for i, share in enumerate(shares):
            if bwd:
                size = kv_chunk if i in (0, ring - 1) else 2 * kv_chunk
            else:
                size = kv_chunk if i < ring - 1 else 0.0
            if size > 0:
                tag = ("cp_ring", a2a, size)
                if tag not in ctx.a2a_sizes:
                    ctx.a2a_sizes[tag] = _ring_matrix(par.cp, a2a, size)
                em.coll(Stream.CP, Coll.ALL_TO_ALL, Group.CP, size, OpName.CP_HOP_BWD if bwd else OpName.CP_HOP,
                        layer, mb, chunk, phase, tag=tag)
            _core_block(em, core_name, layer, mb, chunk, phase, core, share, 1.0 / ring)
    else:
        _core_block(em, core_name, layer, mb, chunk, phase, core, 1.0, 1.0)
    if a2a > 1:
        tag = _a2a_tag(ctx, a2a, ring, qkv_b if bwd else out_b)
        em.coll(Stream.CP, Coll.ALL_TO_ALL, Group.CP, qkv_b if bwd else out_b,
                OpName.CP_A2A_DQKV if bwd else OpName.CP_A2A_OUT, layer, mb, chunk, phase, tag=tag)
    if not bwd:
        em.compute(OpName.ATTN_OUT, layer, mb, chunk, phase, *post)


def _cp_work_share(ctx) -> float:
    """This rank's core-attention work relative to the balanced share (1 under zigzag and
    for a2a; ``(2r + 1) / ring`` at ring position r of a sequential split)."""
    return sum(cp_block_shares(ctx.par.cp_split, ctx.par.cp_sizes()[1], ctx.cp_pos))


def _a2a_tag(ctx, a2a: int, ring: int, nbytes: float):
    """The sizes tag of an a2a over the CP group: None (an even split) for plain a2a; for
    a2a+p2p the block matrix of its inner groups."""
    if ring == 1:
        return None
    tag = ("cp_a2a", a2a, nbytes)
    if tag not in ctx.a2a_sizes:
        ctx.a2a_sizes[tag] = _block_matrix(ctx.par.cp, a2a, nbytes)
    return tag


def _core_block(em, name, layer, mb, chunk, phase, core, share, kernel_share) -> None:
    """One block of core attention: ``share`` of the rank's balanced work (FLOPs and time
    scale with it) and ``kernel_share`` of its kernels."""
    f, t, hs, k = core
    if share <= 0:
        return
    em.compute(name, layer, mb, chunk, phase, f * share, t * share, hs * kernel_share,
               max(int(round(k * kernel_share)), 1 if k else 0))


def _expert_tp(ctx, em, coll, name, layer, mb, chunk, phase):
    """Expert tensor parallelism around the experts (Megatron-Core's
    ``MoEAlltoAllTokenDispatcher``): after the dispatch all-to-all the expert-TP group
    all-gathers the tokens its ranks received (each rank then runs its 1/etp slice of every
    local expert on all of them), and before the combine all-to-all it reduce-scatters the
    partial outputs; backward mirrors both.  Sized for the mean load (the gathered buffer:
    etp ranks' tokens x top-k x hidden, BF16)."""
    par = ctx.par
    if par.expert_tp > 1:
        em.coll(Stream.TP, coll, Group.ETP, par.expert_tp * _a2a_total(ctx, layer, mb), name, layer, mb, chunk, phase)


def _a2a_total(ctx, layer, mb) -> float:
    """Bytes one rank dispatches in (layer, mb) at the mean load: its tokens x top-k x hidden
    (BF16), scaled by what token dropping keeps (or padding adds)."""
    par, m = ctx.par, ctx.model
    tn = ctx.mbs * ctx.seq // (par.cp * par.tp) if par.sequence_parallel or par.tp == 1 else ctx.mbs * ctx.seq // par.cp
    # latent MoE dispatches latent-wide tokens
    total = float(tn * m.moe.top_k * (m.moe.latent_size or m.hidden_size) * 2.0)
    scale = ctx.a2a_scale.get((layer, mb))
    return total if scale is None else total * scale


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


def _fsdp_gather_edge(ctx, em, params, layer, mb, chunk, phase) -> None:
    """ZeRO-3 / FSDP: the embedding or the output layer is a sharded module too, gathered
    (BF16) before its forward and backward like a decoder layer."""
    par = ctx.par
    if par.zero_stage == 3 and par.dp * par.cp > 1 and params > 0:
        name = OpName.FSDP_GATHER if phase == Phase.F else OpName.FSDP_GATHER_BWD
        em.coll(Stream.DP, Coll.ALL_GATHER, Group.DP_CP, params * 2.0, name, layer, mb, chunk, phase)


def _recompute_kind(par: ParallelConfig, index_in_stage: int, layers_in_stage: int) -> str:
    if par.recompute != "full":
        return par.recompute
    n = par.recompute_num_layers
    if n is None or n >= layers_in_stage:
        return "full"
    if par.recompute_method == "block":
        return "full" if index_in_stage < n else "none"
    return "full"          # uniform: every layer recomputes, in groups of n (same work)


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
    br = ctx.model.param_breakdown()
    return int((br["embedding"] + br["position_embedding"]) / ctx.par.tp)


def _output_params(ctx) -> int:
    """Output layer + final norm parameters of one last-stage rank (its own copy when tied)."""
    m, br = ctx.model, ctx.model.param_breakdown()
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
        for kind, n in (("dense", d), ("expert", e)):
            self.pending[kind] += n
            if self.pending[kind] >= self.bucket_params:
                self.flush(kind, chunk)

    def issue_deferred(self) -> None:
        for args, chunk in self.deferred:
            self.em.coll(*args, chunk=chunk, phase=Phase.W)


@dataclass
class _Stage:
    """What every action of one stage's program needs to know about the stage."""

    index: int
    tokens: dict                  #: (layer, mb) -> tokens per local expert
    layers: list                  #: the layers of each of the stage's chunks
    num_layers: int               #: layers on the stage, all chunks
    act_p2p: float                #: bytes of one pipeline transfer of a rank
    last_mb: dict                 #: chunk -> the micro-batch whose weight gradient comes last
    buckets: _GradBuckets


def _stage_program(ctx: _Ctx, stage: int, tokens: dict) -> list[Op]:
    """The op list of the ranks of pipeline stage ``stage`` (with EP coordinate's ``tokens``):
    the weight quantisation of low-precision recipes, the schedule's actions with their
    transfers, then the step end."""
    par, sched = ctx.par, ctx.sched
    em = _Emitter(ctx.host.call_s)
    stage_layers = [ctx.chunk_layers[model_chunk(sched, stage, c)] for c in range(sched.num_chunks)]
    act_p2p = _act_bytes(ctx) / (par.tp if _p2p_split(par) else 1)
    st = _Stage(stage, tokens, stage_layers, sum(len(r) for r in stage_layers), act_p2p,
                _last_microbatches(sched, stage), _GradBuckets(ctx, em))
    # the weights of the layers whose GEMMs run in low precision (NVFP4 keeps some in BF16)
    lowp = [i for r in stage_layers for i in r if ctx.recipe.is_low_precision_layer(i, ctx.model.num_layers)]
    wq = weight_quantize_op(ctx.recipe, sum(_local_params(ctx, lowp)))
    if wq is not None:
        em.compute(OpName.WEIGHT_QUANTIZE, -1, -1, 0, Phase.F, 0.0, float(np.sum(ctx.compute.op_times_s([wq]))),
                   *_host_of(ctx, [wq]))
    order = p2p_order(sched, stage, overlap_p2p=ctx.p2p_overlap)
    acts = order if order is not None else [a for a in sched.actions[stage] if a is not None]
    for act in (_moe_pairs(acts) if ctx.moe_ep_overlap else acts):
        if isinstance(act, _MoEPair):       # an MoE overlap pair: two halves, as DualPipe's F&B
            # With transfers next to their compute (overlapped p2p), the pair waits for both
            # halves' inputs before it starts and sends both outputs after it: Megatron-Core's
            # combined step calls pre_forward and pre_backward before its first layer
            # (TransformerModelChunkSchedulePlan.run), post_forward / post_backward after.
            if order is None:
                for a in act.halves:
                    _emit_pair_p2p(ctx, em, st, a, receive=True)
            for lane, a in enumerate(act.halves, start=1):
                em.lane = lane
                _emit_action(ctx, em, st, a, p2p=False)
            em.lane = 0
            if order is None:
                for a in act.halves:
                    _emit_pair_p2p(ctx, em, st, a, receive=False)
            continue
        kind = act.kind
        if kind in COMM_KINDS:
            _emit_transfer(ctx, em, act, act_p2p)
            continue
        if kind not in (ActionKind.F, ActionKind.B, ActionKind.W, ActionKind.BW, ActionKind.FB):
            continue
        halves = act.halves() if kind == ActionKind.FB else [act]
        for lane, a in enumerate(halves, start=1 if kind == ActionKind.FB else 0):
            em.lane = lane
            _emit_action(ctx, em, st, a, p2p=order is None)
        em.lane = 0
    st.buckets.issue_deferred()
    _step_end(ctx, em, st)
    return _one_issue_per_p2p_batch(em.ops)


def _check_moe_overlap(model, par, sched) -> None:
    """Megatron-Core's conditions for ``overlap_moe_expert_parallel_comm``
    (transformer_config.py ``__post_init__``), as ConfigErrors."""
    key = "overlap.moe_ep_comm"
    if model.moe is None or par.ep == 1:
        raise ConfigError(key, True, "needs expert parallelism (a MoE model with ep > 1)")
    if model.moe.token_dispatcher not in ("alltoall", "flex"):
        raise ConfigError(key, True, f"needs the alltoall or flex dispatcher, not {model.moe.token_dispatcher}")
    if par.recompute == "full":
        raise ConfigError(key, True, "needs recompute other than full (Megatron-Core refuses full recomputation)")
    if sched.layout == "bidirectional":
        raise ConfigError(key, True, "DualPipe already pairs forward and backward (overlap.fb_overlap)")
    if par.pp > 1 and sched.name != "interleaved_1f1b":
        raise ConfigError(key, True, "with pipeline parallelism needs the interleaved 1F1B schedule (Megatron-Core "
                          "requires a virtual pipeline size)")


class _MoEPair(NamedTuple):
    halves: tuple


def _moe_pairs(acts: list) -> list:
    """Megatron-Core's combined 1F1B (``overlap_moe_expert_parallel_comm``): a forward and a
    full backward that follow each other with no transfer between them, of different
    (chunk, micro-batch), become one pair (:class:`_MoEPair`) whose halves run as two
    threads (the engine's F&B pair, as DualPipe's): in the interleaved steady state the step's
    forward and backward; without a pipeline the backward of micro-batch i with the forward
    of i+1.  ``delay_wgrad_compute`` is inside the pair: the backward half's weight gradients
    are compute the forward half's all-to-alls can overlap."""
    out, i = [], 0
    compute = (ActionKind.F, ActionKind.BW)
    while i < len(acts):
        a = acts[i]
        b = acts[i + 1] if i + 1 < len(acts) else None
        if (b is not None and a.kind in compute and b.kind in compute and a.kind != b.kind
                and (a.chunk, a.microbatch) != (b.chunk, b.microbatch)):
            out.append(_MoEPair((a, b)))
            i += 2
            continue
        out.append(a)
        i += 1
    return out


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
    opt = optimizer_ops(int(shard))
    em.compute(OpName.OPTIMIZER, -1, -1, 0, Phase.S, 0.0, float(np.sum(ctx.compute.op_times_s(opt))),
               *_host_of(ctx, opt))
    if par.distributed_optimizer and par.zero_stage < 3:
        _param_gathers(ctx, em, [i for r in st.layers for i in r], float(edge), st.buckets.bucket_params)


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


def _one_issue_per_p2p_batch(ops: list[Op]) -> list[Op]:
    """Consecutive send/recv ops are one batch (one ``batch_isend_irecv`` call, as the
    engine runs them): only the first carries the host's issue time."""
    out = []
    for i, op in enumerate(ops):
        if is_p2p(op) and i > 0 and is_p2p(ops[i - 1]) and op.host_s:
            op = op._replace(host_s=0.0, host_ops=0)
        out.append(op)
    return out


def _act_bytes(ctx) -> float:
    """Bytes of one micro-batch's activation (or its gradient) between stages, whole."""
    return ctx.mbs * ctx.seq / ctx.par.cp * ctx.model.hidden_size * 2.0


def _p2p_split(par) -> bool:
    """Whether a TP rank sends only its 1/tp slice of the activations between stages:
    with sequence parallelism they are split already; with Megatron-LM's scatter/gather
    the receiver all-gathers them over the TP group (:func:`_gather_received`)."""
    return par.sequence_parallel or (par.scatter_gather_tensors_in_pipeline and par.tp > 1)


def _gather_received(ctx, em, mb, chunk, phase):
    """Megatron-LM's ``gather_split_1d_tensor``: the TP group rebuilds the received
    activation (or gradient) from its slices before computing on it."""
    if _p2p_split(ctx.par) and not ctx.par.sequence_parallel:
        em.coll(Stream.TP, Coll.ALL_GATHER, Group.TP, _act_bytes(ctx), OpName.P2P_GATHER, -1, mb, chunk, phase)


def _emit_transfer(ctx, em, t, act_p2p):
    """The p2p op of transfer action ``t`` (:mod:`workloads.schedules.comm`): the input or
    output of compute action ``(t.stage, t.chunk, t.microbatch)``."""
    sched, stage, mb = ctx.sched, t.stage, t.microbatch
    path = route(sched, mb)
    pos = path.index((stage, t.chunk))
    step = 1 if t.kind in (ActionKind.SEND_F, ActionKind.RECV_B) else -1
    _p2p(em, t.kind, stage, t.chunk, mb, model_chunk(sched, stage, t.chunk), path[pos + step][0], act_p2p)


def _p2p(em, kind, stage, chunk, mb, k, peer, act_p2p):
    """One send or receive of stage ``stage``'s model chunk ``k`` with stage ``peer``; the
    tag (source stage, destination stage, receiver's model chunk, micro-batch, F|B) is
    what both sides match on."""
    if kind == ActionKind.RECV_F:
        em.p2p(OpKind.RECV, OpName.RECV_ACT, peer, act_p2p, (peer, stage, k, mb, Phase.F), mb, chunk, Phase.F)
    elif kind == ActionKind.SEND_F:
        em.p2p(OpKind.SEND, OpName.SEND_ACT, peer, act_p2p, (stage, peer, k + 1, mb, Phase.F), mb, chunk, Phase.F)
    elif kind == ActionKind.RECV_B:
        em.p2p(OpKind.RECV, OpName.RECV_GRAD, peer, act_p2p, (peer, stage, k, mb, Phase.B), mb, chunk, Phase.B)
    else:
        em.p2p(OpKind.SEND, OpName.SEND_GRAD, peer, act_p2p, (stage, peer, k - 1, mb, Phase.B), mb, chunk, Phase.B)


class _Where(NamedTuple):
    """Where compute action ``a`` sits: its model chunk, layers and neighbours on its route."""

    k: int                        #: the model chunk
    layers: range
    prev_stage: int | None        #: the stage it receives activations from (None: the first chunk)
    next_stage: int | None        #: the stage it sends them to (None: the last chunk)
    first_idx: int                #: index of its first layer among the stage's layers
    is_last_mb: bool              #: its weight gradients complete the chunk's buckets


def _where(ctx: _Ctx, st: _Stage, a) -> _Where:
    k = model_chunk(ctx.sched, st.index, a.chunk)
    path = route(ctx.sched, a.microbatch)
    pos = path.index((st.index, a.chunk))
    prev_stage = path[pos - 1][0] if pos > 0 else None
    next_stage = path[pos + 1][0] if pos + 1 < len(path) else None
    return _Where(k, ctx.chunk_layers[k], prev_stage, next_stage, sum(len(r) for r in st.layers[:a.chunk]),
                  a.microbatch == st.last_mb.get(a.chunk))


def _emit_action(ctx: _Ctx, em: _Emitter, st: _Stage, a, p2p: bool = True) -> None:
    """The ops of compute action ``a``; with ``p2p`` also its receive before and send after
    (the plain rule of :mod:`workloads.schedules.comm`)."""
    w = _where(ctx, st, a)
    if a.kind == ActionKind.F:
        _emit_forward(ctx, em, st, a, w, p2p)
    elif a.kind in (ActionKind.B, ActionKind.BW):
        _emit_backward(ctx, em, st, a, w, p2p)
    elif a.kind == ActionKind.W:
        _emit_wgrad(ctx, em, st, a, w)


def _emit_pair_p2p(ctx: _Ctx, em: _Emitter, st: _Stage, a, receive: bool) -> None:
    """The receive (``receive``) or the send of compute action ``a``, where it has a peer:
    a forward receives activations from the stage before and sends to the stage after; a
    backward receives gradients from the stage after and sends to the stage before."""
    w = _where(ctx, st, a)
    fwd = a.kind == ActionKind.F
    peer = (w.prev_stage if fwd else w.next_stage) if receive else (w.next_stage if fwd else w.prev_stage)
    if peer is None:
        return
    kind = {(True, True): ActionKind.RECV_F, (True, False): ActionKind.SEND_F,
            (False, True): ActionKind.RECV_B, (False, False): ActionKind.SEND_B}[(fwd, receive)]
    _p2p(em, kind, st.index, a.chunk, a.microbatch, w.k, peer, st.act_p2p)


def _emit_forward(ctx: _Ctx, em: _Emitter, st: _Stage, a, w: _Where, p2p: bool) -> None:
    par, model, chunk, mb = ctx.par, ctx.model, a.chunk, a.microbatch
    if p2p and w.prev_stage is not None:
        _p2p(em, ActionKind.RECV_F, st.index, chunk, mb, w.k, w.prev_stage, st.act_p2p)
    if w.prev_stage is not None:
        _gather_received(ctx, em, mb, chunk, Phase.F)
    if w.k == 0:
        _fsdp_gather_edge(ctx, em, _embedding_params(ctx), -1, mb, chunk, Phase.F)
        _add_ops(ctx, em, embedding_ops(model, par, ctx.mbs, ctx.seq), Phase.F, OpName.EMBEDDING, mb, chunk)
    for j, layer in enumerate(w.layers):
        _fsdp_gather_layer(ctx, em, layer, mb, chunk, Phase.F)
        _layer_forward(ctx, em, layer, mb, chunk, st.tokens.get((layer, mb)), Phase.F,
                       _recompute_kind(par, w.first_idx + j, st.num_layers))
    if w.next_stage is None:
        _fsdp_gather_edge(ctx, em, _output_params(ctx), -1, mb, chunk, Phase.F)
        _add_ops(ctx, em, output_ops(model, par, ctx.mbs, ctx.seq), Phase.F, OpName.OUTPUT_LOSS, mb, chunk)
    elif p2p:
        _p2p(em, ActionKind.SEND_F, st.index, chunk, mb, w.k, w.next_stage, st.act_p2p)


def _emit_backward(ctx: _Ctx, em: _Emitter, st: _Stage, a, w: _Where, p2p: bool) -> None:
    """A backward action: input gradients, and with ``BW`` the weight gradients too (whose
    last micro-batch fills the gradient buckets)."""
    par, model, chunk, mb = ctx.par, ctx.model, a.chunk, a.microbatch
    with_w = a.kind == ActionKind.BW
    fill = with_w and (w.is_last_mb or _grads_sharded(par))
    if w.next_stage is not None:
        if p2p:
            _p2p(em, ActionKind.RECV_B, st.index, chunk, mb, w.k, w.next_stage, st.act_p2p)
        _gather_received(ctx, em, mb, chunk, Phase.B)
    else:
        out = output_ops(model, par, ctx.mbs, ctx.seq)
        _fsdp_gather_edge(ctx, em, _output_params(ctx), -1, mb, chunk, Phase.B)
        _add_ops(ctx, em, out, Phase.B, OpName.OUTPUT_LOSS_BWD, mb, chunk)
        if with_w:
            _add_ops(ctx, em, out, Phase.W, OpName.OUTPUT_WGRAD, mb, chunk)
            if fill:
                st.buckets.ready([], chunk, _output_params(ctx))
    for j, layer in reversed(list(enumerate(w.layers))):
        _fsdp_gather_layer(ctx, em, layer, mb, chunk, Phase.B)
        _layer_backward(ctx, em, layer, mb, chunk, st.tokens.get((layer, mb)),
                        _recompute_kind(par, w.first_idx + j, st.num_layers), with_w)
        if fill:
            st.buckets.ready([layer], chunk)
    if w.k == 0 and with_w:
        _fsdp_gather_edge(ctx, em, _embedding_params(ctx), -1, mb, chunk, Phase.B)
        _add_ops(ctx, em, embedding_ops(model, par, ctx.mbs, ctx.seq), Phase.W, OpName.EMBEDDING_WGRAD, mb, chunk)
        if fill:
            st.buckets.ready([], chunk, _embedding_params(ctx))
    if p2p and w.prev_stage is not None:
        _p2p(em, ActionKind.SEND_B, st.index, chunk, mb, w.k, w.prev_stage, st.act_p2p)
    if fill:
        st.buckets.flush_all(chunk)


def _emit_wgrad(ctx: _Ctx, em: _Emitter, st: _Stage, a, w: _Where) -> None:
    """A zero-bubble weight-gradient action (W)."""
    par, model, chunk, mb = ctx.par, ctx.model, a.chunk, a.microbatch
    w = w._replace(is_last_mb=w.is_last_mb or _grads_sharded(par))
    if w.next_stage is None:
        _add_ops(ctx, em, output_ops(model, par, ctx.mbs, ctx.seq), Phase.W, OpName.OUTPUT_WGRAD, mb, chunk)
        if w.is_last_mb:
            st.buckets.ready([], chunk, _output_params(ctx))
    for j, layer in reversed(list(enumerate(w.layers))):
        _layer_wgrad(ctx, em, layer, mb, chunk, st.tokens.get((layer, mb)),
                     _recompute_kind(par, w.first_idx + j, st.num_layers))
        if w.is_last_mb:
            st.buckets.ready([layer], chunk)
    if w.k == 0:
        _add_ops(ctx, em, embedding_ops(model, par, ctx.mbs, ctx.seq), Phase.W, OpName.EMBEDDING_WGRAD, mb, chunk)
        if w.is_last_mb:
            st.buckets.ready([], chunk, _embedding_params(ctx))
    if w.is_last_mb:
        st.buckets.flush_all(chunk)


def _last_microbatches(sched, stage) -> dict[int, int]:
    """Per chunk of ``stage``: the micro-batch whose weight gradient comes last."""
    last: dict[int, int] = {}
    for a in sched.actions[stage]:
        if a is None:
            continue
        for h in (a.halves() if a.kind == ActionKind.FB else [a]):
            if h.kind in (ActionKind.W, ActionKind.BW):
                last[h.chunk] = h.microbatch
    return last


def _add_ops(ctx, em, ops, phase, name, mb, chunk):
    sel = [o for o in ops if o.phase == phase]
    if not sel:
        return
    t = float(np.sum(ctx.compute.op_times_s(sel)))
    em.compute(name, -1, mb, chunk, phase, float(sum(o.flops for o in sel)), t, *_host_of(ctx, sel))


def _host_of(ctx, ops) -> tuple[float, int]:
    """(host seconds, kernels) to issue ``ops``."""
    k = sum(o.num_kernels for o in ops)
    return k * ctx.host.kernel_s, k


def _check_matching(prog: Program) -> None:
    """Every member of every group issues the same collectives (count, kind, size) in order."""
    per_class: dict[tuple[int, str], list] = {}
    for c in prog.classes:
        for op in c.ops:
            if op.kind == OpKind.COLLECTIVE:
                per_class.setdefault((c.class_id, op.group), []).append((op.coll, op.size_bytes))
    kinds = {g for (_, g) in per_class}
    grid = prog.grid
    cor = prog.class_of_rank
    for kind in kinds:
        if kind == Group.WORLD:
            grps = [np.arange(grid.world_size)]
        elif kind == Group.EMBEDDING:
            grps = [np.array(g) for g in sorted({grid.embedding_group(r) for r in range(grid.world_size)})]
        else:
            grps = [np.array(g) for g in grid.groups(kind)]
        checked: set = set()
        for grp in grps:
            cls = tuple(sorted(set(cor[grp].tolist())))
            if len(cls) <= 1 or cls in checked:
                continue
            checked.add(cls)
            ref = tuple(per_class.get((cls[0], kind), ()))
            for c in cls[1:]:
                if tuple(per_class.get((c, kind), ())) != ref:
                    raise ConfigError("program", kind, f"members of the {kind} group starting at rank {int(grp[0])} "
                                                       f"issue different {kind} collectives (classes {list(cls)})")
