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

import contextlib
import gc
from collections.abc import Mapping
from dataclasses import dataclass, field
import numpy as np

from topologies import ConfigError, GPUSpec

from .costs import RooflineComputeModel, get_recipe, model_flops_per_step
from .blocks import layer_blocks
from .costs.compute import host_costs
from .mesh import RankGrid
from .model import ModelSpec
from .moe_routing import parse_routing
from .ops import Group, Op, OpKind, is_p2p
from .parallel import ParallelConfig, mtp_per_virtual_stage, split_layers
from .schedules import get_schedule
from .schedules.comm import host_waits_for_batches, sends_async
from .stacks.megatron_te.context import _Ctx
from .stacks.megatron_te.context_parallel import check_cp_mla_latent
from .stacks.megatron_te.moe import _drops_tokens, _moe_signature
from .stacks import DEFAULT_STACK, get_stack

__all__ = ["Op", "RankClass", "Program", "build_program", "few_gc_passes"]


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
    framework: str = DEFAULT_STACK
    """The kernel stack that lowered the blocks (:mod:`workloads.stacks`)."""
    moe_drops: dict | None = None
    """With token dropping (``moe.capacity_factor`` or HybridEP's rank budget): ``routed`` and
    ``dropped`` token-expert assignments of one EP group over the step's MoE layers and
    micro-batches (every EP group sees the same sampled routing), and ``fraction``."""
    _groups: dict | None = None
    _gindex: dict | None = None
    _lowering: tuple | None = None
    """(kernel stack, build context) that produced the program: what :meth:`kernel_table` asks."""

    def kernel_table(self) -> list[dict]:
        """The kernels each compute op stands for: for every distinct kind of layer (its
        blocks, MTP or not, recompute mode, precision and window; balanced routing), one row
        per kernel with the program segment it runs in (``"<phase>:<part>"``: ``F:attn`` is the
        layer's mixer op, ``F:mlp`` its MLP or experts op, ``F:pre`` / ``F:post`` ``moe_pre`` /
        ``moe_post``; ``B:`` their backward ops, ``R:`` recomputation, ``W:`` the weight
        gradients), its shape, FLOPs, bytes and modelled GPU and host time.  Summed by segment,
        the rows give the compute ops' durations in the timeline (for the balanced load)."""
        stack, ctx = self._lowering
        seen, rows = set(), []
        for layer in range(self.model.num_layers + self.model.mtp_layers):
            key = stack.segment_key(ctx, layer, None, self.parallel.recompute)
            if key in seen:
                continue
            seen.add(key)
            blocks = "+".join(key[0])
            for r in stack.kernel_rows(ctx, layer, None, self.parallel.recompute):
                k = r.kernel
                rows.append({"layer": layer, "blocks": blocks, "segment": r.segment, "kernel": k.name,
                             "phase": k.phase, "recompute": k.recompute, "op_class": k.op_class, "m": k.m, "n": k.n,
                             "k": k.k, "groups": len(k.groups), "flops": k.flops, "bytes": k.mem_bytes,
                             "time_s": r.time_s, "host_s": r.host_s, "launches": r.launches,
                             "source": getattr(r, "source", "model"), **_attention_columns(k.attention)})
        return rows

    def measured_share(self) -> float | None:
        """Share of the decoder layers' kernel GPU time (every layer and MTP module once, one
        micro-batch, balanced routing) that the compute model took from measured kernel tables
        (:mod:`workloads.costs.kernel_tables`) rather than its sub-models; None when the
        program does not say (no lowering kept)."""
        if self._lowering is None:
            return None
        stack, ctx = self._lowering
        per_key: dict = {}
        measured = total = 0.0
        for layer in range(self.model.num_layers + self.model.mtp_layers):
            key = stack.segment_key(ctx, layer, None, self.parallel.recompute)
            if key not in per_key:
                rows = stack.kernel_rows(ctx, layer, None, self.parallel.recompute)
                per_key[key] = (sum(r.time_s for r in rows if getattr(r, "source", "model") == "measured"),
                                sum(r.time_s for r in rows))
            measured += per_key[key][0]
            total += per_key[key][1]
        return measured / total if total > 0 else 0.0

    @property
    def num_ops(self) -> int:
        return sum(len(c.ops) for c in self.classes)

    @property
    def async_sends(self) -> bool:
        """Whether the schedule's runtime posts pipeline sends without waiting for them (the
        zero-bubble schedules: :func:`~workloads.schedules.comm.sends_async`); the engine
        then never blocks a send, as with ``overlap.p2p``.  Megatron-Core's schedules post
        sends and receives as one batch instead, which the engine models as rendezvous unless
        ``overlap.p2p``."""
        return sends_async(self.schedule)

    @property
    def host_waits_for_p2p(self) -> bool:
        """Whether the host waits for the device after each waited-for batch of pipeline
        transfers (Megatron's ``batch_p2p_sync``; not DualPipe, not the zero-bubble runtimes:
        :func:`~workloads.schedules.comm.host_waits_for_batches`)."""
        return host_waits_for_batches(self.schedule)

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









