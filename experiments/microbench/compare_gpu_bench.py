"""What the GPU microbenchmarks (``gpu_bench.py``) say about clustersim's compute constants.

CPU only: reads the JSON files ``gpu_bench.py`` wrote (``data/`` holds the ones the constants
come from) and prints

* ``host``: the host's issue time per modelled kernel, per checkpointed layer and per
  collective call, the source of ``workloads.costs.host.HOST_COSTS["eager"]``;
* ``layer``: the measured FP16 Megatron layer (forward, backward) against the roofline
  model of the same GPU -- a check, nothing is fitted to it;
* ``sustained``: burst vs power-limited GEMM rates per dtype.

Usage: ``python experiments/microbench/compare_gpu_bench.py [--host FILE] [--bench FILE]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from workloads import ModelSpec, ParallelConfig  # noqa: E402
from workloads.costs.compute import RooflineComputeModel  # noqa: E402
from workloads.costs.flops import layer_ops  # noqa: E402

DATA = Path(__file__).with_name("data")


def megatron_2022_layer(h: int, heads: int, tp: int, b: int, s: int, recompute: str = "full"):
    """The modelled ops of the benchmark's layer: vTrain's GPT (GELU, LayerNorm, biases,
    dropout 0.1, unfused attention), one tensor-parallel rank, micro-batch ``b``."""
    model = ModelSpec(name="bench", num_layers=1, hidden_size=h, num_attention_heads=heads, ffn_hidden_size=4 * h,
                      vocab_size=50257, seq_len=s, mlp="gelu", norm="layernorm", position_embedding="learned",
                      add_bias_linear=True, dropout=0.1, flash_attention=False)
    par = ParallelConfig(tp=tp, pp=1, dp=1, micro_batch_size=b, global_batch_size=b, seq_len=s,
                         sequence_parallel=False, recompute=recompute)
    return layer_ops(model, par, 0, b, s)


def host_per_kernel(data: dict) -> tuple[float, list[tuple]]:
    """Median over the shapes of (forward without autograd + forward and backward) host
    time / the kernels the model counts for forward, recomputed forward and backward."""
    rows = []
    for r in data["host"]:
        ops = megatron_2022_layer(r["h"], r["heads"], r["tp"], r["b"], r["s"])
        kernels = sum(o.num_kernels for o in ops)
        t = r["fwd_host_s"] + r["fwd_bwd_host_s"]
        rows.append((r, kernels, t, t / kernels))
    return statistics.median(x[3] for x in rows), rows


def host_costs_measured(data: dict) -> dict[str, float]:
    """``kernel_s``, ``checkpoint_s`` and ``call_s`` (medians over the shapes) from a file
    with the ``host`` and ``checkpointed`` parts: the checkpoint function is the
    checkpointed layer's extra time over the plain forward(s) and backward, a call the
    extra time of the layer with Megatron's TP autograd functions over the 6 all-reduce
    calls they make per layer and micro-batch under full recompute."""
    kernel, rows = host_per_kernel(data)
    plain = {(r["h"], r["tp"], r["b"], r["s"]): t for r, _, t, _ in rows}
    ck = [c["host_s"] - plain[(c["h"], c["tp"], c["b"], c["s"])] for c in data["checkpointed"]]
    calls = [(c["tp_calls_host_s"] - c["host_s"]) / 6 for c in data["checkpointed"]]
    return {"kernel_s": kernel, "checkpoint_s": statistics.median(ck), "call_s": statistics.median(calls),
            "bare_call_s": statistics.median(c["all_reduce_call_host_s"] for c in data["checkpointed"])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default=str(DATA / "h100_host2.json"))
    ap.add_argument("--bench", default=str(DATA / "h100_bench.json"))
    args = ap.parse_args(argv)
    host = json.loads(Path(args.host).read_text())
    print(f"host: {host['gpu']}, torch {host['torch']}, Python {host['python']}, {host['cpu']}")
    per, rows = host_per_kernel(host)
    for r, k, t, x in rows:
        print(f"  h {r['h']:5d} tp {r['tp']} b {r['b']} s {r['s']}: forward {r['fwd_host_s'] * 1e3:.3f} ms "
              f"({r['fwd_kernels']} kernels), forward+backward {r['fwd_bwd_host_s'] * 1e3:.3f} ms "
              f"({r['fwd_bwd_kernels']} kernels); {t * 1e3:.3f} ms / {k} modelled = {x * 1e6:.1f} us")
    print(f"  median: {per * 1e6:.1f} us per modelled kernel")
    if "checkpointed" in host:
        for c in host["checkpointed"]:
            print(f"  h {c['h']:5d} tp {c['tp']} b {c['b']} s {c['s']}: checkpointed {c['host_s'] * 1e3:.3f} ms, with "
                  f"the TP calls {c['tp_calls_host_s'] * 1e3:.3f} ms; a bare all_reduce call "
                  f"{c['all_reduce_call_host_s'] * 1e6:.0f} us")
        hc = host_costs_measured(host)
        print(f"  medians: {hc['kernel_s'] * 1e6:.1f} us per kernel, {hc['checkpoint_s'] * 1e3:.3f} ms per "
              f"checkpointed layer, {hc['call_s'] * 1e6:.0f} us per TP call (bare {hc['bare_call_s'] * 1e6:.0f} us)")

    bench = json.loads(Path(args.bench).read_text())
    gpu = "H100-SXM" if "H100" in bench["gpu"] else bench["gpu"]
    cm = RooflineComputeModel(gpu, "bf16", num_gpus=1)
    print(f"\nlayer: {bench['gpu']} FP16 Megatron-LM 2022 layer, measured vs modelled (roofline, {gpu})")
    for r in bench.get("layer", []):
        ops = megatron_2022_layer(r["h"], r["heads"], r["tp"], r["b"], r["s"], recompute="none")
        f = sum(cm.op_time_s(o) for o in ops if o.phase == "F")
        b = sum(cm.op_time_s(o) for o in ops if o.phase != "F")
        mb = r["fwd_bwd_s"] - r["fwd_s"]
        print(f"  h {r['h']:5d} tp {r['tp']:2d} b {r['b']}: forward {r['fwd_s'] * 1e3:7.3f} ms, model "
              f"{(f / r['fwd_s'] - 1) * 100:+5.1f} %; backward {mb * 1e3:7.3f} ms, model {(b / mb - 1) * 100:+5.1f} %")
    print("\nsustained GEMM rates (the first 0.5 s vs the last third of each run)")
    for r in bench.get("sustained", []):
        m, n, k = r["shape"]
        print(f"  {r['dtype']:5s} {m}x{n}x{k}: burst {r['burst_tflops']:7.1f} TFLOP/s, sustained "
              f"{r['sustained_tflops']:7.1f} at {r['sustained_clock_mhz']:.0f} MHz, {r['sustained_power_w']:.0f} W")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
