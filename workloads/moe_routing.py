"""Mixture-of-experts token routing: how many tokens each expert (and each EP rank) gets.

A routing is named in the scenario (``moe_routing:``) and sampled per layer and
micro-batch from the scenario seed, so runs are reproducible:

``balanced``          every expert gets exactly ``tokens x top_k / experts`` (remainder to
                      the lowest-numbered experts): the ideal an auxiliary loss aims for.
``forced_balanced``   Megatron-Core's ``--moe-router-force-load-balancing``: router scores
                      are random, so counts are a multinomial draw with equal probabilities
                      (balanced in expectation, with sampling noise).
``skew(r)``           one expert (chosen by the seed) receives ``r`` times the mean load
                      (``r`` = max/mean, 1 <= r <= experts); the others share the rest evenly.
``zipf(s)``           expert popularity proportional to ``1 / rank^s`` over a seeded
                      permutation of the experts; counts are the expectation, rounded by
                      largest remainder so they sum exactly.
``trace``             counts read from a CSV (columns ``layer, microbatch, expert, tokens``);
                      layers and micro-batches missing from the trace fall back to balanced.

A trace may carry a ``source`` column: the EP source rank (``0 .. ep x etp - 1``, EP
coordinate ``source % ep``) whose router sent the tokens.  Without it (and for the sampled
kinds) the group's load is split evenly over its source ranks (:func:`split_sources`).

Capacity (Megatron-Core's token dropping, ``moe_utils.apply_router_token_dropping``): every
router call sees one rank's *local* tokens, so the capacity is per source rank and expert,
``ceil(local_tokens x top_k / experts x capacity_factor)`` (:func:`source_capacity`), and a
source rank drops what it routes to an expert above that -- not the pooled load of the EP
group, which under-drops when source ranks disagree (:func:`apply_source_capacity`).  With
``pad_to_capacity`` every (source, expert) pair sends exactly its capacity (at most the
local tokens).  Dropless (``None``) keeps all.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from topologies import ConfigError

__all__ = ["MoERouting", "parse_routing", "expert_load", "rank_load", "dispatch_matrix", "split_sources",
           "source_loads", "source_capacity", "apply_source_capacity", "apply_rank_budget", "source_dispatch_matrix",
           "DROP_POLICIES", "SKEWED_KINDS", "worst_rank_load"]

#: Megatron-Core's ``--moe-token-drop-policy``: which tokens an over-full expert drops (the
#: lowest routing probabilities, or the latest positions).  The count is the same either way.
DROP_POLICIES = ("probs", "position")
#: Megatron-Core's ``--moe-token-dispatcher-type`` and ``--moe-flex-dispatcher-backend``
#: (transformer_config.py; the ``ncclep`` backend is not modelled).
DISPATCHERS = ("alltoall", "allgather", "flex")
FLEX_BACKENDS = ("deepep", "hybridep")

#: Routings whose loads are uneven by construction: the memory estimate sizes a dropless run's
#: expert activations by the worst EP rank's load under them (:func:`worst_rank_load`).
#: ``forced_balanced`` is balanced in expectation and keeps the balanced estimate.
SKEWED_KINDS = ("skew", "zipf", "trace")

_SPEC = re.compile(r"^(skew|zipf)\(\s*([0-9.eE+-]+)\s*\)$")


@dataclass(frozen=True, slots=True)
class MoERouting:
    """A parsed routing: ``kind`` and its parameter (``skew`` max/mean, ``zipf`` exponent)."""

    kind: str
    param: float = 0.0
    trace: dict | None = None

    def __str__(self) -> str:
        return f"{self.kind}({self.param:g})" if self.kind in ("skew", "zipf") else self.kind


def parse_routing(spec, where: str = "moe_routing") -> MoERouting:
    """``"balanced"``, ``"forced_balanced"``, ``"skew(1.5)"``, ``"zipf(1.2)"`` or ``{"trace": path}``."""
    if isinstance(spec, MoERouting):
        return spec
    if isinstance(spec, dict):
        if set(spec) != {"trace"}:
            raise ConfigError(where, spec, "a mapping must be {trace: PATH}")
        return MoERouting("trace", 0.0, _load_trace(spec["trace"], where))
    text = str(spec).strip()
    if text in ("balanced", "forced_balanced"):
        return MoERouting(text)
    m = _SPEC.match(text)
    if not m:
        raise ConfigError(where, spec, "must be balanced, forced_balanced, skew(max_over_mean), zipf(s) or {trace: PATH}")
    kind, value = m.group(1), float(m.group(2))
    if kind == "skew" and value < 1.0:
        raise ConfigError(where, spec, "skew(r) needs r = max/mean >= 1")
    if kind == "zipf" and value < 0.0:
        raise ConfigError(where, spec, "zipf(s) needs s >= 0")
    return MoERouting(kind, value)


def _load_trace(path, where: str) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{where}.trace", str(path), "file not found")
    out: dict[tuple[int, int], dict[int, int]] = {}
    with p.open() as f:
        reader = csv.DictReader(f)
        need = {"layer", "microbatch", "expert", "tokens"}
        if not need <= set(reader.fieldnames or ()):
            raise ConfigError(f"{where}.trace", str(path), f"needs columns {', '.join(sorted(need))}")
        has_source = "source" in (reader.fieldnames or ())
        for row in reader:
            key = (int(row["layer"]), int(row["microbatch"]))
            if has_source:
                # per source rank: {(source, expert): tokens}
                out.setdefault(key, {})[(int(row["source"]), int(row["expert"]))] = int(row["tokens"])
            else:
                out.setdefault(key, {})[int(row["expert"])] = int(row["tokens"])
    return out


def _capped(weights: np.ndarray, total: int, cap: int) -> np.ndarray:
    """Integer loads summing to ``total`` in proportion to ``weights``, none above ``cap``.

    A token picks ``top_k`` *distinct* experts, so one expert receives at most every token
    once: ``cap = num_tokens``, ``top_k`` times below the total.  Experts whose share would
    pass it are held at it and the excess goes to the others in proportion to their
    weights (water-filling), then the rest is rounded by largest remainder.
    """
    w = np.asarray(weights, dtype=float)
    held = np.zeros(w.size, dtype=bool)
    while True:
        free = total - cap * int(held.sum())
        if not w[~held].sum() > 0:
            # the experts left have no weight (skew(r) with r = experts puts all of it on one)
            # yet each token still picks top_k distinct experts: spread the rest evenly
            w = np.where(held, w, 1.0)
        exact = np.where(held, 0.0, w) / w[~held].sum() * free
        over = ~held & (exact > cap)
        if not over.any():
            break
        held |= over
    if not held.any():
        return _largest_remainder(w, total)
    out = np.full(w.size, cap, dtype=np.int64)
    out[~held] = _largest_remainder(w[~held], free)
    return out


def _largest_remainder(weights: np.ndarray, total: int) -> np.ndarray:
    exact = weights / weights.sum() * total
    base = np.floor(exact).astype(np.int64)
    short = total - int(base.sum())
    if short:
        order = np.argsort(-(exact - base), kind="stable")
        base[order[:short]] += 1
    return base


def expert_load(routing: MoERouting, num_tokens: int, num_experts: int, top_k: int, *, layer: int = 0,
                microbatch: int = 0, seed: int = 0) -> np.ndarray:
    """Tokens routed to each expert (before capacity), summing to ``num_tokens x top_k``."""
    total = num_tokens * top_k
    kind = routing.kind
    if kind == "balanced":
        return _largest_remainder(np.ones(num_experts), total)
    rng = np.random.default_rng([seed, layer, microbatch, 0x6D6F65])
    if kind == "forced_balanced":
        return rng.multinomial(total, np.full(num_experts, 1.0 / num_experts)).astype(np.int64)
    if kind == "skew":
        r = min(routing.param, float(num_experts))
        hot = int(rng.integers(num_experts))
        w = np.full(num_experts, (num_experts - r) / max(num_experts - 1, 1))
        w[hot] = r
        return _capped(w, total, num_tokens)
    if kind == "zipf":
        ranks = rng.permutation(num_experts) + 1
        return _capped(1.0 / ranks.astype(float) ** routing.param, total, num_tokens)
    if kind == "trace":
        counts = routing.trace.get((layer, microbatch))
        if counts is None:
            return _largest_remainder(np.ones(num_experts), total)
        if counts and isinstance(next(iter(counts)), tuple):
            raise ConfigError("moe_routing.trace", "source", "a trace with a source column gives per-source loads "
                              "(source_loads), not one pooled load")
        out = np.zeros(num_experts, dtype=np.int64)
        for e, t in counts.items():
            if not 0 <= e < num_experts:
                raise ConfigError("moe_routing.trace", e, f"expert id must be in [0, {num_experts})")
            if not 0 <= t <= num_tokens:
                raise ConfigError("moe_routing.trace", t, f"layer {layer} micro-batch {microbatch} expert {e}: "
                                  f"tokens must be in [0, {num_tokens}] (a token picks an expert at most once)")
            out[e] = t
        return out
    raise ConfigError("moe_routing", kind, "unknown routing kind")


def apply_capacity(load: np.ndarray, num_tokens: int, top_k: int, capacity_factor: float | None,
                   pad_to_capacity: bool = False) -> tuple[np.ndarray, int]:
    """Tokens each expert computes on, and the number dropped, under a capacity factor."""
    if capacity_factor is None:
        return load, 0
    cap = math.ceil(capacity_factor * num_tokens * top_k / load.size)
    kept = np.minimum(load, cap)
    dropped = int(load.sum() - kept.sum())
    if pad_to_capacity:
        kept = np.full_like(load, cap)
    return kept, dropped


def rank_load(load: np.ndarray, ep: int) -> np.ndarray:
    """Tokens per EP rank: rank ``r`` holds experts ``[r E/ep, (r+1) E/ep)`` (Megatron's layout)."""
    if load.size % ep:
        raise ConfigError("parallel.ep", ep, f"must divide the number of experts ({load.size})")
    return load.reshape(ep, -1).sum(axis=1)


def dispatch_matrix(load: np.ndarray, ep: int, bytes_per_token: float) -> np.ndarray:
    """All-to-all dispatch bytes ``[i, j]`` from EP rank i to EP rank j.

    Every rank routes its own tokens with the same expert distribution (the group's
    load, split evenly over source ranks), so rank j receives ``rank_load[j] / ep``
    tokens from each rank.  The combine all-to-all is the transpose.
    """
    per_rank = rank_load(load, ep).astype(float)
    return np.tile(per_rank / ep * bytes_per_token, (ep, 1))


def _trace_has_sources(routing: MoERouting) -> bool:
    return routing.kind == "trace" and any(c and isinstance(next(iter(c)), tuple) for c in routing.trace.values())


def split_sources(load: np.ndarray, num_sources: int) -> np.ndarray:
    """``[source, expert]`` tokens: the group's ``load`` split evenly over its source ranks
    (each source rank routes its own tokens with the group's distribution).  An expert's
    remainder goes one token each to the sources after ``expert mod num_sources``, so no source
    rank is favoured."""
    load = np.asarray(load, dtype=np.int64)
    base, rem = np.divmod(load, num_sources)
    out = np.tile(base, (num_sources, 1))
    s = np.arange(num_sources)[:, None]
    e = np.arange(load.size)[None, :]
    out += ((s - e) % num_sources < rem[None, :]).astype(np.int64)
    return out


def source_loads(routing: MoERouting, tokens_per_source: int, num_sources: int, num_experts: int, top_k: int, *,
                 layer: int = 0, microbatch: int = 0, seed: int = 0) -> np.ndarray:
    """``[source, expert]`` tokens each source rank's router sends to each expert, before capacity.

    A trace with a ``source`` column gives them directly (a source it does not name routes
    balanced); otherwise the group's load (:func:`expert_load` over ``num_sources x
    tokens_per_source`` tokens) is split evenly (:func:`split_sources`)."""
    if _trace_has_sources(routing):
        counts = routing.trace.get((layer, microbatch))
        bal = _largest_remainder(np.ones(num_experts), tokens_per_source * top_k)
        out = np.tile(bal, (num_sources, 1))
        if counts:
            named = sorted({s for s, _ in counts})
            for s in named:
                if not 0 <= s < num_sources:
                    raise ConfigError("moe_routing.trace", s, f"source rank must be in [0, {num_sources}) "
                                      "(ep x etp source ranks)")
                out[s] = 0
            for (s, e), t in counts.items():
                if not 0 <= e < num_experts:
                    raise ConfigError("moe_routing.trace", e, f"expert id must be in [0, {num_experts})")
                if not 0 <= t <= tokens_per_source:
                    raise ConfigError("moe_routing.trace", t, f"layer {layer} micro-batch {microbatch} source {s} "
                                      f"expert {e}: tokens must be in [0, {tokens_per_source}] (a source rank's "
                                      "tokens pick an expert at most once)")
                out[s, e] = t
        return out
    load = expert_load(routing, tokens_per_source * num_sources, num_experts, top_k, layer=layer,
                       microbatch=microbatch, seed=seed)
    return split_sources(load, num_sources)


def source_capacity(tokens_per_source: int, num_experts: int, top_k: int, capacity_factor: float) -> int:
    """Tokens one router call keeps per expert: Megatron-Core's ``get_capacity`` on the
    call's ``local_tokens x top_k`` assignments, ``ceil(local_tokens x top_k / experts x
    capacity_factor)`` (source: megatron/core/transformer/moe/moe_utils.py, ``get_capacity``
    and ``apply_router_token_dropping``)."""
    return math.ceil((tokens_per_source * top_k / num_experts) * capacity_factor)


def apply_source_capacity(routed: np.ndarray, tokens_per_source: int, top_k: int, capacity_factor: float | None,
                          pad_to_capacity: bool = False) -> tuple[np.ndarray, int]:
    """``([source, expert]`` tokens sent and computed, assignments dropped``)`` under
    Megatron-Core's per-router-call capacity: each source rank keeps at most
    :func:`source_capacity` tokens per expert.  With ``pad_to_capacity`` every pair carries
    exactly the capacity -- all the local tokens when the capacity exceeds them, as the
    reference's capacity mask is then all ones."""
    routed = np.asarray(routed, dtype=np.int64)
    if capacity_factor is None:
        return routed, 0
    cap = source_capacity(tokens_per_source, routed.shape[1], top_k, capacity_factor)
    kept = np.minimum(routed, cap)
    dropped = int(routed.sum() - kept.sum())
    if pad_to_capacity:
        kept = np.full_like(routed, min(cap, tokens_per_source))
    return kept, dropped


def apply_rank_budget(kept: np.ndarray, ep: int, tokens_per_source: int, top_k: int,
                      rank_capacity_factor: float | None) -> tuple[np.ndarray, int]:
    """HybridEP's per-EP-rank budget (Megatron-Core's ``moe_expert_rank_capacity_factor``,
    token_dispatcher.py ``_HybridEPManager.setup_metadata``): a rank receives at most
    ``int(local_tokens x top_k x factor)`` token-expert assignments and HybridEP drops the
    rest.  Which ones it drops is HybridEP's internal order; the model takes the excess from
    every (source, expert) pair of the over-full rank in proportion to what it sent (an
    assumption), and leaves out the quantisation alignment of the budget."""
    kept = np.asarray(kept, dtype=np.int64)
    if rank_capacity_factor is None:
        return kept, 0
    budget = int(tokens_per_source * top_k * rank_capacity_factor)
    out = kept.copy()
    local = kept.shape[1] // ep
    for j in range(ep):
        block = out[:, j * local:(j + 1) * local]
        got = int(block.sum())
        if got > budget:
            flat = block.reshape(-1)
            block[...] = _largest_remainder(flat.astype(float), budget).reshape(block.shape) if budget else 0
    return out, int(kept.sum() - out.sum())


def source_dispatch_matrix(kept: np.ndarray, ep: int, bytes_per_token: float) -> np.ndarray:
    """All-to-all dispatch bytes ``[i, j]`` from EP rank i to EP rank j, from per-source
    tokens: source rank ``s`` sits on EP coordinate ``s mod ep`` (its expert-TP peers add to the
    same row, as in :func:`dispatch_matrix`), EP rank j holds experts ``[j E/ep, (j+1) E/ep)``."""
    kept = np.asarray(kept, dtype=np.int64)
    if kept.shape[1] % ep:
        raise ConfigError("parallel.ep", ep, f"must divide the number of experts ({kept.shape[1]})")
    rows = np.zeros((ep, kept.shape[1]), dtype=np.int64)
    for s in range(kept.shape[0]):
        rows[s % ep] += kept[s]
    return rows.reshape(ep, ep, -1).sum(axis=2).astype(float) * bytes_per_token


def worst_rank_load(routing: MoERouting, tokens_per_source: int, num_sources: int, num_experts: int, top_k: int,
                    ep: int, layers, num_microbatches: int, *, seed: int = 0,
                    routed_layers: int | None = None) -> tuple[float, float]:
    """How much more than the balanced share the most loaded EP rank receives, dropless:
    ``(held, peak)``, both ratios >= 1.

    ``held``: the tokens the worst EP rank receives summed over ``layers`` (the MoE layers
    of one pipeline stage, whose expert activations it holds together for one micro-batch),
    in the micro-batch where that sum is largest, over the same sum under balanced routing.
    ``peak``: the largest single (layer, micro-batch) rank load over the balanced one (what
    one dispatch buffer holds).  Layers at or above ``routed_layers`` (MTP modules, which
    the program routes balanced) count as balanced.  A rank's load is that of its
    ``E / ep`` experts (:func:`rank_load`) from the group's ``num_sources x
    tokens_per_source`` tokens."""
    layers = list(layers)
    if not layers:
        return 1.0, 1.0
    pool = tokens_per_source * num_sources
    balanced = pool * top_k / ep
    per_mb = np.zeros((num_microbatches, ep))
    peak = balanced
    for mb in range(num_microbatches):
        for layer in layers:
            if routed_layers is not None and layer >= routed_layers:
                per_mb[mb] += balanced
                continue
            if _trace_has_sources(routing):
                load = source_loads(routing, tokens_per_source, num_sources, num_experts, top_k, layer=layer,
                                    microbatch=mb, seed=seed).sum(axis=0)
            else:
                load = expert_load(routing, pool, num_experts, top_k, layer=layer, microbatch=mb, seed=seed)
            ranks = rank_load(load, ep)
            per_mb[mb] += ranks
            peak = max(peak, float(ranks.max()))
    held = float(per_mb.max()) / (balanced * len(layers))
    return max(held, 1.0), max(peak / balanced, 1.0)