def _attention_columns(shape) -> dict:
    """The attention shape's fields for :meth:`Program.kernel_table` (empty for other kernels)."""
    if shape is None:
        return {"batch": "", "heads": "", "kv_heads": "", "mask": "", "window": ""}
    return {"batch": shape.batch, "heads": shape.heads, "kv_heads": shape.kv_heads, "mask": shape.mask,
            "window": "" if shape.window is None else shape.window}


def build_program(model: ModelSpec, parallel: ParallelConfig, gpu: GPUSpec, *, num_gpus: int | None = None,
                  precision: str = "bf16", compute_model=None, moe_routing="balanced", seed: int = 0,
                  with_memory: bool = False, grad_reduce_dtype: str | None = None,
                  p2p_overlap: bool = False, grad_reduce_overlap: bool = True, host="eager",
                  moe_ep_overlap: bool = False, overlap: Mapping | None = None,
                  framework: str = DEFAULT_STACK, cp_mla_latent: bool = False, stack_options=None) -> Program:
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
        :func:`~workloads.costs.host.host_costs`): every op carries its host issue time
        (``Op.host_s``: per kernel, per call or p2p batch, plus the checkpoint function on
        a fully recomputed layer) for the engine's host cursor; ``cuda_graphs`` also gives
        the default compute model the graph launch cost per kernel
    overlap : the scenario's ``overlap`` switches, from which the kernel stack sets every
        op's issue mode (:class:`~workloads.ops.Issue`); missing switches take their defaults
    framework : the kernel stack that lowers the blocks (:mod:`workloads.stacks`)
    cp_mla_latent : the what-if ``whatif.cp_mla_latent`` (:mod:`simulator.scenario.whatif`)
    stack_options : the stack's own settings (:meth:`workloads.stacks.KernelStack.parse_options`)
    """
    stack = get_stack(framework)
    stack.check_blocks(sorted({b.kind for i in range(model.num_layers) for b in layer_blocks(model, i)}))
    hc = host_costs(host)
    par = parallel.resolve(num_gpus) if num_gpus is not None else parallel
    par.check_model(model)
    par.check_schedule()
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
               parse_routing(moe_routing), seed, cp_mla_latent=cp_mla_latent and check_cp_mla_latent(model, par))
    stack.check_layout(model, par, sched, moe_ep_overlap=moe_ep_overlap)
    ctx.p2p_overlap, ctx.moe_ep_overlap, ctx.grad_overlap = p2p_overlap, moe_ep_overlap, grad_reduce_overlap
    ctx.host, ctx.fusion = hc, stack.fusion
    ctx.stack_options = stack.parse_options(stack_options)
    a2a_sizes: dict = {}
    classes, class_of_rank = _rank_classes(ctx, grid, a2a_sizes, stack.stage_program)
    for c in classes:
        c.ops = stack.assign_issue_modes(c.ops, overlap or {})
    lowering = (stack, ctx)
    a2a_sizes.update(ctx.a2a_sizes)           # the CP exchanges' per-pair sizes
    prog = Program(model, par, sched, grid, classes, class_of_rank,
                   model_flops_per_step(model, par.batch_size, seq), a2a_sizes, framework=stack.name,
                   _lowering=lowering)
    if _drops_tokens(ctx):
        routed, dropped = ctx.drops
        prog.moe_drops = {"routed": routed, "dropped": dropped, "fraction": dropped / routed if routed else 0.0}
    _check_matching(prog)
    if with_memory:
        from .memory import memory_estimate     # noqa: PLC0415 (optional, heavier)
        prog.memory = [memory_estimate(model, par, stage=s, moe_routing=ctx.routing, seed=seed) for s in range(par.pp)]
    return prog


@contextlib.contextmanager
def few_gc_passes():
    """Collect cyclic garbage less often inside the block, then restore the thresholds.  For
    work that allocates millions of small objects which mostly die young or live to the end:
    the default thresholds rescan the long-lived ones at every full collection (about a sixth
    of a skewed MoE program's build, a million ops; 25-35 % of a 16k-GPU run, measured)."""
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], 50_000), max(old[1], 20), max(old[2], 20))
    try:
        yield
    finally:
        gc.set_threshold(*old)


