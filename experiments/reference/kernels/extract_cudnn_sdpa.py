"""Write ``cudnn_sdpa.csv`` from NVIDIA/cudnn-frontend's SDPA training benchmark CSVs.

Run: ``python experiments/reference/kernels/extract_cudnn_sdpa.py GIT_DIR`` where GIT_DIR is a
clone of https://github.com/NVIDIA/cudnn-frontend (read with ``git show``, so no checkout is
needed).  Two snapshots of ``benchmark/sdpa_benchmark_training/`` are read:

* commit 0258951d (2025-12-01), ``artifacts/sdpa_{bf16,fp8}_benchmark_results_NVIDIA_{B200,GB300}.csv``:
  Llama-3.1-405B-like layer (128 query / 8 KV heads, head dim 128, causal, batch 1), cuDNN
  9.13.1, PyTorch 2.9.0 (NGC 25.09).  The ``fp8`` files hold cuDNN frontend's own graphs in
  BF16 and FP8 (kernel ``cudnn``); the ``bf16`` files compare PyTorch SDPA backends: its
  cuDNN backend (``pytorch_cudnn``), its FlashAttention backend (``pytorch_flash``) and the
  FlashAttention-2 package (``flash_attention_2``).
* commit 3929da2e (2026), ``results/{llama3.1,dsv3,gpt_oss,qwen35}/{gb200,gb300}/*.csv`` (cuDNN
  9.22, frontend 1.21.1) and ``results/h200_919_only_cudnn/*.csv`` (cuDNN 9.19, H200): model-shaped
  layers, kernel ``cudnn``; the non-deterministic backward only.

Every value is a number in those CSVs (nothing read off a chart).  TFLOP/s are recomputed from
the time with the benchmark's own FLOP count (``benchmark_single_sdpa.py`` ``flops``):
``2 x batch x heads x unmasked elements x (d_qk + d_v)`` forward, ``(3 d_qk + 2 d_v)``
backward; unmasked = S (S + 1) / 2 causal, W (W + 1) / 2 + (S - W) W with a window W.
"""
import csv
import io
import subprocess
import sys
from pathlib import Path

OLD = "0258951d4d512f4714eb1574496f4d57669b1b93"
NEW = "3929da2ef4c1dba1bb8acb68727b9134f26f40c0"
BASE = "benchmark/sdpa_benchmark_training/"
OUT = Path(__file__).with_name("cudnn_sdpa.csv")
COLS = ("gpu", "kernel", "dtype", "mask", "batch", "heads", "kv_heads", "d_qk", "d_v", "window", "seq_len", "phase",
        "time_ms", "tflops", "cudnn", "source")
DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "fp8": "fp8", "mxfp8": "mxfp8"}
OLD_BACKENDS = {"pyt_cudnn": "pytorch_cudnn", "pyt_flash_attention": "pytorch_flash", "flash_attention": "flash_attention_2"}


def unmasked(s: int, mask: str, window: int | None) -> int:
    if mask == "full":
        return s * s
    if window and s > window:
        return window * (window + 1) // 2 + (s - window) * window
    return s * (s + 1) // 2


def tflops(r: dict, phase: str) -> float:
    per = (r["d_qk"] + r["d_v"]) if phase == "F" else (3 * r["d_qk"] + 2 * r["d_v"])
    f = 2 * r["batch"] * r["heads"] * unmasked(r["seq_len"], r["mask"], r["window"]) * per
    return f / (r["time_ms"] * 1e-3) / 1e12


def show(git: str, rev: str, path: str) -> list[dict]:
    text = subprocess.run(["git", "--git-dir", git, "show", f"{rev}:{path}"], check=True, capture_output=True,
                          text=True).stdout
    return list(csv.DictReader(io.StringIO(text)))


def old_rows(git: str):
    for gpu in ("B200", "GB300"):
        src = f"{BASE}artifacts/sdpa_fp8_benchmark_results_NVIDIA_{gpu}.csv@{OLD[:8]}"
        for r in show(git, OLD, src.split("@")[0]):
            yield from _old(r, gpu, "cudnn", DTYPES[r["precision"]], src)
        src = f"{BASE}artifacts/sdpa_bf16_benchmark_results_NVIDIA_{gpu}.csv@{OLD[:8]}"
        for r in show(git, OLD, src.split("@")[0]):
            if r["backend"] in OLD_BACKENDS:
                yield from _old(r, gpu, OLD_BACKENDS[r["backend"]], "bf16", src)


def _old(r, gpu, kernel, dtype, src):
    base = dict(gpu=gpu, kernel=kernel, dtype=dtype, mask="causal" if r["is_causal"] == "True" else "full",
                batch=int(r["batch_size"]), heads=int(r["num_q_heads"]), kv_heads=int(r["num_kv_heads"]),
                d_qk=int(r["head_dim"]), d_v=int(r["head_dim"]), window=None, seq_len=int(r["q_seqlen"]),
                cudnn="9.13.1", source=src)
    for phase, col in (("F", "forward_time"), ("B", "backward_time")):
        t = float(r[col])
        if t > 0 and t != float("inf"):
            yield dict(base, phase=phase, time_ms=t)


def new_rows(git: str):
    listing = subprocess.run(["git", "--git-dir", git, "ls-tree", "-r", "--name-only", NEW, BASE + "results"],
                             check=True, capture_output=True, text=True).stdout.split()
    for path in sorted(p for p in listing if p.endswith(".csv")):
        for r in show(git, NEW, path):
            if r["success"] != "True" or r["deterministic_bwd"] != "False" or r["backend"] != "cudnn":
                continue
            if r["q_seqlen"] != r["kv_seqlen"] or r["data_type"] not in DTYPES:
                continue
            gpu = r["gpu_name"].replace("NVIDIA ", "")
            base = dict(gpu=gpu, kernel="cudnn", dtype=DTYPES[r["data_type"]],
                        mask={"top_left": "causal", "no_mask": "full"}[r["attn_mask"]], batch=int(r["batch_size"]),
                        heads=int(r["num_q_heads"]), kv_heads=int(r["num_kv_heads"]), d_qk=int(r["head_dim_qk"]),
                        d_v=int(r["head_dim_vo"]), window=int(r["sliding_window_size"]) if r["sliding_window_size"] else None,
                        seq_len=int(r["q_seqlen"]), cudnn=str(int(float(r["cudnn_backend_version"]))),
                        source=f"{path}@{NEW[:8]}")
            if r["profile_pass"] == "both":
                for phase, col in (("F", "fwd_time_ms"), ("B", "bwd_time_ms")):
                    yield dict(base, phase=phase, time_ms=float(r[col]))
            else:
                yield dict(base, phase={"fwd": "F", "bwd": "B"}[r["profile_pass"]], time_ms=float(r["time_ms"]))


def main(git: str) -> None:
    rows = list(old_rows(git)) + list(new_rows(git))
    with OUT.open("w", newline="") as f:
        w = csv.DictWriter(f, COLS, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow(dict(r, window=r["window"] or "", tflops=f"{tflops(r, r['phase']):.1f}"))
    print(f"{len(rows)} rows -> {OUT}")


if __name__ == "__main__":
    main(sys.argv[1])
