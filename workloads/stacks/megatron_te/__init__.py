"""The default kernel stack: Megatron-Core with Transformer Engine (Megatron-LM ``core_r0.x``,
Transformer Engine 2.x, Megatron-Bridge recipes), as modelled so far.

* :mod:`.layers` -- each block kind's lowering with its TP, CP and EP collectives;
* :mod:`.moe`, :mod:`.context_parallel`, :mod:`.data_parallel`, :mod:`.pipeline` -- the
  MoE dispatcher, the CP variants, gradient buckets and parameter gathers, and one stage's
  program from the schedule;
* :mod:`.issue` -- how each op is issued relative to compute (the overlap rules);
* :mod:`.context` -- the build context, the op emitter, a layer's compute segments.
"""

from ...blocks.fusion import MEGATRON_TE
from ..base import KernelStack
from .context import _segment_key, kernel_rows
from .issue import assign_issue_modes
from .layers import _LOWERING
from .moe import check_layout
from .pipeline import _stage_program

STACK = KernelStack(
    name="megatron_core",
    summary="Megatron-Core with Transformer Engine (fused kernels, TE's overlaps, Megatron's schedules)",
    sources="NVIDIA/Megatron-LM megatron/core (2025-2026), NVIDIA/TransformerEngine 2.x, NVIDIA-NeMo/Megatron-Bridge",
    fusion=MEGATRON_TE,
    lowering=_LOWERING,
    stage_program=_stage_program,
    assign_issue_modes=assign_issue_modes,
    check_layout=check_layout,
    kernel_rows=kernel_rows,
    segment_key=_segment_key,
)