def _chunk_layers(model: ModelSpec, par: ParallelConfig, sched) -> list[tuple[int, ...]]:
    """The layers of each model chunk, in pipeline order (DualPipe: one chunk per stage of
    the bidirectional layout). MTP modules (layer ``num_layers + j``) run after the decoder
    layers of the chunk that holds them: the last one, as Megatron-Core's post-process stage
    builds them, or where ``pipeline_layout`` places its ``m`` tokens."""
    counts = split_layers(model.num_layers, par, mtp_layers=model.mtp_layers)
    if sched.layout == "bidirectional":
        per_k = [counts[k][0] for k in range(par.pp)]
    else:
        per_k = [counts[k % par.pp][k // par.pp] for k in range(par.pp * par.vpp)]
    if sched.layout == "bidirectional":
        mtp = [0] * (len(per_k) - 1) + [model.mtp_layers]
    else:
        mtp = mtp_per_virtual_stage(par, model.mtp_layers, len(per_k))
    chunk_layers, start, next_mtp = [], 0, model.num_layers
    for n, extra in zip(per_k, mtp):
        chunk_layers.append(tuple(range(start, start + n)) + tuple(range(next_mtp, next_mtp + extra)))
        start += n
        next_mtp += extra
    return chunk_layers


@few_gc_passes()
def _rank_classes(ctx: _Ctx, grid: RankGrid, a2a_sizes: dict, stage_program) -> tuple[list[RankClass], np.ndarray]:
    """Group ranks into classes with identical programs: same pipeline stage and, for MoE,
    the same tokens per local expert in every (layer, micro-batch) -- EP coordinates whose
    routed loads are equal share a class.  Fills ``a2a_sizes`` with the dispatch matrices."""
    par = ctx.par
    ep_coords = range(par.ep)              # (1 without experts: ParallelConfig refuses ep > 1)
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
    e_of = coord("ep", "expert")
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
        ops = stage_program(ctx, int(stage[r]), sig_of_ep[e][1])
        classes.append(RankClass(cid, int(stage[r]), (), ops))
    class_of_rank = cid_of[inv.ravel()]
    order = np.argsort(class_of_rank, kind="stable")
    bounds = np.searchsorted(class_of_rank[order], np.arange(len(classes) + 1))
    for c in classes:
        c.members = tuple(order[bounds[c.class_id]:bounds[c.class_id + 1]].tolist())
    return classes, class_of_rank








































































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
