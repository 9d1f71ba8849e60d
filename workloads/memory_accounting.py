"""What the memory model reports and how it counts a byte: the static accounting per
parameter (weights, gradients, master weights, optimizer states under ZeRO / the distributed
optimizer), the per-GPU reserve, the options (:class:`MemoryOptions`) and the result
(:class:`MemoryEstimate`).  :mod:`workloads.memory` computes the estimates and re-exports
everything here."""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from topologies import ConfigError
from topologies.constants import value as active_value

from .blocks.layers import EXTRA_ACTIVATION_TERMS
from .parallel import ParallelConfig

GB = 1e9
GiB = 1024 ** 3


# -- static accounting ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StaticAccounting:
    """Bytes per parameter of each static term before any sharding."""

    name: str
    param_bytes: float
    """The working copy the GEMMs read (bf16 / fp16)."""
    grad_bytes: float
    """The gradient accumulated over micro-batches and reduced over data parallelism."""
    master_bytes: float
    """A separate fp32 copy of the weights the optimizer updates (0 when there is none)."""
    optimizer_bytes: float
    """Optimizer state besides the master weights (Adam: two fp32 moments, 8)."""
    source: str


STATIC_ACCOUNTINGS: dict[str, StaticAccounting] = {
    "megatron": StaticAccounting(
        "megatron", 2, 4, 4, 8,
        "Megatron-LM docs/api-guide/dist_optimizer.md (bf16 params, fp32 main grads: 18 bytes/param, "
        "6 + 12/d with the distributed optimizer); megatron/training/theoretical_memory_usage.py"),
    "zero_paper": StaticAccounting(
        "zero_paper", 2, 2, 4, 8,
        "Rajbhandari et al. 2020, ZeRO (arXiv 1910.02054) §3.1: 2 + 2 + K bytes/param with K = 12 for "
        "mixed-precision Adam = 16; stages 1/2/3: 4 + 12/d, 2 + 14/d, 16/d"),
}
"""Named bytes-per-parameter accountings (see the module docstring)."""


def get_static_accounting(name: str) -> StaticAccounting:
    """The accounting registered as ``name``; ConfigError listing the valid names otherwise."""
    try:
        return STATIC_ACCOUNTINGS[name]
    except (KeyError, TypeError):
        raise ConfigError("memory.accounting", name,
                          f"unknown accounting; valid names: {', '.join(STATIC_ACCOUNTINGS)}") from None


def effective_zero_stage(parallel: ParallelConfig) -> int:
    """ZeRO stage the memory model applies: ``zero_stage`` for 2 and 3; for 0 and 1 the
    ``distributed_optimizer`` flag decides (Megatron's distributed optimizer is ZeRO-1)."""
    if parallel.zero_stage >= 2:
        return parallel.zero_stage
    return 1 if parallel.distributed_optimizer else 0


def bytes_per_param(zero_stage: int, dp: float, accounting: str | StaticAccounting = "megatron") -> dict[str, float]:
    """Static bytes per parameter by term for a ZeRO stage and a sharding degree ``dp``.

    >>> sum(bytes_per_param(0, 8).values()), sum(bytes_per_param(1, 8).values())
    (18.0, 7.5)
    >>> sum(bytes_per_param(3, 64, "zero_paper").values())
    0.25
    """
    acc = accounting if isinstance(accounting, StaticAccounting) else get_static_accounting(accounting)
    if zero_stage not in (0, 1, 2, 3):
        raise ConfigError("parallel.zero_stage", zero_stage, "must be 0, 1, 2 or 3")
    if dp < 1:
        raise ConfigError("dp", dp, "must be >= 1")
    return {"weights": float(acc.param_bytes) / (dp if zero_stage >= 3 else 1),
            "gradients": float(acc.grad_bytes) / (dp if zero_stage >= 2 else 1),
            "master_weights": float(acc.master_bytes) / (dp if zero_stage >= 1 else 1),
            "optimizer_states": float(acc.optimizer_bytes) / (dp if zero_stage >= 1 else 1)}


# -- reserve -------------------------------------------------------------------------------------
RESERVE_PARTS: dict[str, tuple[float, str]] = {
    "cuda_context": (0.75 * GiB, (
        "measured: the first CUDA call of a PyTorch process takes 723 MiB of device memory "
        "(discuss.pytorch.org/t/what-is-the-reason-for-pytorchs-gpu-memory-floor/73021); "
        "CUDA's lazy module loading can make it smaller")),
    "nccl_buffers": (1.0 * GiB, (
        "assumption: NCCL keeps NCCL_BUFFSIZE = 4 MiB (its documented default) per channel and peer for the "
        "Simple protocol plus LL/LL128 buffers in every communicator; a 5D job opens tp, cp, dp, pp, ep and "
        "embedding communicators, a few hundred MiB to ~2 GiB in all")),
    "fragmentation": (1.25 * GiB, (
        "assumption: the caching allocator's reserved-but-unallocated memory, a few percent of an 80 GB "
        "device in long-running training")),
}
"""Parts of :data:`DEFAULT_RESERVE_BYTES`: (bytes, source or the word 'assumption')."""

