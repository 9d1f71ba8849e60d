"""Print the measured kernel tables against the compute model's own sub-models.

* cuDNN fused attention (``experiments/reference/kernels/cudnn_sdpa.csv``) against the
  FlashAttention-figure model (``RooflineComputeModel(kernel_tables=False)``), forward and
  backward TFLOP/s in the benchmark's FLOP count, at the benchmark's clock (no sustained
  fraction) on the measured GPUs;
* DeepGEMM's FP8 GEMMs on H800 (``deepgemm_h800_readme.csv``) against the GEMM model
  (``GemmModel`` at the FP8 MAMF), which the Megatron stack uses for expert GEMMs.

Run: ``python experiments/kernel_tables_check.py``.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from workloads.blocks.kernels import AttentionShape  # noqa: E402
from workloads.costs.compute import RooflineComputeModel  # noqa: E402
from workloads.costs.kernel_tables import KERNEL_TABLE_DIR, attention_table_flops, default_attention_tables  # noqa: E402

GPUS = {"GB200": "GB200", "B200": "B200", "H200": "H200-SXM"}
SHAPES = (("causal", None, 128, 128), ("causal", None, 192, 128), ("causal", 128, 64, 64))


def attention_rows():
    tables = default_attention_tables()
    unsustained = {"gemm": 1.0, "attention": 1.0}
    for table_gpu, gpu in GPUS.items():
        model = RooflineComputeModel(gpu, kernel_tables=False, sustained=unsustained)
        for key in SHAPES:
            for seq in (2048, 8192, 32768):
                out = []
                for phase in "FB":
                    t = tables.tables.get(("cudnn", table_gpu, "bf16", key, phase))
                    rate = t.rate_at(seq) if t is not None else None
                    if rate is None:
                        break
                    mask = "window" if key[1] else "causal"
                    shape = AttentionShape(2, 64, 8, seq, seq, key[2], key[3], mask, key[1], 1, "flash")
                    op = _attention_op(shape, phase, model)
                    out.append((rate, attention_table_flops(shape, phase) / model.op_cost(op).compute_s / 1e12))
                if len(out) == 2:
                    yield table_gpu, key, seq, out


def _attention_op(shape, phase, model):
    """The simulator's own attention op for ``shape`` (its FLOP count and block-rounded mask)."""
    from workloads.blocks.kernels import Shard, attention
    sh = Shard(shape.batch, shape.q_len, 1, 1, False, shape.batch * shape.q_len, shape.batch * shape.q_len)
    f, b = attention("core_attn", 0, sh, shape.heads, shape.kv_heads, shape.d_qk, shape.d_v, True, 128,
                     shape.window, "flash")
    return f if phase == "F" else b


def gemm_rows():
    model = RooflineComputeModel("H800-SXM", "fp8_blockwise", kernel_tables=False, sustained={"gemm": 1.0,
                                                                                             "attention": 1.0})
    with (KERNEL_TABLE_DIR / "deepgemm_h800_readme.csv").open() as f:
        for r in csv.DictReader(f):
            g, m, n, k = (int(r[c]) for c in ("groups", "m_per_group", "n", "k"))
            eff = model.gemm.efficiency("fp8", [(m, n, k)] * g)
            yield r["layout"], g, m, n, k, float(r["tflops"]), eff * model.gemm.peak_flops["fp8"] / 1e12


def main() -> None:
    print("cuDNN fused attention (BF16), measured vs FlashAttention-figure model, TFLOP/s at boost clock")
    print(f"{'GPU':6} {'mask/window/d_qk/d_v':24} {'seq':>6}  {'F meas':>7} {'F model':>7}  {'B meas':>7} {'B model':>7}")
    for gpu, key, seq, ((fm, fp), (bm, bp)) in attention_rows():
        print(f"{gpu:6} {str(key):24} {seq:6d}  {fm:7.0f} {fp:7.0f}  {bm:7.0f} {bp:7.0f}")
    print()
    print("DeepGEMM FP8 on H800 (README), measured vs GEMM model at MAMF, TFLOP/s")
    print(f"{'layout':10} {'groups':>6} {'M/group':>7} {'N':>6} {'K':>6}  {'meas':>6} {'model':>6}")
    for layout, g, m, n, k, meas, mod in gemm_rows():
        print(f"{layout:10} {g:6d} {m:7d} {n:6d} {k:6d}  {meas:6.0f} {mod:6.0f}")


if __name__ == "__main__":
    main()
