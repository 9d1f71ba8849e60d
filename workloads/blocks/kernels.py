"""Kernels: the typed records a block's work is made of, and their constructors.

A :class:`ComputeOp` is one kernel (or one fused group of kernels) of one rank for one
micro-batch, in one phase: ``F`` forward, ``B`` input gradient (and recomputation), ``W``
weight gradient.  Its ``op_class`` says which descriptor it is and which sub-model of
:mod:`workloads.costs.compute` times it:

* ``gemm`` -- ``Y[m, n] = X[m, k] W[k, n]`` (``m, n, k``), optionally grouped (``groups``:
  per-group sizes of the token dimension, e.g. one group per local expert);
* ``attention`` -- fused core attention: ``m`` query tokens and ``n`` key tokens per
  sequence on this rank, ``k`` the query/key head dimension, FLOPs already reduced to the
  executed share of the mask (causal or windowed);
* ``elementwise`` -- memory-bound: ``mem_bytes`` read and written once over HBM.

:attr:`ComputeOp.descriptor` gives the same as a typed record: :class:`Gemm` ``(m, n, k,
groups)``, :class:`AttentionShape` ``(batch, heads, kv_heads, q_len, kv_len, d_qk, d_v, mask,
window, cp)`` or :class:`MemoryBound` ``(bytes, kind)``.

The constructors here (:func:`linear`, :func:`grouped_linear`, :func:`ew_pair`,
:func:`norm`, :func:`residual`, :func:`activation`, :func:`attention`, :func:`bmm`) are what
the block modules build their kernels from; :class:`LayerOps` collects a layer's kernels as
its blocks add them.  Nothing here knows a layer family.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from topologies import ConfigError
from topologies.constants import value as active_value

__all__ = ["ACT_BYTES", "ATTN_BLOCK_SIZE", "act_bytes", "attn_block_size", "AttentionShape", "ComputeOp", "Gemm", "MemoryBound", "EXPERT_GROUPED_LINEARS", "LayerOps", "Shard", "activation",
           "attention", "bmm", "causal_executed_fraction", "ew", "ew_pair", "gemm_role", "grouped_linear", "linear",
           "norm", "residual", "window_executed_fraction"]

ACT_BYTES = 2
"""Bytes per activation element: BF16 activations (Megatron ``--bf16``; FP8 recipes keep
activations between GEMMs in BF16 too)."""

ATTN_BLOCK_SIZE = 128
"""FlashAttention key/query tile for the causal diagonal: 128 x 128 in FA3's causal
forward for head dim 128 on H100 (Dao-AILab/flash-attention ``hopper/`` tile_size_fwd_sm90:
kBlockM = kBlockN = 128 for causal hdim 128); FA2 on A100 uses 128 x 64 or 128 x 128."""



def act_bytes() -> float:
    """:data:`ACT_BYTES` under the active constants (:mod:`topologies.constants`)."""
    return active_value("workloads.blocks.kernels.ACT_BYTES", ACT_BYTES)


def attn_block_size() -> int:
    """:data:`ATTN_BLOCK_SIZE` under the active constants (:mod:`topologies.constants`)."""
    return active_value("workloads.blocks.kernels.ATTN_BLOCK_SIZE", ATTN_BLOCK_SIZE)


FP32 = 4
MASK_BYTES = 1        # torch dropout mask: one byte per element


class Gemm(NamedTuple):
    """A GEMM ``Y[m, n] = X[m, k] W[k, n]``, or a grouped one (``groups``: per-group sizes of the
    token dimension)."""

    m: int
    n: int
    k: int
    groups: tuple = ()


class AttentionShape(NamedTuple):
    """Fused core attention of one rank for one micro-batch: ``batch`` sequences, ``heads``
    query heads and ``kv_heads`` key/value heads on this rank, ``q_len`` query tokens per
    sequence (this rank's CP share) against ``kv_len`` keys, head dimensions ``d_qk`` and
    ``d_v``, the mask (``causal``, ``window`` with ``window`` tokens, or ``full``) and the
    context-parallel degree it is split over."""

    batch: int
    heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    d_qk: int
    d_v: int
    mask: str
    window: int | None
    cp: int
    backend: str = "flash"
    """The kernel that runs it (:data:`workloads.costs.compute.ATTENTION_BACKENDS`)."""


class MemoryBound(NamedTuple):
    """A memory-bound kernel (or fused group): ``bytes`` read and written once over HBM;
    ``kind`` names what it does (the op's name)."""

    bytes: float
    kind: str


class ComputeOp(NamedTuple):
    """One compute kernel (or fused group) of one rank for one micro-batch.

    ``op_class`` selects the sub-model that times it: ``gemm`` (tile-quantised matmul
    efficiency in the recipe's dtype), ``attention`` (FlashAttention efficiency) or
    ``elementwise`` (bytes over HBM).
    """

    name: str
    """Stable op name, e.g. ``qkv_proj``, ``core_attn``, ``mlp_norm`` (keys of measured CSVs)."""
    phase: str
    """``F`` forward, ``B`` input gradient (and recomputation), ``W`` weight gradient."""
    op_class: str
    """``gemm`` | ``attention`` | ``elementwise``."""
    flops: float
    """Executed FLOPs (0 for element-wise ops)."""
    m: int = 0
    """GEMM rows M (attention: query tokens per sequence on this rank)."""
    n: int = 0
    """GEMM columns N (attention: key tokens per sequence)."""
    k: int = 0
    """GEMM reduction K (attention: query/key head dimension)."""
    mem_bytes: float = 0.0
    """Bytes moved over HBM (GEMMs: at BF16 inputs; the compute model recomputes them per dtype)."""
    num_kernels: int = 1
    """Kernel launches the op stands for (launch-overhead model)."""
    layer: int = -1
    """Decoder layer index (``num_layers + j`` for MTP module ``j``); -1 outside layers."""
    recompute: bool = False
    """Forward work re-run during the backward (activation recomputation)."""
    groups: tuple = ()
    """Grouped GEMMs (MoE experts): per-group sizes of the token dimension -- ``m`` for
    fprop and dgrad, ``k`` for wgrad (see :func:`gemm_role`).  Empty for one GEMM."""
    quantizes: str = ""
    """A quantisation op: the name of the GEMM whose input it quantises (it belongs to that
    GEMM's block); empty otherwise."""
    attention: AttentionShape | None = None
    """Core attention: its full shape (``m, n, k`` hold query tokens, keys and ``d_qk``)."""

    @property
    def descriptor(self) -> Gemm | AttentionShape | MemoryBound:
        """The kernel as a typed descriptor: :class:`Gemm`, :class:`AttentionShape` or
        :class:`MemoryBound`."""
        if self.op_class == "gemm":
            return Gemm(self.m, self.n, self.k, self.groups)
        if self.op_class == "attention" and self.attention is not None:
            return self.attention
        return MemoryBound(self.mem_bytes, self.name)

    @property
    def kernel_rounds(self) -> int:
        """How many times the op's ``num_kernels`` launch: once per local expert with tokens
        for an expert grouped linear (:data:`EXPERT_GROUPED_LINEARS`) and the quantisation of
        its input -- Transformer Engine's grouped linear runs each expert's GEMM and slice as
        kernels of their own -- and once otherwise (a batched GEMM is one kernel)."""
        if not self.groups or (self.quantizes or self.name) not in EXPERT_GROUPED_LINEARS:
            return 1
        return max(sum(1 for g in self.groups if g > 0), 1)

    @property
    def launches(self) -> int:
        """Kernels the op launches on the GPU: ``num_kernels x kernel_rounds``."""
        return self.num_kernels * self.kernel_rounds


EXPERT_GROUPED_LINEARS = frozenset({"expert_fc1", "expert_fc2"})
"""The routed experts' grouped GEMMs (their ``groups`` are local experts; a batched GEMM's
groups, e.g. unfused attention's, are one kernel)."""


class Shard(NamedTuple):
    """One rank's share of one micro-batch: ``b`` sequences of ``s`` tokens, ``tp`` / ``cp``
    degrees, sequence parallelism ``sp``; ``T`` the tokens a rank's TP-sharded GEMMs see,
    ``Tn`` those its norms, residual adds and router see (``T / tp`` with SP)."""

    b: int
    s: int
    tp: int
    cp: int
    sp: bool
    T: int
    Tn: int


def gemm_role(op: ComputeOp) -> str:
    """``fprop`` for forward and recomputed GEMMs, ``dgrad`` for ``B``, ``wgrad`` for ``W``."""
    if op.phase == "F" or op.recompute:
        return "fprop"
    return "dgrad" if op.phase == "B" else "wgrad"


def window_executed_fraction(seq_len: int, window: int | None, block: int | None = None) -> float:
    """Executed fraction of the full ``s x s`` attention work under a causal sliding window.

    Query ``q`` attends to keys ``[q - window + 1, q]`` (``window`` tokens, itself included;
    Hugging Face's ``sliding_window``).  FlashAttention skips every key block outside the band
    and computes the blocks the band touches in full: query block ``i`` (rows ``[i B, i B +
    r_i)``) runs the key blocks that intersect ``[i B - window + 1, i B + r_i - 1]``, i.e.
    the columns from ``B * floor(max(0, i B - window + 1) / B)`` to the end of its own block.
    With ``n = s / B`` blocks and ``window <= B + 1`` that is ``2 n - 1`` of ``n^2`` blocks (the
    diagonal and the one left of it, none left of block 0).  ``window >= s`` (or None) is
    :func:`causal_executed_fraction`.

    >>> window_executed_fraction(4096, 128, 128) == (2 * 32 - 1) / 32 ** 2
    True
    """
    s, bs = int(seq_len), int(attn_block_size() if block is None else block)
    if window is None or window >= s:
        return causal_executed_fraction(s, bs)
    w = int(window)
    if w < 1:
        raise ConfigError("model.sliding_window", window, "must be an integer >= 1")
    entries = 0
    for i in range(-(-s // bs)):
        start = i * bs
        rows = min(bs, s - start)
        first_key_block = max(0, start - w + 1) // bs
        entries += rows * (start + rows - first_key_block * bs)
    return entries / (s * s)


def causal_executed_fraction(seq_len: int, block: int | None = None) -> float:
    """Executed fraction of the full ``s x s`` attention work under a causal mask.

    FlashAttention runs the ``n (n + 1) / 2`` blocks on or below the diagonal of ``n x n``
    (``n = s / block``, the last block partial): ``1/2 + block / (2 s)`` when ``block``
    divides ``s``.
    """
    s, bs = int(seq_len), int(attn_block_size() if block is None else block)
    full, rem = divmod(s, bs)
    # rows of complete query blocks: block i runs (i + 1) key blocks of bs x bs
    entries = bs * bs * full * (full + 1) / 2
    if rem:
        # a partial last query block of rem rows sees every key column up to and including its own
        entries += rem * (full * bs + rem)
    return entries / (s * s)




def gemm_bytes(m, n, k) -> float:
    return float(act_bytes() * (m * k + k * n + m * n))


def linear(name: str, layer: int, m: int, n: int, k: int) -> tuple[ComputeOp, ComputeOp, ComputeOp]:
    """F, B, W ops of ``Y[m, n] = X[m, k] W[k, n]``."""
    f = 2.0 * m * n * k
    return (ComputeOp(name, "F", "gemm", f, m, n, k, gemm_bytes(m, n, k), 1, layer),
            ComputeOp(name, "B", "gemm", f, m, k, n, gemm_bytes(m, k, n), 1, layer),
            # wgrad accumulates into the FP32 main grad (gradient-accumulation fusion): read + write 4 B
            ComputeOp(name, "W", "gemm", f, k, n, m, act_bytes() * (m * k + m * n) + 2.0 * FP32 * k * n, 1, layer))


def grouped_linear(name: str, layer: int, tokens: Sequence[float], n: int, k: int):
    """F, B, W ops of one grouped GEMM: group ``e`` is ``Y[t_e, n] = X[t_e, k] W_e[k, n]``."""
    groups = tuple(float(t) for t in tokens)
    t = sum(groups)
    m = round(t)
    f = 2.0 * t * n * k
    ng = sum(1 for g in groups if g > 0)
    return (ComputeOp(name, "F", "gemm", f, m, n, k, act_bytes() * (t * k + ng * k * n + t * n), 1, layer, False, groups),
            ComputeOp(name, "B", "gemm", f, m, k, n, act_bytes() * (t * n + ng * k * n + t * k), 1, layer, False, groups),
            ComputeOp(name, "W", "gemm", f, k, n, m, act_bytes() * (t * k + t * n) + 2.0 * FP32 * ng * k * n, 1, layer,
                      False, groups))


def ew(name: str, phase: str, layer: int, nbytes: float, kernels: int = 1) -> ComputeOp:
    return ComputeOp(name, phase, "elementwise", 0.0, 0, 0, 0, float(nbytes), kernels, layer)


def ew_pair(name: str, layer: int, f_bytes: float, b_bytes: float, kf: int = 1, kb: int = 1):
    return ew(name, "F", layer, f_bytes, kf), ew(name, "B", layer, b_bytes, kb)


def norm(name: str, layer: int, tokens: float, width: int):
    # F: read x, write y.  B: read x and dy, write dx (dgamma reduced in the same kernel).
    a = act_bytes() * tokens * width
    return ew_pair(name, layer, 2 * a, 3 * a)


def residual(name: str, layer: int, tokens: float, width: int, dropout: float):
    # bias-dropout-add: F reads the branch output and the residual, writes the sum (+ mask);
    # B reads dy (+ mask) and writes the branch gradient (the residual gradient passes through).
    a = act_bytes() * tokens * width
    mask = MASK_BYTES * tokens * width if dropout > 0 else 0
    return ew_pair(name, layer, 3 * a + mask, 2 * a + mask)


def activation(name: str, layer: int, tokens: float, width: int, mlp: str):
    # swiglu: F reads gate and up (2 w), writes w; B reads gate, up, dy, writes dgate, dup (5 w).
    # gelu: F reads w, writes w; B reads x and dy, writes dx (3 w).
    a = act_bytes() * tokens * width
    return ew_pair(name, layer, 3 * a, 5 * a) if mlp == "swiglu" else ew_pair(name, layer, 2 * a, 3 * a)


# -- eager PyTorch (no torch.compile): every ATen op is its own memory-bound kernel -----------
# Byte counts in units of one BF16 activation pass ``a`` (read or write of the tensor once),
# counted from the eager modules of torchtitan v0.2.2 (torchtitan/models/llama3/model/model.py)
# and the ATen autograd formulas of the ops they call (pytorch tools/autograd/derivatives.yaml).
#: nn.RMSNorm (ATen's composite ``rms_norm``): F pow (r+w), mean (r), add eps and rsqrt
#: (per-row, negligible bytes), mul by the rsqrt (r+w), mul by the weight (r+w) -> 7 a in 6
#: kernels; B: the weight mul's two products (4 a) and reduction (1 a), the rsqrt mul's two
#: (4 a) and reduction, the mean's expand (1 a), pow's 2 x g (3 a), the sum of the two input
#: gradients (3 a) and the weight-gradient reduction (3 a) -> 19 a in 10 kernels.
EAGER_NORM = ((7, 6), (19, 10))
#: ``silu(w1 x) * w3 x``: F silu (2 a) and mul (3 a) of the FFN width -> 5 a, 2 kernels; B the
#: mul's two products (6 a) and silu's backward (3 a) -> 9 a, 3 kernels.
EAGER_SWIGLU = ((5, 2), (9, 3))
#: RoPE as complex products (``apply_rotary_emb``): per q and k, ``.float()`` (1 a read, 2 a
#: write), the complex multiply (2 a + 2 a), ``type_as`` (2 a + 1 a) -> 10 a in 3 kernels per
#: tensor; the backward runs the same three in reverse (10 a, 3 kernels).
EAGER_ROPE = ((10, 3), (10, 3))
#: ``h = x + branch``: F 3 a, 1 kernel; B: the residual stream's two gradients summed (3 a).
EAGER_RESIDUAL = ((3, 1), (3, 1))


# torchtitan's MoE run eagerly (pytorch/torchtitan torchtitan/models/moe/moe.py@v0.2.2
# TokenChoiceTopKRouter, TokenReorderer, MoE.forward; torchtitan/models/moe/utils.py@v0.2.2
# indices_padding_wrapper, _permute, _unpermute), each ATen op one kernel, bytes per element:
# T tokens, E experts, k = top_k, R = T k routed rows of width h, a = the activation dtype's
# bytes, int64 indices (8 B), FP32 scores.
IDX = 8
#: Router, forward: scores cast to FP32 (a + 4), softmax / sigmoid (8), + expert_bias (8,
#: load_balance_coeff set by default), topk's read (4) per T x E; topk's values and indices (12),
#: the gather of the top scores (16), x route_scale (8), histc (8) per T x k; the reorderer:
#: histc (8), a stable argsort (about 32 in 3 kernels), scores indexed by it (16), the token
#: index // top_k (16) per T x k -> (a + 24) TE + 116 Tk in 13 kernels.  Backward: route_scale
#: (8) and the sorted index (20, 2 kernels) per T x k, the gather's zeros (4 TE) and scatter
#: (16 Tk), softmax's (12 TE) and the cast's (4 + a) -> (20 + a) TE + 44 Tk in 7 kernels.
def titan_router(layer: int, tokens: float, experts: int, top_k: int):
    """torchtitan's eager router and token reorderer (see the table above)."""
    a, te, tk = act_bytes(), tokens * experts, tokens * top_k
    return ew_pair("router_topk", layer, (a + 24) * te + 116 * tk, (20 + a) * te + 44 * tk, 13, 7)


def titan_permute(layer: int, tokens: float, routed: float, width: int):
    """torchtitan's eager permutation of the routed tokens: forward ``x[idx // top_k]`` (2 a),
    the scores applied before the experts (``score_before_experts``: to FP32, multiply, back:
    2 a + 16), ``indices_padding_wrapper``'s ``vstack`` (2 a) and gather by the padded
    permutation (2 a) per routed element -> (8 a + 16) R h in 6 kernels; backward: the padded
    gather's zeros and accumulating index_put (4 a), the scaling's casts and products with the
    scores' gradient reduced over h (2 a + 28), the first gather's (zeros a T h, index_put 3 a R h)
    -> a T h + (9 a + 28) R h in 9 kernels."""
    a, rh = act_bytes(), routed * width
    return ew_pair("moe_permute", layer, (8 * a + 16) * rh, a * tokens * width + (9 * a + 28) * rh, 6, 9)


def titan_unpermute(layer: int, tokens: float, routed: float, width: int):
    """torchtitan's eager unpermutation: ``_unpermute``'s index_put (2 a), the unsort buffer's
    zeros (a) and index_put (2 a), the sum over top_k (a R h + a T h) -> 6 a R h + a T h in 4
    kernels; backward: the two index_puts' gathers (2 a each) -> 4 a R h in 2 kernels."""
    a, rh = act_bytes(), routed * width
    return ew_pair("moe_unpermute", layer, 6 * a * rh + a * tokens * width, 4 * a * rh, 4, 2)


def _eager_pair(name: str, layer: int, a: float, table) -> tuple[ComputeOp, ComputeOp]:
    (fb, fk), (bb, bk) = table
    return ew_pair(name, layer, fb * a, bb * a, fk, bk)


def eager_norm(name: str, layer: int, tokens: float, width: int):
    """Eager ``nn.RMSNorm`` (:data:`EAGER_NORM`)."""
    return _eager_pair(name, layer, act_bytes() * tokens * width, EAGER_NORM)


def eager_activation(name: str, layer: int, tokens: float, width: int):
    """Eager ``silu(gate) * up`` (:data:`EAGER_SWIGLU`)."""
    return _eager_pair(name, layer, act_bytes() * tokens * width, EAGER_SWIGLU)


def eager_rope(name: str, layer: int, nbytes: float):
    """Eager complex-product RoPE over q and k of ``nbytes`` (:data:`EAGER_ROPE`; two
    tensors: twice the kernels)."""
    (fb, fk), (bb, bk) = EAGER_ROPE
    return ew_pair(name, layer, fb * nbytes, bb * nbytes, 2 * fk, 2 * bk)


def eager_residual(name: str, layer: int, tokens: float, width: int, dropout: float):
    """Eager residual add (:data:`EAGER_RESIDUAL`; dropout adds its mask as the fused one)."""
    a = act_bytes() * tokens * width
    mask = MASK_BYTES * tokens * width if dropout > 0 else 0
    f, b = _eager_pair(name, layer, a, EAGER_RESIDUAL)
    return ew(name, "F", layer, f.mem_bytes + mask, f.num_kernels), ew(name, "B", layer, b.mem_bytes + mask, b.num_kernels)


def attention(name: str, layer: int, sh: Shard, heads: int, kv_heads: int, d_qk: int, d_v: int,
               causal: bool, block: int, window: int | None = None,
               backend: str = "flash") -> tuple[ComputeOp, ComputeOp]:
    s, cp = sh.s, sh.cp
    if not causal:
        frac = 1.0
    elif window is not None:
        frac = window_executed_fraction(s, window, block)
    else:
        frac = causal_executed_fraction(s, block)
    fwd = 2.0 * sh.b * heads * (d_qk + d_v) * s * s * frac / cp
    sq = s // cp
    # F: read Q, K, V (this rank's queries against all keys, K/V exchanged over CP), write O
    # and the log-sum-exp; B additionally reads O and dO and writes dQ, dK, dV.
    q = sh.b * sq * heads * d_qk
    kv = sh.b * s * kv_heads * (d_qk + d_v)
    o = sh.b * sq * heads * d_v
    f_bytes = act_bytes() * (q + kv + o) + FP32 * sh.b * sq * heads
    b_bytes = act_bytes() * (2 * q + 2 * kv + 2 * o) + FP32 * sh.b * sq * heads
    mask = "full" if not causal else ("window" if window is not None else "causal")
    shape = AttentionShape(sh.b, heads, kv_heads, sq, s, d_qk, d_v, mask, window if causal else None, cp, backend)
    # one kernel per ring step with CP; backward: preprocess (dO . O), main, dQ conversion
    return (ComputeOp(name, "F", "attention", fwd, sq, s, d_qk, f_bytes, cp, layer, attention=shape),
            ComputeOp(name, "B", "attention", 2.5 * fwd, sq, s, d_qk, b_bytes, 2 * cp + 1, layer, attention=shape))


def bmm(name: str, phase: str, layer: int, batches: int, m: int, n: int, k: int) -> ComputeOp:
    """``batches`` independent ``m x n x k`` GEMMs in one batched kernel (cuBLAS strided
    batched): timed by the GEMM model as a grouped GEMM of ``batches`` groups of ``m`` rows."""
    return ComputeOp(name, phase, "gemm", 2.0 * batches * m * n * k, m, n, k,
                     act_bytes() * batches * (m * k + k * n + m * n), 1, layer, False, (float(m),) * batches)



class LayerOps:
    """A layer's ops as its blocks add them: the forward ops in order (``fwd``), their
    ``B`` ops in forward order (``bwd``; :func:`workloads.costs.flops.layer_ops` reverses
    them) and the ``W`` ops (``wgt``)."""

    def __init__(self, layer: int):
        self.layer = layer
        self.fwd: list[ComputeOp] = []
        self.bwd: list[ComputeOp] = []
        self.wgt: list[ComputeOp] = []

    def linear(self, name: str, m: int, n: int, k: int) -> None:
        """The F, B and W GEMMs of ``Y[m, n] = X[m, k] W[k, n]``."""
        self.fbw(*linear(name, self.layer, m, n, k))

    def fbw(self, f: ComputeOp, b: ComputeOp, w: ComputeOp) -> None:
        self.fwd.append(f)
        self.bwd.append(b)
        self.wgt.append(w)

    def pair(self, pair: tuple[ComputeOp | None, ComputeOp | None]) -> None:
        """A forward op and its ``B`` op (either may be None)."""
        if pair[0] is not None:
            self.fwd.append(pair[0])
        if pair[1] is not None:
            self.bwd.append(pair[1])
