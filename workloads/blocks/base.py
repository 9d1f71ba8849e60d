"""The block interface: what every layer family answers for its shapes and a parallel layout.

A decoder layer is a short sequence of blocks (:func:`workloads.blocks.layer_blocks`): a
token mixer (attention, Mamba-2, ...) and a feed-forward block (dense MLP, MoE), or in a
hybrid stack one block of either kind.  Each block carries its own pre-norm and residual.
The modules that build a training step -- parameter counts (:mod:`workloads.model`),
executed kernels (:mod:`workloads.costs.flops`), memory (:mod:`workloads.memory`) and the
step program (:mod:`workloads.program`) -- ask the blocks instead of branching on a family.

A block answers:

* :meth:`Block.params` -- its parameters by breakdown key (:data:`workloads.model.BREAKDOWN_KEYS`),
  all of them or the ones a token runs (``active``);
* :meth:`Block.rank_params` -- the parameters one rank holds under a layout, split into
  dense and expert parameters and the GEMM weights of each;
* :meth:`Block.add_kernels` -- the kernels it runs for one micro-batch on one rank, forward,
  input gradient and weight gradient (:mod:`workloads.blocks.kernels`);
* :meth:`Block.activation_terms` -- the activation bytes it keeps for the backward under a
  recompute selection;
* :meth:`Block.mc_flops_per_token` -- its model FLOPs per token in Megatron-Core's count
  (the default convention; the others are whole-model formulas).

``RECOMPUTE`` maps the block's op names to the ``--recompute-modules`` entry that recomputes
them; ``MODULE_WIDE`` names a module that recomputes every op of the block (MoE's ``moe``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, NamedTuple

from .fusion import MEGATRON_TE, Fusion

if TYPE_CHECKING:
    from ..model import ModelSpec
    from ..parallel import ParallelConfig
    from .kernels import LayerOps, Shard

__all__ = ["Block", "KernelArgs", "RankParams", "norm_params"]

_NORM_PARAMS_PER_ELEMENT = {"layernorm": 2, "rmsnorm": 1}   # weight (+ bias)
_MLP_MATRICES = {"gelu": 2, "swiglu": 3, "relu2": 2}


def norm_params(model: ModelSpec, width: int) -> int:
    """Parameters of one norm of ``width`` elements: weight, and bias for LayerNorm."""
    return _NORM_PARAMS_PER_ELEMENT[model.norm] * width


def norm_elems(model: ModelSpec) -> int:
    """Tensors a norm keeps per element (statistics): 2 for LayerNorm, 1 for RMSNorm."""
    return 2 if model.norm == "layernorm" else 1


def mlp_matrices(model: ModelSpec) -> int:
    """Weight matrices of one MLP: 3 for SwiGLU (gate, up, down), 2 otherwise."""
    return _MLP_MATRICES[model.mlp]


def mlp_params(model: ModelSpec, f: int, width: int | None = None) -> int:
    """Parameters of one MLP of hidden width ``f`` reading and writing ``width`` (default ``h``)."""
    h, m = (model.hidden_size if width is None else width), _MLP_MATRICES[model.mlp]
    return m * h * f + (((m - 1) * f + h) if model.add_bias_linear else 0)


def mlp_rank_params(model: ModelSpec, f: float, t: int, width: int | None = None) -> tuple[float, float]:
    """(parameters, GEMM weights) of one MLP of width ``f`` split over ``t`` ranks, reading and
    writing ``width`` (default ``h``; a latent MoE's experts: the latent width)."""
    h, mats = (model.hidden_size if width is None else width), (3 if model.mlp == "swiglu" else 2)
    gemm = mats * h * f / t
    return gemm + ((((mats - 1) * f) / t + h) if model.add_bias_linear else 0), gemm


class RankParams(NamedTuple):
    """Parameters of one block on one rank: ``dense`` (sharded over dp x cp), ``expert``
    (sharded over the expert data-parallel group) and, of each, the GEMM weights."""

    dense: float
    expert: float
    gemm: float
    gemm_expert: float


class KernelArgs(NamedTuple):
    """What a block's kernels depend on beyond the model and the shard: the layout, the
    routed load, the mask, the attention tile and the framework's fusion choices."""

    parallel: ParallelConfig
    tokens_per_expert: tuple | None
    causal: bool
    attn_block_size: int
    fusion: Fusion = MEGATRON_TE


class Block:
    """One block of one decoder layer (see the module docstring)."""

    kind: ClassVar[str] = ""
    """The block's name in a layer pattern and in reports."""
    RECOMPUTE: ClassVar[dict[str, str]] = {}
    MODULE_WIDE: ClassVar[str | None] = None
    SEGMENTS: ClassVar[dict[str, str]] = {}
    """The block's op names by the program segment they run in between communication points
    (``attn``: the mixer's, ``pre`` / ``post``: around an MoE block's experts); names not
    listed run in the ``mlp`` segment."""
    ACTIVATION_KEYS: ClassVar[tuple[str, ...]] = ()
    """Activation terms of the block's own, beyond :data:`workloads.memory.ACTIVATION_TERMS`'
    shared ones (registered there through :data:`workloads.blocks.layers.EXTRA_ACTIVATION_TERMS`)."""
    CP_SEGMENTS: ClassVar[dict[str, str]] = {}
    """With context parallelism: ops run in a segment of their own (``core``: per ring step,
    between the exchanges; ``attn_post``: after them, not when recomputed)."""

    def __init__(self, model: ModelSpec, layer: int):
        self.model = model
        self.layer = layer
        """0-based decoder layer (``num_layers + k``: MTP module ``k``'s layer)."""

    def params(self, *, active: bool = False) -> dict[str, int]:
        raise NotImplementedError

    def rank_params(self, parallel: ParallelConfig) -> RankParams:
        raise NotImplementedError

    def add_kernels(self, ops: LayerOps, sh: Shard, args: KernelArgs) -> None:
        raise NotImplementedError

    def add_load_kernels(self, ops: LayerOps, sh: Shard, args: KernelArgs) -> None:
        """The kernels of :meth:`add_kernels` whose shape depends on the routed load
        (``args.tokens_per_expert``), added as :meth:`add_kernels` adds them (it calls this);
        none for a block that routes no tokens.  Every other kernel of the block must not
        depend on the load: :func:`workloads.costs.flops.layer_load_ops` relies on it."""
        return None

    def activation_terms(self, d, modules: frozenset[str], out: dict[str, float]) -> None:
        """Add the bytes the block keeps for one micro-batch to ``out`` (keys
        :data:`workloads.memory.ACTIVATION_TERMS`); ``d`` holds the per-rank dimensions
        (``workloads.memory._Dims``), ``modules`` the recomputed modules."""
        raise NotImplementedError

    def mc_flops_per_token(self, seq_len: int) -> float:
        """Model FLOPs per token of this block in Megatron-Core's count (forward and backward)."""
        raise NotImplementedError

    def mc_hybrid_forward_per_token(self, seq_len: int) -> float:
        """Forward model FLOPs per token in Megatron-Core's count for hybrid stacks (``hybrid_flops``)."""
        raise NotImplementedError

    def graph_scope(self, name: str) -> str | None:
        """The per-module CUDA-graph scope (:data:`workloads.costs.compute.CUDA_GRAPH_SCOPES`)
        whose graph would hold this block's op ``name``, or None if the op is not the block's."""
        return None

    def mc_window_correction(self, seq_len: int) -> float:
        """What a sliding window changes in :meth:`mc_flops_per_token` for one windowed layer."""
        return 0.0

    def ffn_width(self) -> float | None:
        """A feed-forward block's MLP width per token (NeMo's ``f``; MoE: ``top_k fe + S fs``);
        None for a token mixer."""
        return None

    def attention_dims(self) -> tuple[int, int] | None:
        """An attention block's (query/key, value) head dimensions; None for other blocks."""
        return None

    def dispatch_buffer_bytes(self, d) -> float:
        """Transient bytes the block's token exchange holds at once (MoE: the send and receive
        buffers of one all-to-all); ``d`` as for :meth:`activation_terms`."""
        return 0.0

    def cp_exchange_elements(self, tp: int) -> tuple[int, int] | None:
        """(K and V, Q) elements per token one TP rank exchanges under context parallelism
        (attention), or None for a block that exchanges none."""
        return None

    def unsupported_convention(self, convention: str) -> str | None:
        """Why the FLOP ``convention`` defines no count for this block, or None."""
        return None

    @classmethod
    def recompute_module_of(cls, name: str, modules) -> bool:
        """Whether selective recomputation of ``modules`` re-runs this block's op ``name``."""
        if cls.RECOMPUTE.get(name.split(".")[0]) in modules:      # "core_attn.qk" belongs to core_attn
            return True
        return cls.MODULE_WIDE is not None and cls.MODULE_WIDE in modules and name in cls.RECOMPUTE_ALL

    RECOMPUTE_ALL: ClassVar[frozenset[str]] = frozenset()
    """With ``MODULE_WIDE``: the op names that module recomputes."""