DEFAULT_RESERVE_BYTES: float = sum(v for v, _ in RESERVE_PARTS.values())
"""3 GiB per GPU held outside the model's tensors (see :data:`RESERVE_PARTS`); an assumption
to override with ``memory_reserve_bytes`` where measured."""


# -- options ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryOptions:
    """Precision- and implementation-dependent inputs of the memory model.

    The precision recipe (``workloads.costs``) decides several of these; here they are
    plain numbers so that this module depends on no recipe.  Every field can also be given
    as a keyword of :func:`memory_estimate`.
    """

    accounting: str = "megatron"
    """Bytes-per-parameter accounting: a key of :data:`STATIC_ACCOUNTINGS`."""
    param_dtype_bytes: float | None = None
    """Bytes of the parameters the GEMMs read; None: the accounting's (2)."""
    grad_dtype_bytes: float | None = None
    """Bytes of an accumulated gradient; None: the accounting's (megatron 4, zero_paper 2)."""
    master_weight_bytes: float | None = None
    """Bytes of the optimizer's master copy (0: none, e.g. fp32 training); None: the accounting's (4)."""
    optimizer_state_bytes: float | None = None
    """Bytes of optimizer state besides the master copy; None: the accounting's (Adam, 8)."""
    fp8_weight_copy_bytes_per_param: float = 0.0
    """Extra bytes per GEMM weight for FP8 copies (Transformer Engine keeps an FP8 weight and,
    on Hopper, its transpose: about 2); 0 for bf16."""
    activation_dtype_bytes: float = 2.0
    """Bytes per activation element (bf16)."""
    linear_input_bytes: float | None = None
    """Bytes per saved GEMM-input element; None: ``activation_dtype_bytes`` (FP8 recipes: 1)."""
    logits_bytes_per_element: float = 4.0
    """Bytes per held logit of the loss: the fp32 softmax Megatron's cross entropy keeps."""
    flash_attention: bool = True
    """FlashAttention / fused attention: no ``s^2`` scores kept, an fp32 log-sum-exp instead
    (also off when the model sets ``flash_attention: false``)."""
    attention_dropout: float | None = None
    """Dropout on attention probabilities (matters only without FlashAttention, which
    regenerates its mask); None: the model's ``dropout`` (Megatron uses one value for both)."""
    moe_token_imbalance: float | None = None
    """Tokens received by this rank's experts over the balanced share; None: the model's
    ``capacity_factor`` when it sets one, else 1 (balanced routing)."""
    make_vocab_size_divisible_by: int = 128
    """Megatron pads the vocabulary to a multiple of this times ``tp`` (its default 128)."""
    dp_bucket_params: float | None = None
    """Parameters per gradient bucket; None: Megatron's ``max(40M, 1M * dp * cp)``."""
    memory_reserve_bytes: float = dataclasses.field(
        default_factory=lambda: active_value("workloads.memory_accounting.DEFAULT_RESERVE_BYTES", DEFAULT_RESERVE_BYTES))
    """Per-GPU memory outside the model's tensors (CUDA context, NCCL, fragmentation); default
    the active :data:`DEFAULT_RESERVE_BYTES` (:mod:`topologies.constants`)."""
    extra_warmup_microbatches: int = 0
    """Forwards the interleaved schedule adds to every stage's warm-up, each one more chunk
    activation set in flight: Megatron-Core adds 1 with the MoE EP overlap
    (``overlap.moe_ep_comm``, :func:`~workloads.schedules.interleaved.interleaved_1f1b`)."""

    def __post_init__(self):
        get_static_accounting(self.accounting)
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in ("accounting", "flash_attention"):
                continue
            if v is None and f.default is None:
                continue
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or v < 0:
                raise ConfigError(f"memory.{f.name}", v, "must be a number >= 0")
        if not isinstance(self.flash_attention, bool):
            raise ConfigError("memory.flash_attention", self.flash_attention, "must be true or false")
        if self.attention_dropout is not None and not 0 <= self.attention_dropout < 1:
            raise ConfigError("memory.attention_dropout", self.attention_dropout, "must be a probability in [0, 1)")
        if self.moe_token_imbalance is not None and self.moe_token_imbalance < 1:
            raise ConfigError("memory.moe_token_imbalance", self.moe_token_imbalance, "must be >= 1 (max over mean)")
        if int(self.make_vocab_size_divisible_by) != self.make_vocab_size_divisible_by \
                or self.make_vocab_size_divisible_by < 1:
            raise ConfigError("memory.make_vocab_size_divisible_by", self.make_vocab_size_divisible_by,
                              "must be an integer >= 1")


