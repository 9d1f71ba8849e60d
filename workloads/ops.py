"""The op taxonomy: what one entry of a rank's step program is, in one vocabulary.

A program (:mod:`workloads.program`) is a list of :class:`Op` rows.  Every field that code
dispatches on is a member of one of the enumerations below, never a string that a reader
has to search for:

===========  ==================================================================================
``kind``     :class:`OpKind`: compute, collective, send, recv, or a host synchronisation
``stream``   :class:`Stream`: the GPU stream that runs it (compute, or the communication axis)
``coll``     :class:`Coll`: the collective (all-reduce, all-gather, reduce-scatter, all-to-all,
             send/recv)
``group``    :class:`Group`: the process group it runs on -- a mesh-axis expression of
             :data:`workloads.mesh.GROUP_AXES`, or ``embedding`` / ``world``
``phase``    :class:`Phase`: forward, backward (input gradients), weight gradients, recompute,
             step end
``name``     :class:`OpName`: which op of the step it is (the attention block's forward, a
             dense gradient bucket, an all-to-all dispatch, ...)
===========  ==================================================================================

The members are :class:`enum.StrEnum`: they compare and hash as their values, so a timeline,
a CSV or a JSON file holds the plain strings (``"compute"``, ``"grad_dense"``) and code may
compare a column with either.

What an op *is for* is asked through the predicates at the bottom (:func:`is_grad_bucket`,
:func:`is_param_gather`, :func:`is_fsdp_gather`, ...), which the engine, the analytic
estimator and folding share; a new op joins a role by joining the set behind its
predicate, in this module only.

Where the ops that come next fit (each is a new :class:`OpName` member and, where the
engine must treat it apart, a predicate here):

* state-space (Mamba) layers: ``COMPUTE`` ops for the chunked scan, the depthwise
  convolution and the gated norm, costed by the bytes their kernels move;
* dropped tokens: not an op but the sizes of the ``EP_DISPATCH`` / ``EP_COMBINE``
  all-to-alls and the expert GEMMs' FLOPs, with the counts kept on the program;
* activation offload: copies on a host-transfer stream (a new :class:`Stream` member), with
  predicates for the reload that a backward op must wait for.

>>> from workloads.ops import OpName, Stream, is_grad_bucket
>>> OpName.GRAD_DENSE == "grad_dense", Stream.DP
(True, <Stream.DP: 'dp'>)
>>> is_grad_bucket(OpName.GRAD_DENSE), is_grad_bucket(OpName.GRAD_NORM)
(True, False)
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

__all__ = ["FSDP2_COPIES", "Issue", "Op", "OpKind", "Stream", "Coll", "Group", "Phase", "OpName", "is_p2p", "is_collective",
           "is_grad_bucket", "is_param_gather", "is_fsdp_gather", "is_grad_norm", "is_ep_combine", "ep_a2a_matrix",
           "is_step_sync", "is_cp_hop", "is_te_async", "is_host_sync",
           "GRAD_BUCKETS", "PARAM_GATHERS", "FSDP_GATHERS", "EP_COMBINES", "EP_TO_SOURCE", "CP_HOPS", "TE_ASYNC",
           "STEP_SYNC_GROUPS"]


class OpKind(StrEnum):
    """What the op does with the GPU: computes, joins a collective, or sends / receives."""

    COMPUTE = "compute"
    COLLECTIVE = "collective"
    SEND = "send"
    RECV = "recv"
    HOST_SYNC = "host_sync"
    """The host waits until the compute stream has reached this point of the program (a
    device-to-host copy it needs the value of); nothing runs on the GPU.  ``duration_s``
    holds the lag: the seconds of the preceding compute op that lie after the point the
    host waits for (work the program places in that op but the framework runs later)."""


class Stream(StrEnum):
    """The stream an op runs on: compute, or the communication of one parallel axis."""

    COMPUTE = "compute"
    TP = "tp"           #: tensor (and sequence, and expert-tensor) parallel collectives
    CP = "cp"           #: context-parallel K/V exchange
    EP = "ep"           #: expert-parallel all-to-all
    PP = "pp"           #: pipeline send / recv
    DP = "dp"           #: gradient reduction, parameter gathers, step-end reductions


class Coll(StrEnum):
    """The collective an op runs (nccl-tests' names); ``NONE`` for compute."""

    NONE = ""
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    SEND_RECV = "send_recv"


class Group(StrEnum):
    """The process group of a collective: a row of :data:`workloads.mesh.GROUP_AXES`
    (``dp_cp``: the dense data-parallel ranks of all CP ranks; ``etp`` / ``edp``: expert
    tensor / data parallel), the tied-embedding group, or every rank."""

    NONE = ""
    TP = "tp"
    SP = "sp"
    CP = "cp"
    PP = "pp"
    DP = "dp"
    DP_CP = "dp_cp"
    TP_CP = "tp_cp"
    ETP = "etp"
    EP = "ep"
    EDP = "edp"
    EMBEDDING = "embedding"
    WORLD = "world"


class Phase(StrEnum):
    """When in the step an op runs."""

    F = "F"             #: forward
    B = "B"             #: backward: input gradients (and weight gradients unless split into W)
    W = "W"             #: weight gradients (zero-bubble schedules split them out)
    R = "R"             #: recomputed forward ahead of the backward
    S = "S"             #: step end: optimizer, gradient norm, parameter gathers


class OpName(StrEnum):
    """Every op a step program contains (:mod:`workloads.program`)."""

    # -- compute: a layer's ops fused into the segments between communication points ---------
    ATTN = "attn"                           #: attention block forward (norm, QKV, core attention, out proj)
    MLP = "mlp"                             #: dense MLP block forward
    MOE_PRE = "moe_pre"                     #: MoE: norm, router, permute before the dispatch
    EXPERTS = "experts"                     #: MoE: the local experts' GEMMs
    MOE_POST = "moe_post"                   #: MoE: unpermute and residual after the combine
    MAMBA = "mamba"                         #: Mamba-2 mixer forward (norm, in_proj, conv1d, scan, gated norm, out_proj)
    MAMBA_BWD = "mamba_bwd"
    GDN = "gdn"                             #: gated DeltaNet mixer forward (norm, in_proj, conv1d, scan, gated norm, out_proj)
    GDN_BWD = "gdn_bwd"
    ATTN_BWD = "attn_bwd"
    MLP_BWD = "mlp_bwd"
    MOE_PRE_BWD = "moe_pre_bwd"
    EXPERTS_BWD = "experts_bwd"
    MOE_POST_BWD = "moe_post_bwd"
    WGRAD = "wgrad"                         #: a layer's weight gradients (zero-bubble W)
    RECOMPUTE_ATTN = "recompute_attn"       #: selective recompute of the attention block's parts
    RECOMPUTE_MLP = "recompute_mlp"
    RECOMPUTE_PRE = "recompute_pre"
    RECOMPUTE_POST = "recompute_post"
    MOE_HOST_SYNC = "moe_host_sync"         #: dropless MoE: the dispatcher copies token counts to the host
    EMBEDDING = "embedding"
    EMBEDDING_WGRAD = "embedding_wgrad"
    OUTPUT_LOSS = "output_loss"             #: output layer, cross-entropy loss (last stage)
    OUTPUT_LOSS_BWD = "output_loss_bwd"
    OUTPUT_WGRAD = "output_wgrad"
    WEIGHT_QUANTIZE = "weight_quantize"     #: low-precision recipes: quantise the weights once a step
    OPTIMIZER = "optimizer"
    # -- tensor / sequence / expert-tensor parallel -----------------------------------------
    SP_AG = "sp_ag"                         #: SP: all-gather the block's input
    SP_RS = "sp_rs"                         #: SP: reduce-scatter the block's output
    TP_AR = "tp_ar"                         #: no SP: all-reduce the block's output
    SP_AG_DOUT = "sp_ag_dout"               #: backward: gather the output gradient
    SP_AG_INPUT = "sp_ag_input"             #: backward: re-gather the input for the wgrad
    SP_RS_DGRAD = "sp_rs_dgrad"
    TP_AR_DGRAD = "tp_ar_dgrad"
    ETP_AG = "etp_ag"                       #: expert TP: gather the received tokens
    ETP_RS = "etp_rs"
    ETP_AG_BWD = "etp_ag_bwd"
    ETP_RS_BWD = "etp_rs_bwd"
    P2P_GATHER = "p2p_gather"               #: Megatron-LM's scatter/gather of pipeline tensors
    # -- context parallel --------------------------------------------------------------------
    CP_KV = "cp_kv"                         #: all_gather: K/V all-gather over the CP group
    CP_KV_BWD = "cp_kv_bwd"
    CP_DKV = "cp_dkv"                       #: all_gather: dK/dV reduce-scatter
    CP_HOP = "cp_hop"                       #: p2p ring attention: one K/V hop to the next CP rank
    CP_HOP_BWD = "cp_hop_bwd"               #: ... backward: K/V and/or dK/dV
    CP_A2A_QKV = "cp_a2a_qkv"               #: a2a (Ulysses): Q, K, V from sequence- to head-split
    CP_A2A_OUT = "cp_a2a_out"               #: ... the output back to sequence-split
    CP_A2A_DOUT = "cp_a2a_dout"             #: ... backward: the output gradient to head-split
    CP_A2A_DQKV = "cp_a2a_dqkv"             #: ... dQ, dK, dV back to sequence-split
    CORE_ATTN = "core_attn"                 #: with CP: core attention (one block per ring step)
    CORE_ATTN_BWD = "core_attn_bwd"
    ATTN_OUT = "attn_out"                   #: with CP: the attention block after core attention
    ATTN_OUT_BWD = "attn_out_bwd"
    CP_MAMBA_A2A = "cp_mamba_a2a"           #: Mamba layer: sequence-split <-> head-split all-to-all
    CP_MAMBA_A2A_BWD = "cp_mamba_a2a_bwd"
    # -- expert parallel ---------------------------------------------------------------------
    EP_DISPATCH = "ep_dispatch"
    EP_COMBINE = "ep_combine"
    EP_COMBINE_BWD = "ep_combine_bwd"
    EP_DISPATCH_BWD = "ep_dispatch_bwd"
    # -- pipeline ----------------------------------------------------------------------------
    RECV_ACT = "recv_act"
    SEND_ACT = "send_act"
    RECV_GRAD = "recv_grad"
    SEND_GRAD = "send_grad"
    # -- data parallel and step end ----------------------------------------------------------
    GRAD_DENSE = "grad_dense"               #: a dense gradient bucket's reduction
    GRAD_EXPERT = "grad_expert"             #: an expert gradient bucket's reduction
    PARAM_GATHER_DENSE = "param_gather_dense"     #: distributed optimizer: a bucket's parameters
    PARAM_GATHER_EXPERT = "param_gather_expert"
    FSDP_GATHER = "fsdp_gather"             #: ZeRO-3: a layer's parameters before its forward
    FSDP_GATHER_BWD = "fsdp_gather_bwd"     #: ... and before its backward
    FSDP_COPY = "fsdp_copy"                 #: FSDP2: a gather's copy-in of the shard and copy-out of the parameters
    FSDP_GRAD_COPY = "fsdp_grad_copy"       #: FSDP2: gradients copied into the reduce-scatter input
    TIED_EMBEDDING_GRAD = "tied_embedding_grad"
    GRAD_NORM = "grad_norm"
    # -- what-if: context parallelism exchanging MLA's latent (cp_mla_latent) ---------------
    CP_LATENT_UP = "cp_latent_up"           #: up-projection of a received chunk's latent to per-head K/V
    CP_LATENT_UP_BWD = "cp_latent_up_bwd"   #: ... backward: recomputed up-projection, dgrad to the latent, wgrad


class Issue(StrEnum):
    """How an op is issued relative to the rank's compute stream.  The kernel stack's lowering
    sets it (:func:`workloads.stacks.megatron_te.issue.assign_issue_modes`, from the scenario's
    ``overlap`` switches); the engine and the estimator read it and never re-derive it."""

    BLOCKING = "blocking"
    """The rank waits for the op before its next one (compute, and collectives by default)."""
    BESIDE_NEXT = "beside_next"
    """A short exchange that runs while the next compute op computes and slows it while in
    flight; the op after that waits for it (CP ring hops, Transformer Engine's asynchronous
    input re-gather)."""
    OVERLAP_NEXT = "overlap_next"
    """Runs alongside the next compute op (Transformer Engine's userbuffer TP overlap); the op
    after that waits for it."""
    DP_STREAM = "dp_stream"
    """On the data-parallel stream; waited for only where its result is needed (overlapped
    gradient buckets and parameter gathers)."""
    PREFETCH = "prefetch"
    """Issued ahead of its turn, before the compute op that precedes it (ZeRO-3 / FSDP
    per-layer parameter gathers)."""


class Op(NamedTuple):
    """One entry of a rank class's program (SI units)."""

    stream: Stream
    kind: OpKind
    name: OpName
    layer: int           #: -1 where not a layer op
    microbatch: int      #: -1 where not per micro-batch
    chunk: int
    phase: Phase
    flops: float
    duration_s: float
    coll: Coll
    group: Group
    seq: int             #: per-group sequence number (collectives), -1 otherwise
    size_bytes: float
    peer: int            #: p2p: the other stage; -1 otherwise
    tag: tuple | None    #: p2p: (src stage, dst stage, chunk, microbatch, phase); all-to-all: (layer, mb)
    lane: int = 0        #: DualPipe F&B pair: 1 = its forward half, 2 = its backward half; 0 otherwise
    host_s: float = 0.0  #: host time to issue the op (compute: its kernels; a call or a p2p batch)
    host_ops: int = 0    #: kernels (compute) or calls the host issues for it
    issue: Issue = Issue.BLOCKING    #: how the op is issued relative to compute (:class:`Issue`)


# -- roles --------------------------------------------------------------------------------------
GRAD_BUCKETS = frozenset({OpName.GRAD_DENSE, OpName.GRAD_EXPERT})
PARAM_GATHERS = frozenset({OpName.PARAM_GATHER_DENSE, OpName.PARAM_GATHER_EXPERT})
FSDP_GATHERS = frozenset({OpName.FSDP_GATHER, OpName.FSDP_GATHER_BWD})
FSDP2_COPIES = frozenset({OpName.FSDP_COPY, OpName.FSDP_GRAD_COPY})
"""FSDP2's copies around its collectives: short compute ops that a prefetched gather does not
hide behind -- the gather is issued before the layer's compute that precedes them (the engine's
prefetch looks past them; the estimator does not let them absorb a pending gather)."""
EP_COMBINES = frozenset({OpName.EP_COMBINE, OpName.EP_COMBINE_BWD})
#: The expert-parallel all-to-alls whose data flows from the experts' ranks back to the
#: tokens' source ranks: the forward combine (outputs) and the backward of the dispatch
#: (input gradients).  The forward dispatch and the backward of the combine (output
#: gradients to the experts) flow source -> experts.
EP_TO_SOURCE = frozenset({OpName.EP_COMBINE, OpName.EP_DISPATCH_BWD})
CP_HOPS = frozenset({OpName.CP_HOP, OpName.CP_HOP_BWD})
TE_ASYNC = frozenset({OpName.SP_AG_INPUT})
"""TP collectives of the backward that run alongside the next compute op even without
Transformer Engine's userbuffer overlap: a column-parallel linear's backward re-gathers its
input for the wgrad GEMM with ``async_op=True`` and computes the dgrad GEMM meanwhile
(``transformer_engine/pytorch/module/linear.py`` ``_Linear.backward``).  The same code then
reduces the dgrad asynchronously while it computes the wgrad GEMM; overlapping that reduction
took the vTrain A100 set (Megatron-DeepSpeed, TP all-reduces) from a 4.4 % to an 8.0 %
median error, all of it predicted fast, so it stays blocking here."""
STEP_SYNC_GROUPS = frozenset({Group.WORLD, Group.EMBEDDING, Group.DP_CP, Group.EDP})
"""Groups whose collectives end an overlapped exchange: the data-parallel and step-end
reductions wait for a CP / TP collective still overlapping the last compute op."""

# -- members as module globals, for code that runs once per op ---------------------------------
# On Python 3.11 reading a member off its enum class (``OpKind.SEND``) costs about 0.14 us, a
# module global under 0.02 us (timeit); the engine's actor loop, the estimator and the
# predicates below compare with these.
KIND_COMPUTE, KIND_COLLECTIVE, KIND_SEND, KIND_RECV = OpKind.COMPUTE, OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV
KIND_HOST_SYNC = OpKind.HOST_SYNC
STREAM_COMPUTE, STREAM_PP = Stream.COMPUTE, Stream.PP
COLL_ALL_GATHER, COLL_ALL_TO_ALL = Coll.ALL_GATHER, Coll.ALL_TO_ALL
GROUP_CP, GROUP_TP = Group.CP, Group.TP
PHASE_F, PHASE_B, PHASE_R = Phase.F, Phase.B, Phase.R
_P2P_KINDS = frozenset({KIND_SEND, KIND_RECV})
_GRAD_NORM = OpName.GRAD_NORM


def is_p2p(op: Op) -> bool:
    """A pipeline send or receive."""
    return op.kind in _P2P_KINDS


def is_host_sync(op: Op) -> bool:
    """A point where the host waits for the GPU (:attr:`OpKind.HOST_SYNC`)."""
    return op.kind == KIND_HOST_SYNC


def is_collective(op: Op) -> bool:
    return op.kind == KIND_COLLECTIVE


def is_grad_bucket(op: "Op | OpName") -> bool:
    """A gradient bucket's reduction (reduce-scatter or all-reduce over data parallel)."""
    return _name(op) in GRAD_BUCKETS


def is_param_gather(op: "Op | OpName") -> bool:
    """A distributed-optimizer parameter all-gather after the optimizer step."""
    return _name(op) in PARAM_GATHERS


def is_fsdp_gather(op: "Op | OpName") -> bool:
    """A ZeRO-3 / FSDP per-layer parameter gather (forward or backward)."""
    return _name(op) in FSDP_GATHERS


def is_grad_norm(op: "Op | OpName") -> bool:
    """The gradient-norm all-reduce that waits for every gradient bucket."""
    return _name(op) == _GRAD_NORM


def is_ep_combine(op: "Op | OpName") -> bool:
    """An expert-parallel combine all-to-all, forward or backward (by name; which way its
    data flows is :func:`ep_a2a_matrix`'s business)."""
    return _name(op) in EP_COMBINES


def ep_a2a_matrix(op: "Op | OpName", dispatch):
    """The per-peer sizes ``[src, dst]`` of an expert-parallel all-to-all from the dispatch
    matrix (:attr:`workloads.program.Program.a2a_sizes`): by direction, the forward combine
    and the backward of the dispatch send from the experts' ranks back to the sources (the
    transpose); the forward dispatch and the backward of the combine (the output gradients
    go to the experts that made the outputs) send as the dispatch does."""
    return dispatch.T if _name(op) in EP_TO_SOURCE else dispatch
def is_cp_hop(op: "Op | OpName") -> bool:
    """A ring-attention K/V (or dK/dV) hop: it runs while the next core-attention block
    computes (``overlap.cp_comm``)."""
    return _name(op) in CP_HOPS


def is_te_async(op: "Op | OpName") -> bool:
    """A TP collective that runs while the next compute op computes without ``overlap.tp_comm``
    (:data:`TE_ASYNC`)."""
    return _name(op) in TE_ASYNC


def is_step_sync(op: Op) -> bool:
    """A collective over a data-parallel or step-end group (:data:`STEP_SYNC_GROUPS`)."""
    return op.kind == KIND_COLLECTIVE and op.group in STEP_SYNC_GROUPS


def _name(op) -> str:
    return op.name if isinstance(op, Op) else op
