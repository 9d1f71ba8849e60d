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

Capacity: with ``capacity_factor`` c an expert accepts ``ceil(c x tokens x top_k / experts)``
tokens and drops the excess (Megatron-Core's token dropping); with ``pad_to_capacity``
every expert computes on exactly its capacity (padding).  Dropless (``None``) keeps all.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from topologies import ConfigError

__all__ = ["MoERouting", "parse_routing", "expert_load", "rank_load", "dispatch_matrix"]

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
        for row in reader:
            key = (int(row["layer"]), int(row["microbatch"]))
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
