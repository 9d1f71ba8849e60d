"""The build context of one program and the emitter of its ops; a layer's compute ops grouped
into the segments between communication points."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple
from ...costs import RooflineComputeModel, layer_ops
from ...costs.flops import layer_load_ops
from ...costs.compute import HostCosts
from ...blocks import layer_blocks
from ...blocks.fusion import MEGATRON_TE, Fusion
from ...costs.precision import with_quantize_ops
from ...model import ModelSpec
from ...ops import Coll, Group, Op, OpKind, Phase, Stream
from ...parallel import ParallelConfig




_DTYPE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0}



@dataclass
class _Ctx:
    model: ModelSpec
    par: ParallelConfig
    compute: object
    recipe: object
    mbs: int
    seq: int
    chunk_layers: list[tuple[int, ...]]
    sched: object
    routing: object
    seed: int
    seg_cache: dict = field(default_factory=dict)
    param_cache: dict = field(default_factory=dict)
    layer_keys: dict = field(default_factory=dict)      #: layer -> the load-independent part of its segment key
    row_context: dict = field(default_factory=dict)     #: layer -> what its kernel rows share (_row_context)
    a2a_scale: dict = field(default_factory=dict)      #: (layer, mb) -> assignments sent / routed (dropping, padding)
    drops: list = field(default_factory=lambda: [0, 0])   #: [routed, dropped] assignments of one EP group
    p2p_overlap: bool = False
    grad_overlap: bool = True
    moe_ep_overlap: bool = False
    host: HostCosts = HostCosts(0.0, 0.0, 0.0)
    cp_pos: int = 0               #: ring position of the CP ranks being built (sequential split)
    a2a_sizes: dict = field(default_factory=dict)
    fusion: Fusion = MEGATRON_TE       #: the stack's kernel-level choices
    cp_mla_latent: bool = False        #: what-if: the CP exchange carries MLA's latent (context_parallel.py)
    dp_rules: object = None            #: the stack's data-parallel rules (data_parallel.DataParallelRules); None: Megatron-Core's
    stack_options: dict = field(default_factory=dict)   #: the scenario's options of the stack (e.g. ``deepspeed``)



_NOSEG = (0.0, 0.0, 0.0, 0)
"""An absent segment: (FLOPs, seconds, host seconds, kernels)."""



class KernelRow(NamedTuple):
    """One kernel of a layer as the program runs it: the segment it is part of
    (``"<phase>:<part>"``, phase ``R`` for recomputation), the kernel record, its GPU seconds,
    the host seconds to issue it and the launches it makes."""

    segment: str
    kernel: object
    time_s: float
    host_s: float
    launches: int
    source: str = "model"
    """Where its time came from: ``measured`` (a kernel table) or ``model``."""


def _segment_key(ctx: _Ctx, layer: int, tokens_per_expert, recompute: str) -> tuple:
    # everything that makes one layer's ops differ from another's: its blocks, MTP, the
    # routed load, recompute, whether the recipe runs this layer's GEMMs in low precision
    # (precision_options may keep layers at the ends in BF16), and its attention window
    fixed = ctx.layer_keys.get(layer)
    if fixed is None:
        fixed = ctx.layer_keys[layer] = (tuple(b.kind for b in layer_blocks(ctx.model, layer)),
                                         layer >= ctx.model.num_layers,
                                         ctx.recipe.is_low_precision_layer(layer, ctx.model.num_layers),
                                         ctx.model.attention_window(layer))
    return (fixed[0], fixed[1], None if tokens_per_expert is None else tuple(tokens_per_expert), recompute,
            fixed[2], fixed[3])


def _launch_gap(compute: RooflineComputeModel) -> float:
    """Eager minus graphed launch cost per kernel, under the compute model's constants."""
    launch = compute.constants.get("workloads.costs.compute.LAUNCH_OVERHEAD_S")
    return launch[False] - launch[True]


SPLICE_LOAD_ROWS = True
"""Whether a routed layer's later loads rebuild only the ops the load shapes (False: every
load builds the whole layer; the same rows and segments either way)."""


