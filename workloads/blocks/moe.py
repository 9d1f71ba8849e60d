"""The mixture-of-experts block: pre-norm, router, token permutation, the local routed
experts' grouped GEMMs (optionally in a latent width), unpermutation, shared experts,
residual.  Which tokens go where (routing, dropping, dispatch) is
:mod:`workloads.moe_routing`'s; the collectives between the parts are the program's."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass

from topologies import ConfigError

from ..moe_routing import DISPATCHERS, DROP_POLICIES, FLEX_BACKENDS, SKEWED_KINDS, worst_rank_load

from . import kernels as kn
from .base import Block, RankParams, mlp_params, mlp_rank_params
from .fields import bool_field, int_field, set_field, sub_spec
from .shard import shard

__all__ = ["MoESpec", "MoEBlock", "balanced_tokens", "default_token_imbalance", "has_paged_stash", "balanced_tokens_per_expert",
           "capacity_tokens_per_expert", "routed_expert_part", "skewed_expert_load"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MoESpec:
    """Mixture-of-experts feed-forward blocks: which layers have them and how they route."""

    num_experts: int
    """Routed experts per MoE layer (Mixtral 8, DeepSeek-V3 256, Qwen3-MoE 128)."""
    top_k: int
    """Routed experts each token runs (Megatron's ``moe_router_topk``)."""
    expert_ffn_hidden_size: int | None = None
    """Hidden width of one routed expert's MLP; None: the model's ``ffn_hidden_size``."""
    num_shared_experts: int = 0
    """Experts every token runs besides the routed ones (DeepSeek's ``n_shared_experts``)."""
    shared_expert_ffn_hidden_size: int | None = None
    """Hidden width of *one* shared expert; None: ``expert_ffn_hidden_size``.  Megatron's
    ``moe_shared_expert_intermediate_size`` is the total, ``num_shared_experts`` times this."""
    moe_layer_freq: int = 1
    """Layer ``i`` (0-based) is MoE when ``i % moe_layer_freq == 0`` (and ``i >= first_k_dense``),
    as in Megatron-LM's integer ``--moe-layer-freq`` and DeepSeek's ``moe_layer_freq``."""
    first_k_dense: int = 0
    """The first k layers are dense (DeepSeek's ``first_k_dense_replace``)."""
    moe_layer_pattern: tuple[int, ...] | None = None
    """Explicit per-layer flags, 1 = MoE, 0 = dense (Megatron's list form of ``--moe-layer-freq``);
    overrides the two rules above, which must then keep their defaults."""
    capacity_factor: float | None = None
    """Tokens an expert accepts, as a multiple of the balanced share; excess tokens are dropped.
    None: dropless (Megatron-Core's default, and Mixtral / DeepSeek / Qwen training)."""
    router_bias: bool = False
    """A per-expert bias on the router scores (DeepSeek-V3's auxiliary-loss-free balancing bias,
    ``e_score_correction_bias``): ``num_experts`` extra parameters per MoE layer."""
    token_drop_policy: str = "probs"
    """Which tokens an over-full expert drops (Megatron-Core's ``--moe-token-drop-policy``):
    ``probs`` (lowest routing probability) or ``position`` (latest in the sequence).  The number
    dropped, and so the step, is the same for both."""
    pad_expert_input_to_capacity: bool = False
    """Every (source rank, expert) pair sends exactly its capacity, padding what routing left
    short (``--moe-pad-expert-input-to-capacity``); needs ``capacity_factor``."""
    expert_rank_capacity_factor: float | None = None
    """HybridEP's per-EP-rank token budget, as a multiple of one rank's ``local tokens x
    top_k`` (``moe_expert_rank_capacity_factor``); tokens above it are dropped.  Needs the
    ``flex`` dispatcher with the ``hybridep`` backend.  None: no budget."""
    paged_stash: bool = False
    """The routed experts' saved activations packed into a paged buffer of 1.10 x the balanced
    size (Megatron-Core's ``moe_paged_stash``; :mod:`workloads.offload`): a device copy of
    those bytes each way, memory sized by the buffer.  Needs ``expert_rank_capacity_factor``."""
    token_dispatcher: str = "alltoall"
    """``alltoall`` | ``allgather`` | ``flex`` (``--moe-token-dispatcher-type``; clustersim's
    default is ``alltoall``, Megatron-Core's own default is ``allgather``)."""
    flex_dispatcher_backend: str = "deepep"
    """With ``token_dispatcher: flex``: ``deepep`` or ``hybridep``
    (``--moe-flex-dispatcher-backend``)."""
    flex_dispatcher_num_sms: int | None = None
    """SMs the flex dispatcher's kernels hold (``moe_flex_dispatcher_num_sms``); None: the
    backend's default (DeepEP 20, HybridEP 16: ``workloads.moe_routing`` cites both)."""
    shared_expert_gate: bool = False
    """A sigmoid gate scales the shared experts' output per token (Qwen2-MoE / Qwen3-Next
    ``shared_expert_gate``, Megatron-Core's ``moe_shared_expert_gate``): ``h`` parameters per
    MoE layer, one ``h -> 1`` projection and an element-wise product."""
    latent_size: int | None = None
    """Latent MoE (Nemotron 3 Super / Ultra; Megatron-Core's ``moe_latent_size``): the routed
    experts run in this reduced width.  A down projection ``h -> latent`` (``fc1_latent_proj``)
    runs before the dispatch, so the all-to-all carries ``latent``-wide tokens, and an up
    projection ``latent -> h`` (``fc2_latent_proj``) after the combine; both are replicated
    over TP (Megatron-Core ``moe_layer.py``, ``parallel_mode="duplicated"``).  The router and
    the shared experts keep the full width.  None: experts run at ``h``."""

    def __post_init__(self):
        w = "moe"
        set_field(self, "num_experts", int_field(w, "num_experts", self.num_experts))
        set_field(self, "top_k", int_field(w, "top_k", self.top_k))
        if self.top_k > self.num_experts:
            raise ConfigError(f"{w}.top_k", self.top_k, f"must be <= num_experts = {self.num_experts}")
        set_field(self, "expert_ffn_hidden_size", int_field(w, "expert_ffn_hidden_size", self.expert_ffn_hidden_size,
                                                  optional=True))
        set_field(self, "num_shared_experts", int_field(w, "num_shared_experts", self.num_shared_experts, minimum=0))
        shared = int_field(w, "shared_expert_ffn_hidden_size", self.shared_expert_ffn_hidden_size, optional=True)
        set_field(self, "shared_expert_ffn_hidden_size", shared if shared is not None else self.expert_ffn_hidden_size)
        set_field(self, "moe_layer_freq", int_field(w, "moe_layer_freq", self.moe_layer_freq))
        set_field(self, "first_k_dense", int_field(w, "first_k_dense", self.first_k_dense, minimum=0))
        if self.moe_layer_pattern is not None:
            pat = self.moe_layer_pattern
            if isinstance(pat, (str, bytes)) or not hasattr(pat, "__iter__"):
                raise ConfigError(f"{w}.moe_layer_pattern", pat, "must be a list of 0/1 flags, one per layer")
            pat = tuple(pat)
            if not pat or any(not isinstance(x, numbers.Integral) or x not in (0, 1) for x in pat):
                raise ConfigError(f"{w}.moe_layer_pattern", list(pat), "must be a list of 0/1 flags, one per layer")
            if self.moe_layer_freq != 1 or self.first_k_dense != 0:
                raise ConfigError(f"{w}.moe_layer_pattern", list(pat),
                                  "give either moe_layer_pattern or moe_layer_freq / first_k_dense, not both")
            set_field(self, "moe_layer_pattern", tuple(int(x) for x in pat))
        cf = self.capacity_factor
        if cf is not None:
            if isinstance(cf, bool) or not isinstance(cf, numbers.Real) or not cf > 0:
                raise ConfigError(f"{w}.capacity_factor", cf, "must be a positive number, or null for dropless")
            set_field(self, "capacity_factor", float(cf))
        bool_field(w, "router_bias", self.router_bias)
        bool_field(w, "shared_expert_gate", self.shared_expert_gate)
        if self.shared_expert_gate and not self.num_shared_experts:
            raise ConfigError(f"{w}.shared_expert_gate", True, "gates the shared experts: needs num_shared_experts")
        set_field(self, "latent_size", int_field(w, "latent_size", self.latent_size, optional=True))
        self._check_dropping_and_dispatch(w)

    def _check_dropping_and_dispatch(self, w: str) -> None:
        """Megatron-Core's rules (transformer_config.py ``__post_init__``) for token dropping
        and the dispatcher, as ConfigErrors."""
        if self.token_drop_policy not in DROP_POLICIES:
            raise ConfigError(f"{w}.token_drop_policy", self.token_drop_policy, f"must be one of {', '.join(DROP_POLICIES)}")
        bool_field(w, "pad_expert_input_to_capacity", self.pad_expert_input_to_capacity)
        if self.pad_expert_input_to_capacity and self.capacity_factor is None:
            raise ConfigError(f"{w}.pad_expert_input_to_capacity", True, "padding to capacity needs capacity_factor")
        if self.token_dispatcher not in DISPATCHERS:
            raise ConfigError(f"{w}.token_dispatcher", self.token_dispatcher, f"must be one of {', '.join(DISPATCHERS)}")
        if self.flex_dispatcher_backend not in FLEX_BACKENDS:
            raise ConfigError(f"{w}.flex_dispatcher_backend", self.flex_dispatcher_backend,
                              f"must be one of {', '.join(FLEX_BACKENDS)}")
        flex = self.token_dispatcher == "flex"
        if flex and self.flex_dispatcher_backend == "deepep" and self.pad_expert_input_to_capacity:
            raise ConfigError(f"{w}.pad_expert_input_to_capacity", True,
                              "the flex dispatcher's deepep backend does not pad to capacity (Megatron-Core refuses it)")
        set_field(self, "flex_dispatcher_num_sms", int_field(w, "flex_dispatcher_num_sms", self.flex_dispatcher_num_sms,
                                                   optional=True))
        if self.flex_dispatcher_num_sms is not None and not flex:
            raise ConfigError(f"{w}.flex_dispatcher_num_sms", self.flex_dispatcher_num_sms,
                              "only the flex dispatcher reserves SMs (set token_dispatcher: flex)")
        rcf = self.expert_rank_capacity_factor
        if rcf is not None:
            if isinstance(rcf, bool) or not isinstance(rcf, numbers.Real) or not rcf > 0:
                raise ConfigError(f"{w}.expert_rank_capacity_factor", rcf, "must be a positive number, or null")
            if not (flex and self.flex_dispatcher_backend == "hybridep"):
                raise ConfigError(f"{w}.expert_rank_capacity_factor", rcf,
                                  "the per-rank budget needs token_dispatcher: flex with flex_dispatcher_backend: hybridep")
            set_field(self, "expert_rank_capacity_factor", float(rcf))
        if not isinstance(self.paged_stash, bool):
            raise ConfigError(f"{w}.paged_stash", self.paged_stash, "must be true or false")
        if self.paged_stash and rcf is None:
            raise ConfigError(f"{w}.paged_stash", True, "needs expert_rank_capacity_factor (Megatron-Core sizes the "
                                                        "stash from the sync-free expert buffers)")

    @property
    def expert_width(self) -> int | None:
        """Width the routed experts read and write: ``latent_size`` or None (the model's ``h``)."""
        return self.latent_size

    def is_moe_layer(self, i: int) -> bool:
        """Whether decoder layer ``i`` (0-based) has a MoE block (no range check)."""
        if self.moe_layer_pattern is not None:
            return bool(self.moe_layer_pattern[i])
        return i >= self.first_k_dense and i % self.moe_layer_freq == 0

    @classmethod
    def from_dict(cls, d: Mapping, where: str = "model.moe") -> "MoESpec":
        """From a YAML mapping of MoESpec fields; unknown keys are errors."""
        return sub_spec(cls, d, ("num_experts", "top_k"), "moe", where)

    def to_dict(self) -> dict:
        """Plain mapping (lists, no tuples) that :meth:`from_dict` reads back to an equal spec."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if out["moe_layer_pattern"] is not None:
            out["moe_layer_pattern"] = list(out["moe_layer_pattern"])
        return out


def balanced_tokens(model, parallel, sh) -> tuple[float, ...]:
    """Tokens each of a rank's ``E / ep`` local experts runs under perfectly balanced routing:
    ``etp * ep * (T / tp) * top_k / E`` (may be fractional: an average)."""
    moe, ep, etp = model.moe, parallel.ep, parallel.expert_tp
    if moe.num_experts % ep:
        raise ConfigError("parallel.ep", ep, f"must divide the number of experts ({moe.num_experts})")
    per_expert = etp * ep * (sh.T / sh.tp) * moe.top_k / moe.num_experts
    return (per_expert,) * (moe.num_experts // ep)


def balanced_tokens_per_expert(model, parallel, micro_batch_size: int | None = None,
                               seq_len: int | None = None) -> tuple[float, ...]:
    """Tokens each of this rank's ``E / ep`` local experts runs under perfectly balanced routing.

    ``etp * ep * (b s / cp / tp) * top_k / E`` per expert (see :mod:`workloads.costs.flops`);
    may be fractional (an average).
    """
    if model.moe is None:
        raise ConfigError("model.moe", None, "balanced_tokens_per_expert needs a mixture-of-experts model")
    return balanced_tokens(model, parallel, shard(model, parallel, micro_batch_size, seq_len))


def capacity_tokens_per_expert(model, parallel, micro_batch_size: int | None = None,
                               seq_len: int | None = None) -> tuple[float, ...]:
    """Tokens per local expert when inputs are padded to capacity (Megatron's
    ``--moe-pad-expert-input-to-capacity``): ``ceil(capacity_factor x balanced)``."""
    cf = model.moe.capacity_factor if model.moe is not None else None
    if cf is None:
        raise ConfigError("model.moe.capacity_factor", cf, "padding to capacity needs a capacity factor")
    bal = balanced_tokens_per_expert(model, parallel, micro_batch_size, seq_len)
    return tuple(float(math.ceil(cf * t)) for t in bal)


def default_token_imbalance(model) -> float:
    """Rows an expert's buffers hold, as a multiple of the balanced share, when nothing else
    is said: the capacity factor with token dropping, the paged stash's buffer (1.10,
    :data:`workloads.offload.PAGED_STASH_BUFFER_FACTOR`) with ``paged_stash``, else 1."""
    if model.moe is not None and model.moe.capacity_factor:
        return model.moe.capacity_factor
    if has_paged_stash(model):
        from ..offload import PAGED_STASH_BUFFER_FACTOR
        return PAGED_STASH_BUFFER_FACTOR
    return 1.0


def has_paged_stash(model) -> bool:
    """Whether ``model``'s routed experts keep their saved activations in Megatron-Core's paged
    stash (a buffer of fixed size, whatever the routing)."""
    return model.moe is not None and bool(model.moe.paged_stash)


def routed_expert_part(model, count) -> float:
    """What the routed experts of the decoder's MoE layers contribute to ``count(model)``, a
    model-FLOP count (:func:`workloads.costs.flops.routed_expert_flops_per_step`).

    Every convention counts a MoE layer's routed experts as ``top_k`` equal per-token terms,
    so a count is linear in ``top_k`` and the routed part is ``k (F(k + 1) - F(k))``, ``F``
    the count of the model without MTP modules (no routing or capacity reaches their
    experts) and with at least ``k + 1`` experts (the router's ``h E`` is the same in both
    terms and cancels).  0 for a dense model."""
    if model.moe is None:
        return 0.0
    moe, k = model.moe, model.moe.top_k
    base = dataclasses.replace(model, mtp_layers=0,
                               moe=dataclasses.replace(moe, num_experts=max(moe.num_experts, k + 1)))
    more = dataclasses.replace(base, moe=dataclasses.replace(base.moe, top_k=k + 1))
    return k * (count(more) - count(base))


def skewed_expert_load(model, parallel, routing, layers, num_microbatches: int, seed: int,
                       tokens_per_source: int) -> tuple[float, float] | None:
    """``(held, peak)`` rows of the worst EP rank's experts over the balanced share
    (:func:`workloads.moe_routing.worst_rank_load`) over the MoE layers among ``layers`` (a
    pipeline stage's ``(index, blocks)``, MTP included), when a skewed ``routing`` (:data:`SKEWED_KINDS`) sets
    them: a dropless MoE model.  None otherwise: balanced routing keeps the balanced rows, and
    with a capacity factor or a rank budget the capacity bounds what a rank keeps
    (:func:`default_token_imbalance`)."""
    moe = model.moe
    if (routing is None or routing.kind not in SKEWED_KINDS or moe is None or moe.capacity_factor is not None
            or moe.expert_rank_capacity_factor is not None):
        return None
    moe_layers = [i for i, blocks in layers if any(isinstance(b, MoEBlock) for b in blocks)]
    return worst_rank_load(routing, tokens_per_source, parallel.ep * parallel.expert_tp, moe.num_experts, moe.top_k,
                           parallel.ep, moe_layers, num_microbatches, seed=seed, routed_layers=model.num_layers)


class MoEBlock(Block):
    """A routed-expert feed-forward block (``model.moe``)."""

    kind = "moe"
    RECOMPUTE = {"mlp_norm": "layernorm", "expert_act": "moe_act", "expert_clamp": "moe_act",
                 "shared_fc1": "shared_experts", "shared_act": "shared_experts", "shared_fc2": "shared_experts",
                 "shared_gate": "shared_experts", "shared_gate_mul": "shared_experts"}
    MODULE_WIDE = "moe"
    RECOMPUTE_ALL = frozenset({"router", "router_topk", "moe_permute", "expert_fc1", "expert_clamp", "expert_act",
                               "expert_fc2", "expert_bias", "moe_unpermute", "shared_fc1", "shared_act", "shared_fc2",
                               "shared_gate", "shared_gate_mul",
                               "latent_down_proj", "latent_up_proj"})
    SEGMENTS = {**dict.fromkeys(("mlp_norm", "router", "router_topk", "moe_permute", "latent_down_proj"), "pre"),
                **dict.fromkeys(("moe_unpermute", "mlp_residual", "latent_up_proj"), "post")}
    ROUTER_SCOPE = frozenset({"mlp_norm", "router", "router_topk", "shared_fc1", "shared_act", "shared_fc2",
                              "shared_gate", "shared_gate_mul"})
    """Ops that Megatron-Core's ``moe_router`` graph captures: the pre-MLP norm, the router and
    (not overlapped) shared experts (``_get_submodules_under_cudagraphs``); the token
    permutation, the routed experts and the unpermutation run on per-step token counts and
    only the ``moe`` scope graphs them."""

    def graph_scope(self, name: str) -> str:
        return "moe_router" if name in self.ROUTER_SCOPE else "moe"

    def params(self, *, active: bool = False) -> dict[str, int]:
        m = self.model
        moe, h = m.moe, m.hidden_size
        n_routed = moe.top_k if active else moe.num_experts
        out = {"router": h * moe.num_experts + (moe.num_experts if moe.router_bias else 0),
               "routed_experts": n_routed * mlp_params(m, moe.expert_ffn_hidden_size, moe.latent_size or h),
               "shared_experts": moe.num_shared_experts * mlp_params(m, moe.shared_expert_ffn_hidden_size)
               + (h if moe.shared_expert_gate else 0),
               "latent_proj": 0}
        if moe.latent_size:
            out["latent_proj"] = 2 * h * moe.latent_size + ((moe.latent_size + h) if m.add_bias_linear else 0)
        return out

    def rank_params(self, parallel) -> RankParams:
        m, t = self.model, parallel.tp
        moe = m.moe
        dense = gemm = 0.0
        dense += m.hidden_size * moe.num_experts + (moe.num_experts if moe.router_bias else 0)   # replicated
        if moe.latent_size:                     # the latent down / up projections, replicated over TP
            dense += 2 * m.hidden_size * moe.latent_size
            gemm += 2 * m.hidden_size * moe.latent_size
        one, one_gemm = mlp_rank_params(m, moe.expert_ffn_hidden_size, parallel.expert_tp, moe.latent_size)
        local = moe.num_experts / parallel.ep
        shared, shared_gemm = mlp_rank_params(m, moe.num_shared_experts * moe.shared_expert_ffn_hidden_size, t) \
            if moe.num_shared_experts else (0.0, 0.0)
        if moe.shared_expert_gate:              # h -> 1, replicated over TP
            dense += m.hidden_size
        return RankParams(dense + shared, local * one, gemm + shared_gemm, local * one_gemm)

    def add_kernels(self, ops, sh, args) -> None:
        """Norm, router, permute, the local experts' grouped GEMMs, unpermute, shared
        experts, residual."""
        model, L = self.model, self.layer
        moe, h = model.moe, model.hidden_size
        self._local_tokens(sh, args)             # (checked before any kernel is added)
        Tn, E, k = sh.Tn, moe.num_experts, moe.top_k
        m1 = 2 if model.mlp == "swiglu" else 1
        titan = args.fusion.moe_kernels == "torchtitan_eager"
        ops.pair(kn.eager_norm("mlp_norm", L, Tn, h) if titan else kn.norm("mlp_norm", L, Tn, h))
        ops.linear("router", Tn, E, h)
        # softmax / sigmoid, top-k, score normalisation and the load-balancing statistics, in FP32
        ops.pair(kn.titan_router(L, Tn, E, k) if titan else
                 kn.ew_pair("router_topk", L, 3 * kn.FP32 * Tn * E, 2 * kn.FP32 * Tn * E, *args.fusion.router_kernels))
        # latent MoE: the routed tokens are projected down to the latent width before the
        # dispatch (replicated over TP, on this rank's Tn tokens) and back up after the combine
        w = moe.latent_size or h
        if moe.latent_size:
            ops.linear("latent_down_proj", Tn, w, h)
        self.add_load_kernels(ops, sh, args)
        if moe.latent_size:
            ops.linear("latent_up_proj", Tn, h, w)
        if moe.num_shared_experts:
            fs = moe.num_shared_experts * moe.shared_expert_ffn_hidden_size / sh.tp
            ops.linear("shared_fc1", sh.T, int(m1 * fs), h)
            ops.pair(kn.eager_activation("shared_act", L, sh.T, int(fs)) if titan and m1 == 2 else
                     kn.activation("shared_act", L, sh.T, int(fs), model.mlp))
            ops.linear("shared_fc2", sh.T, h, int(fs))
            if moe.shared_expert_gate:
                # sigmoid(x W_g) scales the shared output (HF Qwen3NextSparseMoeBlock, eager):
                # the h -> 1 GEMM, the sigmoid, the product over the T x h output (read 2, write 1)
                ops.linear("shared_gate", sh.T, 1, h)
                a = kn.act_bytes() * sh.T * h
                ops.pair(kn.ew_pair("shared_gate_mul", L, 3 * a, 5 * a, 2, 3))
        ops.pair((kn.eager_residual if titan else kn.residual)("mlp_residual", L, Tn, h, model.dropout))

    def _local_tokens(self, sh, args) -> tuple:
        """Tokens each local expert runs: ``args.tokens_per_expert``, checked, or the balanced share."""
        moe, parallel = self.model.moe, args.parallel
        ep = parallel.ep
        if moe.num_experts % ep:
            raise ConfigError("parallel.ep", ep, f"must divide the number of experts ({moe.num_experts})")
        local = moe.num_experts // ep
        if args.tokens_per_expert is None:
            return balanced_tokens(self.model, parallel, sh)
        tokens = tuple(args.tokens_per_expert)
        if len(tokens) != local or any(isinstance(t, bool) or not isinstance(t, numbers.Real) or t < 0
                                       for t in tokens):
            raise ConfigError("tokens_per_expert", list(tokens),
                              f"must be {local} non-negative numbers (experts per rank: {moe.num_experts} / ep {ep})")
        return tokens

    def add_load_kernels(self, ops, sh, args) -> None:
        """The kernels that run on the routed load, as :meth:`add_kernels` adds them: permute,
        the local experts' grouped GEMMs and what runs between them, unpermute."""
        model, L = self.model, self.layer
        moe, h = model.moe, model.hidden_size
        tokens = self._local_tokens(sh, args)
        routed = float(sum(tokens))
        Tn, k = sh.Tn, moe.top_k
        m1 = 2 if model.mlp == "swiglu" else 1
        titan = args.fusion.moe_kernels == "torchtitan_eager"
        w = moe.latent_size or h
        # permute: read the local tokens, write top_k copies sorted by expert; after the
        # all-to-all, sort the received chunks by local expert (read + write the routed tokens)
        perm = kn.act_bytes() * w * (Tn * (1 + k) + 2 * routed)
        ops.pair(kn.titan_permute(L, Tn, routed, w) if titan else
                 kn.ew_pair("moe_permute", L, perm, perm, *args.fusion.permute_kernels))
        fe = moe.expert_ffn_hidden_size / args.parallel.expert_tp
        ops.fbw(*kn.grouped_linear("expert_fc1", L, tokens, int(m1 * fe), w))
        # Transformer Engine's op fuser (``use_transformer_engine_op_fuser``, TE >= 2.14) runs the
        # clamped GLU and the probability-scaled fc2 bias inside its fused expert ops
        # (moe/experts.py ``_is_fused_impl_supported``); when it runs is the stack's
        # (Fusion.expert_op_fuser: Megatron-Bridge's recipes that set HybridEP's rank budget set it)
        eager = not args.fusion.expert_ops_fused(moe)
        if model.activation_clamp is not None and eager:
            ops.pair(_expert_clamp(L, routed, int(fe)))
        ops.pair(kn.eager_activation("expert_act", L, routed, int(fe)) if titan and m1 == 2 else
                 kn.activation("expert_act", L, routed, int(fe), model.mlp))
        ops.fbw(*kn.grouped_linear("expert_fc2", L, tokens, w, int(fe)))
        if model.add_bias_linear and eager:
            ops.pair(_expert_bias(L, routed, w, len(tokens)))
        # unpermute: the reverse of permute, plus the probability-weighted sum of the top_k copies
        ops.pair(kn.titan_unpermute(L, Tn, routed, w) if titan else
                 kn.ew_pair("moe_unpermute", L, perm, perm, *args.fusion.permute_kernels))

    def activation_terms(self, d, modules, out) -> None:
        m = self.model
        h = m.hidden_size
        if "layernorm" not in modules:
            out["ffn_input"] = d.tok_sp * h * d.lb
        moe = m.moe
        if "moe" in modules:
            return
        gate = 2 if m.mlp == "swiglu" else 1
        tokens = d.tok_sp                              # tokens this rank routes
        out["router"] = tokens * moe.num_experts * (4 + 1)
        rows = tokens * moe.top_k * d.etp * d.imbalance
        fe = moe.expert_ffn_hidden_size / d.etp
        out["expert_input"] = rows * (moe.latent_size or h) * d.lb
        out["expert_fc1_output"] = rows * gate * fe * d.e
        if "moe_act" not in modules:
            out["expert_fc2_input"] = rows * fe * d.lb
        out["moe_combine"] = tokens * moe.top_k * (moe.latent_size or h) * d.e
        if moe.num_shared_experts and "shared_experts" not in modules:
            fs = moe.num_shared_experts * moe.shared_expert_ffn_hidden_size / d.t
            out["shared_fc1_output"] = d.tok * gate * fs * d.e
            out["shared_fc2_input"] = d.tok * fs * d.lb

    def dispatch_buffer_bytes(self, d) -> float:
        rows = d.tok_sp * self.model.moe.top_k * d.etp * d.imbalance
        return 2 * rows * self.model.hidden_size * d.e            # send and receive buffers of one all-to-all

    def mlp_widths(self) -> tuple[float, float]:
        """(routed width ``top_k x fe``, shared width ``S x fs``) of the block's MLPs per token."""
        moe = self.model.moe
        return moe.top_k * moe.expert_ffn_hidden_size, moe.num_shared_experts * moe.shared_expert_ffn_hidden_size

    def ffn_width(self) -> float:
        return sum(self.mlp_widths())

    def mc_flops_per_token(self, seq_len: int) -> float:
        """``6 m h (top_k fe + S fs)``: routed top-k and shared experts (the router is not counted)."""
        m = self.model
        routed, shared = self.mlp_widths()
        return 6 * (3 if m.mlp == "swiglu" else 2) * m.hidden_size * (routed + shared)

    def mc_hybrid_forward_per_token(self, seq_len: int) -> float:
        """Megatron-Core's ``hybrid_flops`` forward count per token: ``4 h fe k`` (latent:
        ``4 latent fe k + 4 h latent``) plus ``4 h S fs``, each x 3/2 for SwiGLU."""
        m = self.model
        h, moe = m.hidden_size, m.moe
        scale = 1.5 if m.mlp == "swiglu" else 1.0
        lat = moe.latent_size
        routed = (4 * (lat or h) * moe.expert_ffn_hidden_size * moe.top_k * scale
                  + (4 * h * lat if lat else 0))
        shared = 4 * h * moe.num_shared_experts * moe.shared_expert_ffn_hidden_size * scale
        return routed + shared


def _expert_clamp(L: int, routed: float, width: int):
    """The clamps ahead of the experts' gated activation (``activation_clamp``), as
    Megatron-Core runs them (megatron/core/fusions/fused_bias_geglu.py,
    ``weighted_bias_quick_geglu_impl``; the unfused ``glu`` of moe/experts.py the same): the
    fc1 output is chunked into its gate and linear halves (``a`` = routed tokens x width
    elements each), each half is clamped (read and write ``a``) and the two are concatenated
    (read and write ``2a``) before the fused activation kernel: ``8a`` in 3 kernels.  The
    backward, by PyTorch's ``clamp_backward`` (``where`` over comparison masks of one byte per
    element): the gate half ``le`` + ``where`` (``4a``, 2 kernels), the linear half ``ge``,
    ``le``, ``logical_and_``, ``where`` (``7a``, 4 kernels), then the two gradients
    concatenated for the chunk's input (``4a``, 1 kernel): ``15a`` in 7.  Under
    ``recompute_modules: [moe_act]`` the clamps are recomputed with the activation."""
    a = kn.act_bytes() * routed * width
    return kn.ew_pair("expert_clamp", L, 8 * a, 15 * a, 3, 7)


def _expert_bias(L: int, routed: float, width: int, local_experts: int):
    """The routed experts' fc2 bias, weighted by the routing probability, as Megatron-Core's
    ``TEGroupedMLP._apply_bias`` adds it (megatron/core/transformer/moe/experts.py; fc1's bias
    is added inside Transformer Engine's grouped GEMM): per local expert ``t + b * p`` over its
    tokens (``b * p`` writes ``c / E`` bytes, the add reads ``2 c / E`` and writes ``c / E``,
    ``c`` = routed tokens x width x 2 bytes), then ``torch.cat`` (read and write ``c``): ``6c``
    in ``2 E + 1`` kernels.  Backward: the bias gradient ``sum(grad * p)`` and the probability
    gradient ``sum(grad * b)`` (a product and a reduction each, ``3c`` each) per expert, and
    the split's gradient concatenated (``2c``): ``8c`` in ``4 E + 1``."""
    c = kn.act_bytes() * routed * width
    return kn.ew_pair("expert_bias", L, 6 * c, 8 * c, 2 * local_experts + 1, 4 * local_experts + 1)
