"""One rank's share of one micro-batch under a parallel layout, with the layout's
divisibility rules checked."""

from __future__ import annotations

import numbers

from topologies import ConfigError

from .kernels import Shard
from .mamba import check_mamba_split

__all__ = ["positive_int", "shard"]


def positive_int(field: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
        raise ConfigError(field, v, "must be an integer >= 1")
    return int(v)


def shard(model, parallel, micro_batch_size=None, seq_len=None) -> Shard:
    """One rank's share of one micro-batch (defaults: the layout's micro-batch and sequence),
    with the layout's divisibility rules checked."""
    b = positive_int("parallel.micro_batch_size",
                      parallel.micro_batch_size if micro_batch_size is None else micro_batch_size)
    s = positive_int("parallel.seq_len", (parallel.seq_len or model.seq_len) if seq_len is None else seq_len)
    tp, cp = parallel.tp, parallel.cp
    if s % cp:
        raise ConfigError("parallel.seq_len", s, f"must be divisible by cp = {cp}")
    T = b * s // cp
    sp = parallel.sequence_parallel and tp > 1
    if sp and T % tp:
        raise ConfigError("parallel.seq_len", s, f"tokens per CP rank ({T}) must divide by tp = {tp} "
                                                 "(sequence parallelism)")
    if model.num_attention_heads % tp:
        raise ConfigError("parallel.tp", tp, f"must divide the attention heads ({model.num_attention_heads})")
    kv = model.num_kv_heads
    if kv % tp and tp % kv:
        raise ConfigError("parallel.tp", tp, f"must divide the KV heads ({kv}) or be a multiple of them")
    if model.mamba is not None:
        check_mamba_split(model, tp, cp)
    return Shard(b, s, tp, cp, sp, T, T // tp if sp else T)