def kernel_rows(ctx: _Ctx, layer: int, tokens_per_expert, recompute: str) -> list[KernelRow]:
    """One layer's kernels (quantisation included) with the segment of the program each runs in.

    Under a skewed routing every EP rank and micro-batch brings its own load, yet only the
    ops of :func:`~workloads.costs.flops.layer_load_ops` depend on it: the first load of a
    layer builds every row (:class:`_LoadTemplate`), later loads build only those ops and put
    their rows in the first load's places.  A row depends on its op alone (the compute model
    times each op by itself), so the rows are the ones the whole layer would give."""
    tpl, new = _routed(ctx, layer, tokens_per_expert, recompute)
    if tpl is None:
        return _rows(ctx, layer, _layer_ops(ctx, layer, tokens_per_expert, recompute, layer_ops))
    rows = list(tpl.rows)
    for i, row in zip(tpl.index, new or ()):
        rows[i] = row
    return rows


def _layer_ops(ctx: _Ctx, layer: int, tokens_per_expert, recompute: str, build) -> list:
    """``build``'s ops of ``layer`` (:func:`layer_ops` or :func:`layer_load_ops`) with the
    recipe's quantisation ops."""
    ops = build(ctx.model, ctx.par, layer, ctx.mbs, ctx.seq, tokens_per_expert=tokens_per_expert,
                recompute=recompute, fusion=ctx.fusion)
    return with_quantize_ops(ctx.recipe, ops, ctx.model.num_layers, ctx.fusion.float8_casts)


class _LoadTemplate(NamedTuple):
    """A routed layer's rows for the first load seen, where that load's ops sit among them
    (``index``), what they are (``signature``: name, phase, recompute flag and quantised GEMM
    of each), the rows' segments (:func:`_accumulate`) and, for each segment a load's op
    adds to, its value before the first such op and the rows added from there (``resume``:
    ``(value, [(position, scalar), ...])``)."""

    rows: list
    index: list
    signature: tuple
    segments: dict
    resume: dict


def _load_signature(ops) -> tuple:
    return tuple((o.name, o.phase, o.recompute, o.quantizes) for o in ops)


def _routed(ctx: _Ctx, layer: int, tokens_per_expert, recompute: str) -> tuple:
    """``(template, rows of this load's ops)`` of a routed layer (:func:`kernel_rows`); the
    rows None when the template was just built from this load; ``(None, None)`` where the
    whole layer must be built: no load, splicing off, a load whose ops differ in kind from the
    template's (a quantisation op absent for an expert without tokens, ...), or a layer whose
    load ops do not sit among its ops as :func:`layer_load_ops` says."""
    if tokens_per_expert is None or not SPLICE_LOAD_ROWS:
        return None, None
    tokens = tuple(tokens_per_expert)
    key = ("load_template", _segment_key(ctx, layer, None, recompute))
    tpl = ctx.seg_cache.get(key)
    load = _layer_ops(ctx, layer, tokens, recompute, layer_load_ops)
    if tpl is None:
        rows = _rows(ctx, layer, _layer_ops(ctx, layer, tokens, recompute, layer_ops))
        names = {o.name for o in load}
        index = [i for i, r in enumerate(rows) if r.kernel.name in names]
        tpl = False
        if [rows[i].kernel for i in index] == load:
            tpl = _LoadTemplate(rows, index, _load_signature(load), *_accumulate(ctx, rows, frozenset(index)))
        ctx.seg_cache[key] = tpl
        return tpl or None, None
    if tpl is False or tpl.signature != _load_signature(load):
        return None, None
    return tpl, _rows(ctx, layer, load)