def _options(options: MemoryOptions | None, knobs: dict) -> MemoryOptions:
    base = options or MemoryOptions()
    if not knobs:
        return base
    names = {f.name for f in dataclasses.fields(MemoryOptions)}
    for key in knobs:
        if key not in names:
            raise TypeError(f"unknown memory option {key!r}; valid: {', '.join(sorted(names))}")
    return dataclasses.replace(base, **knobs)


# -- the result -------------------------------------------------------------------------------------
#: Keys of :meth:`MemoryEstimate.terms`, in order.
MEMORY_TERMS = ("weights", "gradients", "master_weights", "optimizer_states", "fp8_weight_copies", "activations",
                "logits", "moe_dispatch", "cp_buffers", "dp_buckets", "param_gather", "reserve")

#: Activation terms, in order (see the module docstring's table).
ACTIVATION_TERMS = ("layer_input", "norm_inputs", "norm_stats", "attn_input", "q", "kv", "qk_norm_inputs",
                    "mla_latents", "attn_scores", "attn_dropout_mask", "softmax_stats", "attn_output", "ffn_input",
                    "mlp_fc1_output", "mlp_fc2_input", "router", "expert_input", "expert_fc1_output",
                    "expert_fc2_input", "moe_combine", "shared_fc1_output", "shared_fc2_input", "dropout_masks",
                    "embedding", "output_head", "mtp_extra", "recompute_working", "mamba_in_proj_output",
                    "mamba_scan_output") + EXTRA_ACTIVATION_TERMS


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """Peak memory of one rank of one pipeline stage, by term, in bytes."""

    stage: int
    """Pipeline stage (pp rank) of the estimate."""
    num_stages: int
    where: str
    """The ranks it describes, e.g. ``"pipeline stage 0 (ranks 0-7)"``."""
    num_layers: int
    """Decoder layers the rank holds (both DualPipe chunks, MTP layers included)."""
    num_params: float
    """Parameters the rank holds after TP/EP sharding, before data-parallel sharding."""
    num_expert_params: float
    """Of which routed-expert parameters (sharded over ``edp``, not ``dp * cp``)."""
    zero_stage: int
    """Effective ZeRO stage, :func:`effective_zero_stage`."""
    in_flight_microbatches: int
    """Peak (micro-batch, chunk) activation sets held, :func:`~workloads.schedules.peak_in_flight`."""
    activation_bytes_per_microbatch: float
    """Activations of one micro-batch through all of the rank's chunks (logits excluded)."""
    weights_bytes: float
    gradients_bytes: float
    master_weights_bytes: float
    optimizer_states_bytes: float
    fp8_weight_copies_bytes: float
    activations: Mapping[str, float]
    """Activation bytes held at the peak, by term (keys among :data:`ACTIVATION_TERMS`)."""
    logits_bytes: float
    moe_dispatch_bytes: float
    dp_buckets_bytes: float
    param_gather_bytes: float
    reserve_bytes: float
    hbm_bytes: float | None = None
    """Device memory to compare with, when given to :func:`memory_estimate`."""
    cp_buffers_bytes: float = 0.0
    """Context-parallel exchange buffers of one layer, by ``cp_comm_type``
    (:func:`cp_buffer_bytes`)."""
    moe_worst_rank_load: float | None = None
    """When a skewed routing sized the expert rows (dropless): the worst EP rank's tokens over
    the balanced share, summed over the stage's MoE layers (the held activations' scale;
    :func:`workloads.moe_routing.worst_rank_load`).  None: balanced rows, a capacity factor,
    or an explicit ``moe_token_imbalance``."""

    @property
    def activations_bytes(self) -> float:
        """Sum of :attr:`activations`."""
        return sum(self.activations.values())

    @property
    def static_bytes(self) -> float:
        """Weights, gradients, master weights, optimizer states and FP8 copies."""
        return (self.weights_bytes + self.gradients_bytes + self.master_weights_bytes
                + self.optimizer_states_bytes + self.fp8_weight_copies_bytes)

    @property
    def total_bytes(self) -> float:
        """Sum of every term, the reserve included."""
        return sum(self.terms().values())

    def terms(self) -> dict[str, float]:
        """Every term by name (:data:`MEMORY_TERMS`); activations summed."""
        return {"weights": self.weights_bytes, "gradients": self.gradients_bytes,
                "master_weights": self.master_weights_bytes, "optimizer_states": self.optimizer_states_bytes,
                "fp8_weight_copies": self.fp8_weight_copies_bytes, "activations": self.activations_bytes,
                "logits": self.logits_bytes, "moe_dispatch": self.moe_dispatch_bytes,
                "cp_buffers": self.cp_buffers_bytes, "dp_buckets": self.dp_buckets_bytes, "param_gather": self.param_gather_bytes,
                "reserve": self.reserve_bytes}

    def biggest_terms(self, n: int = 3) -> list[tuple[str, float]]:
        """The ``n`` largest terms, largest first (ties in :data:`MEMORY_TERMS` order)."""
        items = [(k, v) for k, v in self.terms().items() if v > 0]
        return sorted(items, key=lambda kv: -kv[1])[:n]

    def _hbm(self, hbm_bytes: float | None) -> float:
        hbm = self.hbm_bytes if hbm_bytes is None else getattr(hbm_bytes, "hbm_bytes", hbm_bytes)
        if hbm is None:
            raise ValueError("no HBM capacity: pass hbm_bytes, or gpu_hbm_bytes to memory_estimate")
        return float(hbm)

    def fits(self, hbm_bytes: float | None = None) -> bool:
        """Whether :attr:`total_bytes` is within ``hbm_bytes`` (a number or a GPUSpec; default
        the capacity given to :func:`memory_estimate`)."""
        return self.total_bytes <= self._hbm(hbm_bytes)

    def verdict(self, hbm_bytes: float | None = None) -> str:
        """One line: fits or not, where, the total against HBM and the biggest terms."""
        hbm = self._hbm(hbm_bytes)
        total = self.total_bytes
        big = ", ".join(f"{k} {v / GB:.1f} GB" for k, v in self.biggest_terms())
        if total <= hbm:
            return (f"{self.where} fits: {total / GB:.1f} GB of {hbm / GB:.1f} GB HBM "
                    f"({100 * total / hbm:.0f}%); biggest terms: {big}")
        return (f"{self.where} does not fit: needs {total / GB:.1f} GB, HBM {hbm / GB:.1f} GB "
                f"({total / hbm:.2f}x); biggest terms: {big}")

    def check_fits(self, hbm_bytes: float | None = None) -> None:
        """Raise ConfigError naming the stage, its ranks and the biggest terms if it does not fit."""
        if not self.fits(hbm_bytes):
            raise ConfigError("parallel", self.where, self.verdict(hbm_bytes))

    def to_dict(self) -> dict:
        """Plain mapping for JSON: the fields, the activation terms and the totals."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["activations"] = dict(self.activations)
        out["terms"] = self.terms()
        out["total_bytes"] = self.total_bytes
        return out

    def format_table(self) -> str:
        """A two-column table of the terms in GB, with the activation terms indented."""
        head = (f"{self.where}: {self.num_layers} layers, {self.num_params / 1e9:.3f} B params held, "
                f"ZeRO-{self.zero_stage}, {self.in_flight_microbatches} chunk micro-batches in flight")
        lines = [head]
        for k, v in self.terms().items():
            lines.append(f"  {k:<20} {v / GB:10.3f} GB")
            if k == "activations":
                for a, x in self.activations.items():
                    if x:
                        lines.append(f"    {a:<18} {x / GB:10.3f} GB")
        lines.append(f"  {'total':<20} {self.total_bytes / GB:10.3f} GB")
        if self.moe_worst_rank_load is not None:
            lines.append(f"  (expert activations sized for the worst EP rank's tokens, "
                         f"{self.moe_worst_rank_load:.3f}x the balanced share)")
        if self.hbm_bytes is not None:
            lines.append(f"  {'hbm':<20} {self.hbm_bytes / GB:10.3f} GB  ({'fits' if self.fits() else 'OOM'})")
        return "\n".join(lines)


def check_fits(estimates: MemoryEstimate | Iterable[MemoryEstimate], hbm_bytes: float | None = None) -> None:
    """Raise ConfigError for the stage that overflows HBM the most (no-op when all fit)."""
    items = [estimates] if isinstance(estimates, MemoryEstimate) else list(estimates)
    worst = None
    for est in items:
        if not est.fits(hbm_bytes) and (worst is None or est.total_bytes > worst.total_bytes):
            worst = est
    if worst is not None:
        worst.check_fits(hbm_bytes)
