"""Benchmark: build the class-level program of Llama-3.1 405B on 16,384 H100 GPUs.

Layout TP 8, PP 16 (7 | 8 x 14 | 7 layers), DP 128, 1F1B, GBS 2048, MBS 1, s 8192: the
scale of Meta's Llama 3 405B training (arXiv:2407.21783, Table 4 uses TP 8, PP 16,
DP 128 on 16,384 GPUs).  Also builds a MoE layout with skewed routing and the per-rank
expansion of a 1,024-GPU job.  Prints wall time (untraced), classes, ops and peak Python memory (a traced rebuild).

Run: python benchmarks/bench_program.py
"""

from __future__ import annotations

import time
import tracemalloc

from topologies import get_gpu_spec
from workloads import ParallelConfig, load_model
from workloads.program import build_program


def run(label, model, par, **kw):
    spec, gpu = load_model(model), get_gpu_spec("H100-SXM")
    t0 = time.perf_counter()
    prog = build_program(spec, par, gpu, **kw)
    dt = time.perf_counter() - t0
    tracemalloc.start()            # a second, traced build for the memory figure (tracing slows it)
    build_program(spec, par, gpu, **kw)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"{label:<44} {dt:6.3f} s  {len(prog.classes):>5} classes  {prog.num_ops:>8} ops  "
          f"{peak / 2**20:7.1f} MiB peak")
    return prog


def main() -> None:
    p405 = ParallelConfig(tp=8, pp=16, dp=128, micro_batch_size=1, global_batch_size=2048, seq_len=8192,
                          num_layers_in_first_pipeline_stage=7, num_layers_in_last_pipeline_stage=7)
    run("llama3.1-405b, 16,384 GPUs (class form)", "llama3.1-405b", p405)
    p70 = ParallelConfig(tp=8, pp=4, dp=32, micro_batch_size=1, global_batch_size=256, seq_len=8192)
    prog = run("llama3-70b, 1,024 GPUs (class form)", "llama3-70b", p70)
    t0 = time.perf_counter()
    total = sum(len(prog.expand(r)) for r in range(prog.grid.world_size))
    groups = prog.groups()
    print(f"{'  per-rank expansion of all 1,024 ranks':<44} {time.perf_counter() - t0:6.3f} s  "
          f"{total:>8} rank-ops, {len(groups)} groups")
    moe = ParallelConfig(tp=1, pp=2, dp=128, ep=64, etp=1, micro_batch_size=1, global_batch_size=512, seq_len=4096)
    run("qwen3-235b-a22b EP 64, 256 GPUs, skew(1.5)",
        "qwen3-235b-a22b", moe, moe_routing="skew(1.5)")


if __name__ == "__main__":
    main()