def _targets(ctx: _Ctx, row: KernelRow) -> list:
    """``(segment, scalar)`` entries ``row`` adds to: its segment (FLOPs, seconds, host
    seconds, kernels) and where kept apart, the up-projection the cp_mla_latent what-if
    repeats per received chunk (the same four) and the GPU work after the dispatcher's host
    sync (``scalar``: seconds only, :func:`_dispatch_sync`)."""
    op = row.kernel
    out = [(row.segment, False)]
    base = op.quantizes or op.name
    if ctx.cp_mla_latent and base == "kv_up_proj" and not op.recompute:
        out.append((f"latent_up:{op.phase}", False))
    phase = row.segment.split(":", 1)[0]
    if base == "moe_permute" and phase != "B":
        out.append((f"{phase}:permute_s", True))
    return out


def _add(seg: dict, name: str, row: KernelRow, scalar: bool) -> None:
    if scalar:
        seg[name] = seg.get(name, 0.0) + row.time_s
        return
    acc = seg.setdefault(name, [0.0, 0.0, 0.0, 0])
    acc[0] += row.kernel.flops
    acc[1] += row.time_s
    acc[2] += row.host_s
    acc[3] += row.launches


def _accumulate(ctx: _Ctx, rows: list, loaded: frozenset = frozenset()) -> tuple[dict, dict]:
    """``(segments, resume)``: the rows summed into the segments between communication
    points, ``{"<phase>:<part>": [FLOPs, seconds, host seconds, kernels]}`` (row order), and
    the :class:`_LoadTemplate` ``resume`` entries of the rows at positions ``loaded``."""
    seg: dict = {}
    resume: dict = {}
    for pos, row in enumerate(rows):
        for name, scalar in _targets(ctx, row):
            if name in resume or pos in loaded:
                if name not in resume:
                    start = seg.get(name, 0.0 if scalar else [0.0, 0.0, 0.0, 0])
                    resume[name] = (start if scalar else list(start), [])
                resume[name][1].append((pos, scalar))
            _add(seg, name, row, scalar)
    return seg, resume


def _replayed(tpl: _LoadTemplate, new: list) -> dict:
    """The segments of the template's layer under another load (its ops' rows ``new``, in
    the template's ``index`` order): the template's segments where no load op adds, the
    others summed again from where the first load op adds, in the same order."""
    at = dict(zip(tpl.index, new))
    seg: dict = {}
    for name, value in tpl.segments.items():
        plan = tpl.resume.get(name)
        if plan is None:
            seg[name] = list(value) if isinstance(value, list) else value
            continue
        start, steps = plan
        seg[name] = list(start) if isinstance(start, list) else start
        for pos, scalar in steps:
            _add(seg, name, at.get(pos) or tpl.rows[pos], scalar)
    return seg


class _RowContext(NamedTuple):
    """What the rows of one layer's ops share (:func:`_rows`), kept per layer."""

    blocks: tuple
    parts: dict            #: op name -> the part of the layer it runs in (default ``mlp``)
    cp_parts: dict         #: with CP, op name -> the part it runs in instead
    graphed: frozenset     #: the CUDA-graph scopes that capture the layer's kernels
    gap: float             #: launch seconds a graphed kernel saves
    scopes: dict           #: op name -> its graph scope (filled as ops are seen)


def _row_context(ctx: _Ctx, layer: int) -> _RowContext:
    hit = ctx.row_context.get(layer)
    if hit is None:
        blocks = layer_blocks(ctx.model, layer)
        parts = {name: part for b in blocks for name, part in b.SEGMENTS.items()}
        cp_parts = {name: part for b in blocks for name, part in b.CP_SEGMENTS.items()} if ctx.par.cp > 1 else {}
        graphed = ctx.host.graphed if layer < ctx.model.num_layers else frozenset()     # MTP modules stay eager
        # a graphed kernel leaves the GPU the graph's launch gap instead of the eager one
        gap = (_launch_gap(ctx.compute)
               if graphed and isinstance(ctx.compute, RooflineComputeModel) and not ctx.compute.cuda_graphs else 0.0)
        hit = ctx.row_context[layer] = _RowContext(blocks, parts, cp_parts, graphed, gap, {})
    return hit


