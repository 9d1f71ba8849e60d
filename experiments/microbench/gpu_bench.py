"""GPU microbenchmarks behind clustersim's compute constants (needs PyTorch and a CUDA GPU).

Not part of the test suite: run it on a GPU machine, keep the JSON it writes, and compare
with the model using ``experiments/microbench/compare_gpu_bench.py`` (CPU only).

Three parts:

``sustained``   cuBLAS GEMMs run back to back for ``--seconds`` each, BF16 and FP8 (per-tensor
                scaled ``torch._scaled_mm``), on random normal data: the first half second's
                rate (burst) against the last third's (sustained, at the power limit), with
                the SM clock read through NVML.  Gives the sustained fraction per dtype.
``layer``       Megatron-LM's 2022 GPT layer as vTrain ran it (FP16, unfused core attention:
                baddbmm, softmax, dropout, bmm; bias-GELU; LayerNorm; no tensor-parallel
                communication), at one rank's shapes for a tensor-parallel degree: forward and
                backward times, and each forward kernel alone.
``host``        the same layer at small shapes, timed by the wall clock over many iterations
                without synchronising, against the GPU's own time: the host's issue time per
                layer when it, not the GPU, is the bottleneck.
``checkpointed`` the same under ``torch.utils.checkpoint`` (Megatron's full recompute), without
                and with Megatron's tensor-parallel all-reduce calls (a one-rank NCCL group),
                and a bare all-reduce call: the host cost of a collective call.

Usage: ``python3 gpu_bench.py --out results.json [--seconds 20] [--parts host,checkpointed,layer,sustained]``
(the committed ``data/h100_host2.json`` is ``--parts host,checkpointed``; ``data/h100_bench.json``
the layer and sustained parts and an earlier form of the host part, from another start of the
same H100 machine image).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time

import torch
import torch.nn.functional as F


def _events_time(fn, iters: int, warmup: int = 3) -> float:
    """Median GPU seconds per call of ``fn`` (CUDA events around each call)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    times.sort()
    return times[len(times) // 2]


# -- sustained GEMM rate ----------------------------------------------------------------------
def _nvml():
    try:
        import pynvml
        pynvml.nvmlInit()
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    except Exception:  # noqa: BLE001 -- clocks are optional context
        return None, None


def sustained(m: int, n: int, k: int, dtype: str, seconds: float) -> dict:
    dev = "cuda"
    if dtype == "bf16":
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)

        def op():
            return a @ b
    else:
        a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
        bt = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn)
        one = torch.tensor(1.0, device=dev)

        def op():
            return torch._scaled_mm(a, bt.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    flops = 2.0 * m * n * k
    nv, h = _nvml()
    op()
    torch.cuda.synchronize()
    # batches of calls long enough (~50 ms) that event overhead is nil
    t1 = _events_time(op, 5, warmup=2)
    per_batch = max(1, int(0.05 / max(t1, 1e-6)))
    samples = []
    t_start = time.perf_counter()
    while time.perf_counter() - t_start < seconds:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(per_batch):
            op()
        e1.record()
        e1.synchronize()
        dt = e0.elapsed_time(e1) / 1e3
        clk = nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM) if nv else None
        pw = nv.nvmlDeviceGetPowerUsage(h) / 1e3 if nv else None
        samples.append((time.perf_counter() - t_start, flops * per_batch / dt / 1e12, clk, pw))
    burst = [s for s in samples if s[0] <= 0.5] or samples[:3]
    tail = [s for s in samples if s[0] >= seconds * 2 / 3]

    def mean(xs):
        xs = [x for x in xs if x is not None]
        return sum(xs) / len(xs) if xs else None
    return {"shape": [m, n, k], "dtype": dtype, "seconds": seconds, "samples": len(samples),
            "burst_tflops": max(s[1] for s in burst), "sustained_tflops": mean([s[1] for s in tail]),
            "burst_clock_mhz": mean([s[2] for s in burst]), "sustained_clock_mhz": mean([s[2] for s in tail]),
            "sustained_power_w": mean([s[3] for s in tail]),
            "trace": [[round(s[0], 2), round(s[1], 1), s[2], s[3]] for s in samples[:: max(1, len(samples) // 60)]]}


# -- Megatron's 2022 GPT layer (one tensor-parallel rank, no communication) ----------------------
class _CopyToTP(torch.autograd.Function):
    """Megatron's copy_to_tensor_model_parallel_region: identity, all-reduce the gradient."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        import torch.distributed as dist
        dist.all_reduce(g)
        return g


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's reduce_from_tensor_model_parallel_region: all-reduce, identity gradient."""

    @staticmethod
    def forward(ctx, x):
        import torch.distributed as dist
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g


class MegatronLayer(torch.nn.Module):
    def __init__(self, h: int, heads: int, tp: int, dropout: float = 0.1, tp_comm: bool = False):
        super().__init__()
        self.tp_comm = tp_comm
        self.h, self.hp, self.ap, self.d = h, h // tp, heads // tp, h // heads
        self.ln1 = torch.nn.LayerNorm(h)
        self.qkv = torch.nn.Linear(h, 3 * self.hp)
        self.proj = torch.nn.Linear(self.hp, h)
        self.ln2 = torch.nn.LayerNorm(h)
        self.fc1 = torch.nn.Linear(h, 4 * h // tp)
        self.fc2 = torch.nn.Linear(4 * h // tp, h)
        self.p = dropout

    def _in(self, x):
        return _CopyToTP.apply(x) if self.tp_comm else x

    def _out(self, x):
        return _ReduceFromTP.apply(x) if self.tp_comm else x

    def attention(self, x):                       # x: [s, b, h]
        s, b, _ = x.shape
        qkv = self.qkv(self._in(x)).view(s, b, self.ap, 3 * self.d)
        q, k, v = qkv.split(self.d, dim=-1)
        q = q.reshape(s, b * self.ap, self.d).transpose(0, 1)          # [B, s, d]
        k = k.reshape(s, b * self.ap, self.d).permute(1, 2, 0)         # [B, d, s]
        v = v.reshape(s, b * self.ap, self.d).transpose(0, 1)          # [B, s, d]
        out = torch.empty(b * self.ap, s, s, device=x.device, dtype=x.dtype)
        scores = torch.baddbmm(out, q, k, beta=0.0, alpha=1.0 / math.sqrt(self.d))
        probs = F.dropout(torch.softmax(scores, dim=-1), self.p, True)
        ctx = torch.bmm(probs, v).transpose(0, 1).reshape(s, b, self.hp)
        return self._out(F.linear(ctx, self.proj.weight)), self.proj.bias

    def forward(self, x):
        a, bias = self.attention(self.ln1(x))
        x = x + F.dropout(a + bias, self.p, True)
        y = F.gelu(self.fc1(self._in(self.ln2(x))), approximate="tanh")
        y = self._out(F.linear(y, self.fc2.weight))
        return x + F.dropout(y + self.fc2.bias, self.p, True)


def layer(h: int, heads: int, tp: int, b: int, s: int, iters: int = 10) -> dict:
    dt = torch.float16
    mod = MegatronLayer(h, heads, tp).cuda().to(dt)
    x = torch.randn(s, b, h, device="cuda", dtype=dt, requires_grad=True)
    g = torch.randn(s, b, h, device="cuda", dtype=dt)

    def fwd():
        with torch.no_grad():
            mod(x)

    def fwd_bwd():
        mod(x).backward(g)
        x.grad = None
        for p in mod.parameters():
            p.grad = None
    t_f = _events_time(fwd, iters)
    t_fb = _events_time(fwd_bwd, iters)
    # forward kernels alone
    T, hp, ap, d = s * b, h // tp, heads // tp, h // heads
    X = torch.randn(T, h, device="cuda", dtype=dt)
    Wqkv, Wp = torch.randn(3 * hp, h, device="cuda", dtype=dt), torch.randn(h, hp, device="cuda", dtype=dt)
    W1, W2 = torch.randn(4 * h // tp, h, device="cuda", dtype=dt), torch.randn(h, 4 * h // tp, device="cuda", dtype=dt)
    C, Y = torch.randn(T, hp, device="cuda", dtype=dt), torch.randn(T, 4 * h // tp, device="cuda", dtype=dt)
    Q, K = torch.randn(b * ap, s, d, device="cuda", dtype=dt), torch.randn(b * ap, d, s, device="cuda", dtype=dt)
    V = torch.randn(b * ap, s, d, device="cuda", dtype=dt)
    S = torch.randn(b * ap, s, s, device="cuda", dtype=dt)
    out = torch.empty_like(S)
    ln = torch.nn.LayerNorm(h).cuda().to(dt)
    bias = torch.randn(4 * h // tp, device="cuda", dtype=dt)
    ops = {
        "qkv": lambda: F.linear(X, Wqkv), "proj": lambda: F.linear(C, Wp),
        "fc1": lambda: F.linear(X, W1), "fc2": lambda: F.linear(Y, W2),
        "fc1_dgrad": lambda: Y @ W1, "fc1_wgrad": lambda: Y.t() @ X,
        "qk_baddbmm": lambda: torch.baddbmm(out, Q, K, beta=0.0, alpha=0.1),
        "pv_bmm": lambda: torch.bmm(S, V),
        "softmax": lambda: torch.softmax(S, dim=-1),
        "dropout": lambda: F.dropout(S, 0.1, True),
        "layernorm": lambda: ln(X),
        "bias_gelu": lambda: F.gelu(Y + bias, approximate="tanh"),
    }
    with torch.no_grad():
        op_s = {name: _events_time(fn, iters) for name, fn in ops.items()}
    return {"h": h, "heads": heads, "tp": tp, "b": b, "s": s, "fwd_s": t_f, "fwd_bwd_s": t_fb, "ops_s": op_s}


def _issue_s(fn, iters: int) -> float:
    """Host seconds per call of ``fn`` issued back to back (5 warm-up calls, then ``iters``
    timed by the wall clock without synchronising: the GPU may lag)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    t = (time.perf_counter() - t0) / iters
    torch.cuda.synchronize()
    return t


def host(h: int, heads: int, tp: int, b: int, s: int, iters: int = 50, rounds: int = 5) -> dict:
    """Host issue time per layer when the host is the bottleneck: the wall clock over
    ``iters`` calls without synchronising (the GPU lags), median of ``rounds``; for the
    forward without autograd (Megatron's checkpointed first forward), the forward with
    autograd followed by the backward (the recomputed forward and the backward), and the
    kernels each launches (profiler)."""
    mod = MegatronLayer(h, heads, tp).cuda().half()
    x = torch.randn(s, b, h, device="cuda", dtype=torch.half, requires_grad=True)
    g = torch.randn(s, b, h, device="cuda", dtype=torch.half)

    def fwd():
        with torch.no_grad():
            mod(x)

    def fwd_bwd():
        mod(x).backward(g)

    def kernels(fn):
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        ks = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        return len(ks), sum(e.device_time for e in ks) / 1e6

    f_runs, fb_runs = [], []
    for _ in range(rounds):
        f_runs.append(_issue_s(fwd, iters))
        fb_runs.append(_issue_s(fwd_bwd, iters))
    f_runs.sort()
    fb_runs.sort()
    kf, busy_f = kernels(fwd)
    kfb, busy_fb = kernels(fwd_bwd)
    return {"h": h, "heads": heads, "tp": tp, "b": b, "s": s, "fwd_host_s": f_runs[rounds // 2],
            "fwd_bwd_host_s": fb_runs[rounds // 2], "fwd_host_runs": f_runs, "fwd_bwd_host_runs": fb_runs,
            "fwd_kernels": kf, "fwd_bwd_kernels": kfb, "fwd_busy_s": busy_f, "fwd_bwd_busy_s": busy_fb}


def host_checkpointed(h: int, heads: int, tp: int, b: int, s: int, iters: int = 50, rounds: int = 5) -> dict:
    """Host time of one layer and micro-batch under full recompute as Megatron runs it
    (``torch.utils.checkpoint``, reentrant: a forward without autograd, then in the backward
    the recomputed forward and the backward), without and with Megatron's four TP
    all-reduce calls (two autograd functions per block) on a one-rank NCCL group, and the
    host time of a bare ``all_reduce`` call."""
    import torch.distributed as dist
    from torch.utils.checkpoint import checkpoint
    out = {"h": h, "heads": heads, "tp": tp, "b": b, "s": s}
    for comm in (False, True):
        mod = MegatronLayer(h, heads, tp, tp_comm=comm).cuda().half()
        x = torch.randn(s, b, h, device="cuda", dtype=torch.half, requires_grad=True)
        g = torch.randn(s, b, h, device="cuda", dtype=torch.half)

        def step():
            checkpoint(mod, x, use_reentrant=True).backward(g)
        runs = sorted(_issue_s(step, iters) for _ in range(rounds))
        out["tp_calls_host_s" if comm else "host_s"] = runs[rounds // 2]
    t = torch.randn(1024, device="cuda")
    for _ in range(20):
        dist.all_reduce(t)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(500):
        dist.all_reduce(t)
    out["all_reduce_call_host_s"] = (time.perf_counter() - t0) / 500
    torch.cuda.synchronize()
    return out


LAYERS = [  # vTrain's multi-node shapes: (h, heads, tp, b) at s = 2048
    (3072, 32, 1, 8), (3072, 32, 2, 8), (3072, 32, 4, 8), (3072, 32, 8, 8), (3072, 32, 16, 8),
    (3072, 32, 1, 2), (3072, 32, 4, 2), (3072, 32, 8, 2),
    (6144, 48, 4, 2), (6144, 48, 8, 2),
    (8192, 64, 1, 3), (8192, 64, 2, 2), (8192, 64, 4, 2), (8192, 64, 8, 2),
    (12288, 96, 4, 2), (12288, 96, 8, 2),
]
HOSTS = [(1024, 16, 1, 1, 1024), (1024, 16, 8, 1, 1024), (2048, 16, 1, 1, 1024), (2048, 16, 4, 2, 1024),
         (3072, 32, 8, 2, 2048)]


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--parts", default="host,checkpointed,layer,sustained")
    args = ap.parse_args()
    parts = args.parts.split(",")
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "python": platform.python_version(), "cpu": _cpu_name()}
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = True
    if "host" in parts:
        res["host"] = [host(*c) for c in HOSTS]
        print(json.dumps(res["host"], indent=1), flush=True)
    if "checkpointed" in parts:
        import os

        import torch.distributed as dist
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29512")
        dist.init_process_group("nccl", rank=0, world_size=1)
        res["checkpointed"] = [host_checkpointed(*c) for c in HOSTS]
        print(json.dumps(res["checkpointed"], indent=1), flush=True)
        dist.destroy_process_group()
    if "layer" in parts:
        res["layer"] = []
        for h, heads, tp, b in LAYERS:
            r = layer(h, heads, tp, b, 2048)
            res["layer"].append(r)
            torch.cuda.empty_cache()
            print(json.dumps({k: v for k, v in r.items() if k != "ops_s"}), flush=True)
    if "sustained" in parts:
        res["sustained"] = []
        for shape, dtype in [((8192, 8192, 8192), "bf16"), ((8192, 8192, 8192), "fp8"),
                             ((2048, 2048, 13312), "bf16"), ((1024, 9216, 14336), "fp8")]:
            r = sustained(*shape, dtype, args.seconds)
            res["sustained"].append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "trace"}), flush=True)
            time.sleep(5)                                   # let the clock recover between runs
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
