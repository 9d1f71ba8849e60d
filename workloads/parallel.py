"""`ParallelConfig`: the 5D parallel layout, its training knobs, and their validation.

Degrees
-------
Dense layers use the axes (tp, cp, dp, pp); MoE layers use (etp, ep, edp, pp) over the
same ranks, with ``tp * cp * dp == etp * ep * edp`` (Megatron-Core "MoE parallel
folding"; etp defaults to tp).  Two ways to write the degrees are accepted:

* **Folded form** (Megatron-Core's own): give ``dp`` as the dense data-parallel degree
  and any of ``etp`` / ``edp``; the missing expert degree is derived from the identity
  above.  Example: 64 GPUs, ``tp=2, cp=1, dp=8, pp=4, ep=4, etp=1`` gives ``edp=4``.
* **Five-degree shorthand** (the seed texts' ``world = dp * tp * pp * cp * ep``): give
  ``dp`` *without* ``etp`` / ``edp``; EP is carved out of data parallelism, so the dense
  data-parallel degree is ``dp * ep``, ``etp = tp`` and ``edp = dp * cp``.  Example:
  64 GPUs, ``dp=2, tp=2, pp=4, cp=1, ep=4`` is dense DP 8, expert DP 2.

A Megatron-LM command line states the dense DP implicitly (world / (tp * cp * pp)) and
it *includes* EP; :meth:`ParallelConfig.from_megatron` takes that form.

``dp = -1`` means "whatever is left": resolved against the GPU count by
:meth:`ParallelConfig.resolve`.

All errors are :class:`~topologies.ConfigError` naming the field, the value and the rule.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from topologies import ConfigError
from topologies.errors import check_keys

from .blocks.mamba import check_mamba_split
from .schedules import SCHEDULE_NAMES, default_vpp, validate_schedule_config

__all__ = ["ParallelConfig", "SCHEDULE_NAMES", "RECOMPUTE_KINDS", "check_mamba_split", "split_layers",
           "parse_pipeline_layout"]

RECOMPUTE_KINDS = ("none", "selective", "full")
RECOMPUTE_METHODS = ("uniform", "block")
RECOMPUTE_MODULES = ("core_attn", "mlp", "moe", "moe_act", "layernorm", "mla_up_proj", "shared_experts")
MESH_AXES = ("tp", "cp", "ep", "dp", "pp")
CP_COMM_TYPES = ("p2p", "all_gather", "a2a", "a2a+p2p")
CP_SPLITS = ("zigzag", "sequential")


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelConfig:
    """A 5D parallel layout plus the knobs that shape a training step."""

    tp: int = 1
    """Tensor-parallel degree (dense layers). 1 means disabled."""
    cp: int = 1
    """Context-parallel degree: the sequence is split over cp ranks (load-balanced causal split)."""
    cp_comm_type: str = "p2p"
    """How the CP ranks exchange attention inputs (Megatron-Core's ``--cp-comm-type``,
    Transformer Engine's ``cp_comm_type``): ``p2p`` ring attention (the default), ``all_gather``,
    ``a2a`` (Ulysses) or ``a2a+p2p`` (hierarchical)."""
    hierarchical_context_parallel_sizes: tuple[int, ...] | None = None
    """With ``cp_comm_type: a2a+p2p``: ``[a2a size, p2p size]`` (inner all-to-all group of
    adjacent CP ranks, ring across them), product ``cp`` (Megatron-Core's
    ``--hierarchical-context-parallel-sizes``)."""
    cp_split: str = "zigzag"
    """How the sequence is cut over CP ranks: ``zigzag`` (2 x cp chunks, rank r holding chunks
    r and 2cp-1-r: what Megatron-Core and Transformer Engine do) or ``sequential`` (rank r
    holds the r-th contiguous 1/cp: a what-if only, Megatron has no such switch; it shows
    the causal imbalance zigzag removes)."""
    dp: int = 1
    """Dense data-parallel degree (folded form); -1 before :meth:`resolve` means "the rest"."""
    pp: int = 1
    """Pipeline-parallel degree."""
    ep: int = 1
    """Expert-parallel degree (MoE layers)."""
    etp: int = 0
    """Expert tensor-parallel degree; 0 means "same as tp"."""
    edp: int = 0
    """Expert data-parallel degree; 0 means "derived": tp*cp*dp / (etp*ep)."""
    micro_batch_size: int = 1
    """Sequences per micro-batch per data-parallel rank."""
    global_batch_size: int = 0
    """Sequences per optimizer step over all replicas; 0 means micro_batch_size * dp."""
    seq_len: int | None = None
    """Tokens per sequence; None means the model's default."""
    schedule: str = "1f1b"
    """Pipeline schedule: gpipe | 1f1b | interleaved_1f1b | zb_h1 | dualpipe | zb_v (with vpp 2)."""
    vpp: int = 1
    """Model chunks (virtual stages) per pipeline rank; > 1 only with interleaved_1f1b and
    zb_v (exactly 2; the default when a scenario names zb_v without vpp)."""
    zero_stage: int = 1
    """ZeRO stage 0-3 (3 = FSDP: parameters sharded and gathered per layer)."""
    distributed_optimizer: bool = True
    """Megatron's distributed optimizer (ZeRO-1 style sharding of optimizer state over DP)."""
    sequence_parallel: bool = True
    """Sequence parallelism in the TP group (norms and dropout sharded along the sequence)."""
    recompute: str = "selective"
    """Activation recomputation: none | selective | full."""
    recompute_num_layers: int | None = None
    """With full recompute: layers per stage (uniform: per group) that recompute."""
    recompute_method: str = "uniform"
    """With full recompute: uniform | block (Megatron's --recompute-method)."""
    recompute_modules: tuple[str, ...] = ("core_attn",)
    """With selective recompute: modules recomputed (Megatron-Core's --recompute-modules)."""
    mesh_order: str = "tp-cp-ep-dp-pp"
    """Rank order of the mesh axes, innermost first (Megatron's convention)."""
    scatter_gather_tensors_in_pipeline: bool = False
    """Megatron-LM's (pre-Core) pipeline scatter/gather, on by default there
    (``--no-scatter-gather-tensors-in-pipeline`` turned it off): without sequence
    parallelism each TP rank sends only its 1/tp slice of the activation to the next stage,
    and the receiving TP group all-gathers it.  Megatron-Core dropped it (False)."""
    num_layers_in_first_pipeline_stage: int | None = None
    num_layers_in_last_pipeline_stage: int | None = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    pipeline_layout: str | None = None
    """Explicit layer layout, Megatron style: virtual stages separated by '|', tokens
    ``E`` (embedding), ``t`` (transformer layer), ``m`` (MTP layer), ``L`` (loss), with
    repetition ``t*3`` and ``(tt|)*2``."""

    offload_activation_layers: int = 0
    """Leading decoder layers whose activations go to host memory and back (Megatron-Core's
    ``cpu_offloading_num_layers``; scenario ``offload.activations``, :mod:`workloads.offload`)."""
    offload_modules: tuple[str, ...] = ()
    """Modules whose inputs every layer sends to the host (fine-grained offload,
    ``offload_modules``; scenario ``offload.modules``)."""
    optimizer_offload_fraction: float = 0.0
    """Share of the optimizer shard kept and stepped on the CPU (``optimizer_offload_fraction``;
    scenario ``offload.optimizer``)."""
    overlap_optimizer_copies: bool = False
    """Pipeline the offloaded optimizer's copies with its CPU step (``overlap_cpu_optimizer_d2h_h2d``)."""

    degree_form: str = dataclasses.field(default="folded", compare=False, repr=False)
    """How the degrees were written: ``folded`` (Megatron's: ``dp`` is the dense degree, EP
    folded into it) or ``five-degree`` (``ep`` carved out of ``dp``); errors say which."""

    # -- derived ---------------------------------------------------------------------------
    @property
    def expert_tp(self) -> int:
        return self.etp or self.tp

    @property
    def expert_dp(self) -> int:
        if self.edp:
            return self.edp
        return (self.tp * self.cp * self.dp) // (self.expert_tp * self.ep)

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def batch_size(self) -> int:
        """Global batch in sequences (``global_batch_size``, or one micro-batch per replica)."""
        return self.global_batch_size or self.micro_batch_size * self.dp

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per step per data-parallel replica."""
        return self.batch_size // (self.micro_batch_size * self.dp)

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: dict, where: str = "parallel") -> "ParallelConfig":
        """From a YAML mapping; see the module docstring for the two ways to give degrees."""
        if not isinstance(d, dict):
            raise ConfigError(where, d, "expected a mapping")
        names = {f.name for f in dataclasses.fields(cls)} - {"degree_form"}
        check_keys(d, names, where)
        kw = dict(d)
        for key in ("recompute_modules", "offload_modules"):
            if key in kw and isinstance(kw[key], list):
                kw[key] = tuple(kw[key])
        hcp = kw.get("hierarchical_context_parallel_sizes")
        if hcp is not None:
            if not isinstance(hcp, (list, tuple)) or any(isinstance(x, bool) or not isinstance(x, int) for x in hcp):
                raise ConfigError(f"{where}.hierarchical_context_parallel_sizes", hcp, "must be a list of integers")
            kw["hierarchical_context_parallel_sizes"] = tuple(hcp)
        for key in ("tp", "cp", "dp", "pp", "ep", "etp", "edp", "micro_batch_size", "global_batch_size", "vpp",
                    "zero_stage", "seq_len", "recompute_num_layers", "num_layers_in_first_pipeline_stage",
                    "num_layers_in_last_pipeline_stage"):
            v = kw.get(key)
            # null is "not given" only where the field's default is itself None (seq_len, the
            # edge stages...); a null degree would otherwise reach the range checks as None
            if v is None and key in kw and _DEFAULTS[key] is not None:
                raise ConfigError(f"{where}.{key}", v, f"must be an integer (leave it out for the default, "
                                                     f"{_DEFAULTS[key]})")
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise ConfigError(f"{where}.{key}", v, "must be an integer")
        for key in ("distributed_optimizer", "sequence_parallel", "account_for_embedding_in_pipeline_split",
                    "account_for_loss_in_pipeline_split", "scatter_gather_tensors_in_pipeline"):
            if key in kw and not isinstance(kw[key], bool):
                raise ConfigError(f"{where}.{key}", kw[key], "must be true or false")
        if "vpp" not in kw and isinstance(kw.get("schedule"), str):
            kw["vpp"] = default_vpp(kw["schedule"])       # zb_v: its two chunks, as `clustersim schedule` gives them
        shorthand = "etp" not in d and "edp" not in d and kw.get("ep", 1) > 1 and kw.get("dp", 1) != -1
        if shorthand:
            # five-degree form: EP carved from data parallelism
            dp, ep, cp = kw.get("dp", 1), kw["ep"], kw.get("cp", 1)
            kw["dp"] = dp * ep
            kw["etp"] = kw.get("tp", 1)
            kw["edp"] = dp * cp
            kw["degree_form"] = "five-degree"
        cfg = cls(**kw)
        cfg.check(where)
        return cfg

    @classmethod
    def from_megatron(cls, *, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1, etp: int | None = None,
                      world_size: int, **kw) -> "ParallelConfig":
        """Megatron-LM's degrees: dense DP is implicit (world / (tp*cp*pp)) and includes EP."""
        denom = tp * cp * pp
        if world_size % denom:
            raise ConfigError("world_size", world_size, f"must be divisible by tp*cp*pp = {denom}")
        dp = world_size // denom
        etp = tp if etp is None else etp
        if (tp * cp * dp) % (etp * ep):
            raise ConfigError("ep", ep, f"etp*ep = {etp * ep} must divide tp*cp*dp = {tp * cp * dp}")
        cfg = cls(tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, etp=etp, edp=(tp * cp * dp) // (etp * ep), **kw)
        cfg.check()
        return cfg

    def _form_hint(self, num_gpus: int) -> str:
        """For an MoE layout whose degrees miss the GPU count: which form was read, and the
        dp each form needs (``""`` without EP)."""
        if self.ep <= 1:
            return ""
        rest = self.tp * self.cp * self.pp
        folded = num_gpus // rest if num_gpus % rest == 0 else None
        five = num_gpus // (rest * self.ep) if num_gpus % (rest * self.ep) == 0 else None
        if self.degree_form == "five-degree":
            read = (f"; read as the five-degree form (ep carved out of dp: dense dp = dp x ep = {self.dp})")
            other = (f"; for this GPU count write dp: {five} with ep: {self.ep}" if five else "") + \
                (f", or Megatron's folded form dp: {folded}, ep: {self.ep}, etp: {self.expert_tp}" if folded else "")
        else:
            read = f"; read as Megatron's folded form (dp = {self.dp} is the dense degree, ep folded into it)"
            other = (f"; for this GPU count write dp: {folded}" if folded else "") + \
                (f", or the five-degree form dp: {five}, ep: {self.ep} without etp/edp" if five else "")
        return read + other

    def resolve(self, num_gpus: int) -> "ParallelConfig":
        """Fill ``dp = -1`` from the GPU count and check the world size."""
        cfg = self
        if self.dp == -1:
            rest = self.tp * self.cp * self.pp
            if num_gpus % rest:
                raise ConfigError("parallel.dp", -1,
                                  f"the GPU count {num_gpus} is not divisible by tp*cp*pp = {rest}")
            cfg = dataclasses.replace(self, dp=num_gpus // rest)
            cfg.check()
        if cfg.world_size != num_gpus:
            raise ConfigError("parallel", cfg.describe(),
                              f"tp*cp*dp*pp = {cfg.world_size} must equal the number of GPUs, {num_gpus}"
                              + cfg._form_hint(num_gpus))
        return cfg

    def describe(self) -> str:
        s = f"tp={self.tp} cp={self.cp} dp={self.dp} pp={self.pp}"
        if self.ep > 1 or self.etp:
            s += f" | etp={self.expert_tp} ep={self.ep} edp={self.expert_dp}"
        return s

    # -- validation --------------------------------------------------------------------------
    def check(self, where: str = "parallel") -> None:
        """Rules that need no model or cluster."""
        for key in ("tp", "cp", "pp", "ep", "vpp", "micro_batch_size"):
            v = getattr(self, key)
            if v < 1:
                raise ConfigError(f"{where}.{key}", v, "must be >= 1")
        if self.dp < 1 and self.dp != -1:
            raise ConfigError(f"{where}.dp", self.dp, "must be >= 1, or -1 for the rest of the GPUs")
        for key in ("etp", "edp", "global_batch_size"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{where}.{key}", getattr(self, key), "must be >= 0 (0: derived)")
        if self.dp != -1:
            dense = self.tp * self.cp * self.dp
            if self.edp:
                if self.expert_tp * self.ep * self.edp != dense:
                    raise ConfigError(f"{where}.edp", self.edp,
                                      f"etp*ep*edp = {self.expert_tp}*{self.ep}*{self.edp} must equal "
                                      f"tp*cp*dp = {dense} (MoE parallel folding)")
            elif dense % (self.expert_tp * self.ep):
                raise ConfigError(f"{where}.ep", self.ep,
                                  f"etp*ep = {self.expert_tp * self.ep} must divide tp*cp*dp = {dense}")
            if self.batch_size % (self.micro_batch_size * self.dp):
                raise ConfigError(f"{where}.global_batch_size", self.global_batch_size,
                                  f"must be a multiple of micro_batch_size x dp = {self.micro_batch_size * self.dp}")
        if self.schedule not in SCHEDULE_NAMES:
            raise ConfigError(f"{where}.schedule", self.schedule, f"must be one of {', '.join(SCHEDULE_NAMES)}")
        self._check_cp(where)
        if self.zero_stage not in (0, 1, 2, 3):
            raise ConfigError(f"{where}.zero_stage", self.zero_stage, "must be 0, 1, 2 or 3")
        if self.recompute not in RECOMPUTE_KINDS:
            raise ConfigError(f"{where}.recompute", self.recompute, f"must be one of {', '.join(RECOMPUTE_KINDS)}")
        if self.recompute_method not in RECOMPUTE_METHODS:
            raise ConfigError(f"{where}.recompute_method", self.recompute_method,
                              f"must be one of {', '.join(RECOMPUTE_METHODS)}")
        for m in self.recompute_modules:
            if m not in RECOMPUTE_MODULES:
                raise ConfigError(f"{where}.recompute_modules", m, f"unknown module; known: {', '.join(RECOMPUTE_MODULES)}")
        if self.recompute_num_layers is not None and self.recompute_num_layers < 1:
            raise ConfigError(f"{where}.recompute_num_layers", self.recompute_num_layers, "must be >= 1")
        axes = self.mesh_order.split("-")
        if sorted(axes) != sorted(MESH_AXES):
            raise ConfigError(f"{where}.mesh_order", self.mesh_order,
                              f"must name each of {', '.join(MESH_AXES)} once, innermost first")

    def _check_cp(self, where: str) -> None:
        if self.cp_comm_type not in CP_COMM_TYPES:
            raise ConfigError(f"{where}.cp_comm_type", self.cp_comm_type, f"must be one of {', '.join(CP_COMM_TYPES)}")
        if self.cp_split not in CP_SPLITS:
            raise ConfigError(f"{where}.cp_split", self.cp_split, f"must be one of {', '.join(CP_SPLITS)}")
        h = self.hierarchical_context_parallel_sizes
        if self.cp_comm_type == "a2a+p2p":
            # Megatron-Core: a2a+p2p needs --hierarchical-context-parallel-sizes, whose product is cp
            if h is None or len(h) != 2 or any(x < 1 for x in h) or h[0] * h[1] != self.cp:
                raise ConfigError(f"{where}.hierarchical_context_parallel_sizes", h,
                                  f"cp_comm_type a2a+p2p needs [a2a size, p2p size] with product cp = {self.cp}")
        elif h is not None:
            raise ConfigError(f"{where}.hierarchical_context_parallel_sizes", h, "only with cp_comm_type a2a+p2p")

    def cp_sizes(self) -> tuple[int, int]:
        """(all-to-all size, ring size) of the CP exchange: (1, cp) for p2p and all_gather,
        (cp, 1) for a2a, the hierarchical sizes for a2a+p2p."""
        if self.cp_comm_type == "a2a":
            return self.cp, 1
        if self.cp_comm_type == "a2a+p2p":
            a, p = self.hierarchical_context_parallel_sizes
            return a, p
        return 1, self.cp

    def check_model(self, model, where: str = "parallel") -> None:
        """Rules that involve the model (``model`` is a workloads ModelSpec)."""
        if self.offload_activation_layers or self.optimizer_offload_fraction or self.offload_modules:
            from .offload import check_offload
            check_offload(self, model)
        heads = model.num_attention_heads
        kv = model.num_kv_heads
        if heads % self.tp:
            raise ConfigError(f"{where}.tp", self.tp, f"must divide the attention heads ({heads})")
        if kv % self.tp and self.tp % kv:
            raise ConfigError(f"{where}.tp", self.tp,
                              f"must divide the KV heads ({kv}) or be a multiple of them (replicated KV heads)")
        if getattr(model, "mamba", None) is not None:
            check_mamba_split(model, self.tp, self.cp)
        moe = getattr(model, "moe", None)
        if moe is not None:
            if moe.num_experts % self.ep:
                raise ConfigError(f"{where}.ep", self.ep, f"must divide the number of experts ({moe.num_experts})")
        elif self.ep > 1:
            raise ConfigError(f"{where}.ep", self.ep, "expert parallelism needs a mixture-of-experts model")
        seq = self.seq_len or model.seq_len
        if self.cp > 1 and seq % (2 * self.cp):
            raise ConfigError(f"{where}.seq_len", seq,
                              f"must be divisible by 2 x cp = {2 * self.cp} (load-balanced causal split)")
        if self.sequence_parallel and self.tp > 1 and (seq // self.cp) % self.tp:
            raise ConfigError(f"{where}.seq_len", seq, f"the per-CP-rank sequence must divide by tp = {self.tp} "
                                                       "(sequence parallelism)")
        a2a = self.cp_sizes()[0]
        if self.cp > 1 and a2a > 1:
            # Transformer Engine's AttnFuncWithCPAndQKVOA2A: "cp_comm_type='a2a' requires
            # num_heads % cp_size == 0 for Q, K, V" -- the heads a TP rank holds (KV heads
            # replicated when tp exceeds them) are split over the all-to-all group
            q_loc = heads // self.tp
            kv_loc = max(kv // self.tp, 1) if getattr(model, "mla", None) is None else q_loc
            for name, n in (("attention heads", q_loc), ("KV heads", kv_loc)):
                if n % a2a:
                    raise ConfigError(f"{where}.cp_comm_type", self.cp_comm_type,
                                      f"the {name} per TP rank ({n}) must divide by the all-to-all CP size {a2a}")
        if moe is not None:
            self._check_pipeline_groups(where)
        split_layers(model.num_layers, self, mtp_layers=getattr(model, "mtp_layers", 0), where=where)

    def _check_pipeline_groups(self, where: str) -> None:
        """The dense mesh (tp, cp, ep=1, dp, pp) and the expert mesh (etp, cp=1, ep, edp, pp)
        lay the same ranks out in ``mesh_order``; they give the same pipeline stages only
        when the axes inside ``pp`` span as many ranks in both.  Megatron-Core asserts the
        two meshes' pp groups are equal (``initialize_model_parallel``); otherwise an
        expert-parallel group would mix pipeline stages."""
        axes = self.mesh_order.split("-")
        inner = axes[:axes.index("pp")]
        dense = {"tp": self.tp, "cp": self.cp, "ep": 1, "dp": self.dp}
        expert = {"tp": self.expert_tp, "cp": 1, "ep": self.ep, "dp": self.expert_dp}
        d = e = 1
        for a in inner:
            d, e = d * dense[a], e * expert[a]
        if d != e:
            raise ConfigError(f"{where}.mesh_order", self.mesh_order,
                              f"the axes inside pp ({'-'.join(inner)}) span {d} ranks of the dense layers but {e} "
                              f"of the expert layers, so their pipeline stages would differ; put pp outermost "
                              f"(e.g. tp-cp-ep-dp-pp)")

    def check_schedule(self, where: str = "parallel") -> None:
        """Micro-batch and vpp rules of the pipeline schedule (minimum micro-batches per schedule)."""
        validate_schedule_config(self.schedule, self.pp, self.num_microbatches, self.vpp, where=where)


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ParallelConfig)}


# -- pipeline split --------------------------------------------------------------------------
_KNOBS = ("num_layers_in_first_pipeline_stage, num_layers_in_last_pipeline_stage, "
          "account_for_embedding_in_pipeline_split, account_for_loss_in_pipeline_split or pipeline_layout")


def parse_pipeline_layout(layout: str, where: str = "parallel.pipeline_layout") -> list[list[str]]:
    """Megatron-style layout string -> list of virtual stages, each a list of tokens.

    >>> parse_pipeline_layout("Et*2|(tt|)*2,tL")
    [['E', 't', 't'], ['t', 't'], ['t', 't'], ['t', 'L']]
    """
    text = layout.replace(",", "").replace(" ", "")

    def expand(s: str) -> str:
        # innermost parenthesised groups first, then single-token repetition
        pat = re.compile(r"\(([^()]*)\)\*(\d+)")
        while True:
            new = pat.sub(lambda m: m.group(1) * int(m.group(2)), s)
            if new == s:
                break
            s = new
        return re.sub(r"([EtmL])\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)

    flat = expand(text)
    if re.search(r"[^EtmL|]", flat):
        raise ConfigError(where, layout, "tokens must be E, t, m, L, '|', with repetition x*n or (...)*n")
    return [list(stage) for stage in flat.split("|")]


def mtp_per_virtual_stage(cfg: ParallelConfig, mtp_layers: int, num_virtual_stages: int) -> list[int]:
    """MTP modules each virtual stage holds: where ``pipeline_layout`` puts its ``m`` tokens,
    else all of them on the last (Megatron-Core builds them in the post-process stage)."""
    if cfg.pipeline_layout is not None:
        return [tokens.count("m") for tokens in parse_pipeline_layout(cfg.pipeline_layout)]
    out = [0] * num_virtual_stages
    out[-1] = mtp_layers
    return out


def split_layers(num_layers: int, cfg: ParallelConfig, mtp_layers: int = 0,
                 where: str = "parallel") -> list[list[int]]:
    """Transformer layers per (stage, chunk): ``result[stage][chunk]``.

    Megatron's rules: without knobs the layers divide evenly over pp x vpp virtual
    stages; ``num_layers_in_first/last_pipeline_stage`` fix the edge stages and split the
    rest evenly; ``account_for_embedding/loss_in_pipeline_split`` count the embedding /
    loss as one layer of the first / last stage; ``pipeline_layout`` gives every virtual
    stage explicitly (virtual stage ``k`` is chunk ``k // pp`` of stage ``k % pp``).
    """
    pp, vpp = cfg.pp, cfg.vpp
    nvs = pp * vpp
    if cfg.pipeline_layout is not None:
        stages = parse_pipeline_layout(cfg.pipeline_layout, f"{where}.pipeline_layout")
        if len(stages) != nvs:
            raise ConfigError(f"{where}.pipeline_layout", cfg.pipeline_layout,
                              f"has {len(stages)} virtual stages; pp x vpp = {nvs}")
        counts = [s.count("t") for s in stages]
        if sum(counts) != num_layers:
            raise ConfigError(f"{where}.pipeline_layout", cfg.pipeline_layout,
                              f"places {sum(counts)} transformer layers; the model has {num_layers}")
        if stages[0][:1] != ["E"] or stages[-1][-1:] != ["L"]:
            raise ConfigError(f"{where}.pipeline_layout", cfg.pipeline_layout,
                              "must start with the embedding E and end with the loss L")
        if sum(s.count("m") for s in stages) != mtp_layers:
            raise ConfigError(f"{where}.pipeline_layout", cfg.pipeline_layout,
                              f"places {sum(s.count('m') for s in stages)} MTP layers; the model has {mtp_layers}")
        return [[counts[c * pp + s] for c in range(vpp)] for s in range(pp)]
    first, last = cfg.num_layers_in_first_pipeline_stage, cfg.num_layers_in_last_pipeline_stage
    total = num_layers + int(cfg.account_for_embedding_in_pipeline_split) + int(cfg.account_for_loss_in_pipeline_split)
    if pp == 1 and vpp == 1:
        return [[num_layers]]
    per_stage = [None] * pp
    fixed = 0
    if first is not None:
        per_stage[0] = first
        fixed += first
    if last is not None:
        per_stage[-1] = last
        fixed += last
    free = [i for i in range(pp) if per_stage[i] is None]
    rest = total - fixed
    if rest < 0 or (free and rest % len(free)) or (not free and rest != 0):
        raise ConfigError(f"{where}.pp", pp, f"{num_layers} layers do not split over {pp} pipeline stages "
                                             f"(x {vpp} virtual stages) as given; use {_KNOBS}")
    for i in free:
        per_stage[i] = rest // len(free)
    if cfg.account_for_embedding_in_pipeline_split:
        per_stage[0] -= 1
    if cfg.account_for_loss_in_pipeline_split:
        per_stage[-1] -= 1
    out = []
    for s, n in enumerate(per_stage):
        slots = n + (1 if (s == 0 and cfg.account_for_embedding_in_pipeline_split) else 0) \
            + (1 if (s == pp - 1 and cfg.account_for_loss_in_pipeline_split) else 0)
        if n < 0 or slots % vpp:
            raise ConfigError(f"{where}.pp", pp, f"{num_layers} layers do not split over {pp} pipeline stages "
                                                 f"x {vpp} virtual stages; use {_KNOBS}")
        chunk = [slots // vpp] * vpp
        if s == 0 and cfg.account_for_embedding_in_pipeline_split:
            chunk[0] -= 1
        if s == pp - 1 and cfg.account_for_loss_in_pipeline_split:
            chunk[-1] -= 1
        if min(chunk) < 0:
            raise ConfigError(f"{where}.pp", pp, f"a virtual stage would get no layer; use {_KNOBS}")
        out.append(chunk)
    return out