def _rows(ctx: _Ctx, layer: int, ops: list) -> list[KernelRow]:
    """The rows of ``ops``, kernels of ``layer`` (:func:`kernel_rows`)."""
    rc = _row_context(ctx, layer)
    times = ctx.compute.op_times_s(ops)
    source_of = getattr(ctx.compute, "op_source", None)
    graphed, host = rc.graphed, ctx.host
    rows = []
    for op, t in zip(ops, times):
        phase = "R" if op.recompute else op.phase
        base = op.quantizes or op.name        # a quantisation op belongs with its GEMM
        # Transformer Engine issues a grouped GEMM (and the quantisation of its input) once per
        # local expert with tokens, from a C++ loop: launches beyond the first expert's
        rounds = op.kernel_rounds
        looped = rounds - 1 if host.expert_launch_s else 0
        host_s = op.num_kernels * host.kernel_s + looped * host.expert_launch_s
        if graphed:
            scope = rc.scopes.get(base)
            if scope is None:
                scope = rc.scopes[base] = graph_scope_of(base, rc.blocks)
            if scope in graphed or (scope in ("moe_router", "moe") and "moe" in graphed):
                host_s = 0.0
                t = float(t) - op.num_kernels * rounds * rc.gap         # (op.launches)
        part = rc.cp_parts.get(base)            # with CP: core attention per ring step, between the exchanges
        if part is None or (part == "attn_post" and phase == "R"):
            part = rc.parts.get(base, "mlp")
        rows.append(KernelRow(f"{phase}:{part}", op, float(t), host_s, op.num_kernels + looped,
                              source_of(op) if source_of is not None else "model"))
    return rows


def _segments(ctx: _Ctx, layer: int, tokens_per_expert, recompute: str) -> dict[str, list]:
    """One layer's compute ops grouped into the segments between communication points:
    ``{"<phase>:<part>": [FLOPs, seconds, host seconds, kernels]}``; with activation offload
    the compute stream's waits for the host copies (:func:`_offload_stalls`) are added to the
    layer's last forward segment and to the segment its backward starts with."""
    seg = _kernel_segments(ctx, layer, tokens_per_expert, recompute)
    stash = ctx.model.moe is not None and ctx.model.moe.paged_stash
    if not (ctx.par.offload_modules or ctx.par.offload_activation_layers or stash) or layer >= ctx.model.num_layers:
        return seg
    fwd, bwd = _offload_stalls(ctx, tokens_per_expert, recompute)
    if not (fwd[layer] or bwd[layer]):
        return seg
    key = ("offload", layer, _segment_key(ctx, layer, tokens_per_expert, recompute))
    hit = ctx.seg_cache.get(key)
    if hit is None:
        hit = {k: list(v) if isinstance(v, list) else v for k, v in seg.items()}
        lists = [k for k, v in hit.items() if isinstance(v, list)]
        hit[[k for k in lists if k.startswith("F:")][-1]][1] += fwd[layer]
        b = "B:mlp" if "B:mlp" in hit else next(k for k in lists if k.startswith("B:"))
        hit[b][1] += bwd[layer]
        ctx.seg_cache[key] = hit
    return hit


def gpu_of(ctx: _Ctx):
    """The GPU spec behind the compute model (a measured model's roofline fallback's)."""
    for model in (ctx.compute, getattr(ctx.compute, "fallback", None)):
        if getattr(model, "gpu", None) is not None:
            return model.gpu
    from topologies import ConfigError
    raise ConfigError("offload", "measured compute", "host copies need the GPU's spec: give the measured compute "
                                                     "model a roofline fallback")


_STASHED = ("expert_input", "expert_fc1_output", "expert_fc2_input")
"""The routed experts' saved tensors Megatron-Core's paged stash packs."""


def _offload_stalls(ctx: _Ctx, tokens_per_expert, recompute: str) -> tuple[list, list]:
    """Per decoder layer, the seconds the compute stream waits for side-stream copies before
    its forward and its backward (:func:`workloads.offload.activation_offload_stalls`): the
    host offload's (each layer's saved bytes, :func:`workloads.memory.layer_activation_bytes`
    with GEMM inputs in the recipe's format, over the GPU's host link) plus the MoE paged
    stash's (the routed experts' saved bytes read and written at HBM bandwidth on Megatron-Core's
    pack and unpack streams, waited for one layer later: megatron/core/transformer/moe/
    paged_stash.py @ d98e8a6, ``stash_paged_tensors`` / ``wait_for_stash_to_complete``)."""
    key = ("offload_stalls", None if tokens_per_expert is None else tuple(tokens_per_expert), recompute)
    hit = ctx.seg_cache.get(key)
    if hit is not None:
        return hit
    from ...memory import layer_activation_bytes
    from ...offload import activation_offload_stalls, host_link_bytes_per_s, offloaded_terms, paged_stash_copy_s
    lb = ctx.recipe.tp_gather_bytes_per_element if ctx.recipe.fprop_format != "BF16" else None
    gpu = gpu_of(ctx)
    link = host_link_bytes_per_s(gpu)
    fwd, bwd, copy, stash = [], [], [], []
    for i in range(ctx.model.num_layers):
        seg = _kernel_segments(ctx, i, tokens_per_expert, recompute)
        fwd.append(sum(v[1] for k, v in seg.items() if k[:2] == "F:" and isinstance(v, list)))
        bwd.append(sum(v[1] for k, v in seg.items() if k[:2] in ("B:", "W:") and isinstance(v, list)))
        saved = layer_activation_bytes(ctx.model, ctx.par, i, linear_input_bytes=lb)
        stash.append(paged_stash_copy_s(sum(saved[k] for k in _STASHED), gpu.hbm_bandwidth_bytes_per_s))
        if ctx.par.offload_modules:
            saved = offloaded_terms(saved, ctx.par.offload_modules)
        copy.append(sum(saved.values()) / link)
    if ctx.par.offload_modules:          # every layer, one layer's set double-buffered
        hit = activation_offload_stalls(fwd, bwd, copy, len(fwd), keep=1)
    elif ctx.par.offload_activation_layers:
        hit = activation_offload_stalls(fwd, bwd, copy, ctx.par.offload_activation_layers)
    else:
        hit = [0.0] * len(fwd), [0.0] * len(fwd)
    if ctx.model.moe is not None and ctx.model.moe.paged_stash:
        more = activation_offload_stalls(fwd, bwd, stash, len(fwd), keep=1)
        hit = [a + b for a, b in zip(hit[0], more[0])], [a + b for a, b in zip(hit[1], more[1])]
    ctx.seg_cache[key] = hit
    return hit


def _kernel_segments(ctx: _Ctx, layer: int, tokens_per_expert, recompute: str) -> dict[str, list]:
    """:func:`_segments` without the offload waits."""
    key = _segment_key(ctx, layer, tokens_per_expert, recompute)
    hit = ctx.seg_cache.get(key)
    if hit is not None:
        return hit
    tpl, new = _routed(ctx, layer, tokens_per_expert, recompute)
    if tpl is None:
        seg = _accumulate(ctx, _rows(ctx, layer, _layer_ops(ctx, layer, tokens_per_expert, recompute, layer_ops)))[0]
    else:
        seg = _replayed(tpl, new or [tpl.rows[i] for i in tpl.index])
    ctx.seg_cache[key] = seg
    return seg


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


@dataclass
class _Stage:
    """What every action of one stage's program needs to know about the stage."""

    index: int
    tokens: dict                  #: (layer, mb) -> tokens per local expert
    layers: list                  #: the layers of each of the stage's chunks
    num_layers: int               #: layers on the stage, all chunks
    act_p2p: float                #: bytes of one pipeline transfer of a rank
    last_mb: dict                 #: chunk -> the micro-batch whose weight gradient comes last
    buckets: object               #: the stage's gradient buckets (data_parallel._GradBuckets)


def _host_of(ctx, ops) -> tuple[float, int]:
    """(host seconds, kernels) to issue ``ops``."""
    k = sum(o.num_kernels for o in ops)
    return k * ctx.host.kernel_s, k
