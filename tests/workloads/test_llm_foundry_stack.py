"""llm-foundry's stacks (workloads/stacks/llm_foundry/): the attention kernel each run's
``attn_impl`` names, and Composer's FSDP1 rules as the default stack's program expresses them
(closed-form checks on the program's collectives)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from topologies import get_gpu_spec
from workloads import Issue, ParallelConfig, build_program, load_model
from workloads.ops import is_fsdp_gather, is_grad_bucket
from workloads.stacks import get_stack
from workloads.stacks.megatron_te import STACK as MC

_H100 = get_gpu_spec("H100")


def _program(framework="llm_foundry", grad_reduce_dtype=None, zero_stage=3):
    m = load_model("tiny-dense")
    par = ParallelConfig(tp=1, pp=1, dp=8, zero_stage=zero_stage, distributed_optimizer=True,
                         micro_batch_size=1, global_batch_size=16)
    return m, build_program(m, par, _H100, framework=framework, grad_reduce_dtype=grad_reduce_dtype)


def _bytes(prog, pred):
    return sum(o.size_bytes for o in prog.classes[0].ops if pred(o))


def test_attn_impl_flash_is_the_default_stack_with_flashattention2():
    """``attn_impl: flash`` (flash-attn 2.x): the default stack's kernels with the
    FlashAttention-2 backend; the Triton stack differs from it in the attention backend only."""
    flash, triton = get_stack("llm_foundry_flash"), get_stack("llm_foundry")
    assert flash.fusion.attention_backend == "flash_attention_2"
    assert replace(flash.fusion, attention_backend="te_fused") == MC.fusion
    assert replace(triton.fusion, attention_backend="flash_attention_2") == flash.fusion
    for f in ("lowering", "stage_program", "assign_issue_modes", "check_layout", "kernel_rows", "segment_key"):
        assert getattr(flash, f) is getattr(MC, f) is getattr(triton, f)


def test_flash_runs_attention_faster_than_the_triton_proxy_and_nothing_else():
    """Same ops in the same order; only the core-attention compute ops are shorter."""
    _, tri = _program("llm_foundry")
    _, fa2 = _program("llm_foundry_flash")
    a, b = tri.classes[0].ops, fa2.classes[0].ops
    assert [(o.name, o.layer, o.phase) for o in a] == [(o.name, o.layer, o.phase) for o in b]
    changed = {o.name for o, p in zip(a, b) if o.duration_s != p.duration_s}
    assert changed and all("attn" in str(n).lower() for n in changed)
    assert all(p.duration_s <= o.duration_s for o, p in zip(a, b))


def test_composer_pure_reduces_gradients_in_half_the_bytes_of_default():
    """Composer DEFAULT reduces FP32 gradients, PURE BF16: the reduce-scatters carry
    4 vs 2 bytes per parameter, so PURE's bytes are exactly half; the parameter gathers carry
    BF16 (2 bytes per parameter) in both modes."""
    m, default = _program(grad_reduce_dtype="fp32")
    _, pure = _program(grad_reduce_dtype="bf16")
    g_default, g_pure = _bytes(default, is_grad_bucket), _bytes(pure, is_grad_bucket)
    assert g_default > 0 and g_pure == pytest.approx(0.5 * g_default, rel=1e-12)
    ag_default, ag_pure = _bytes(default, is_fsdp_gather), _bytes(pure, is_fsdp_gather)
    assert ag_default == ag_pure > 0


def test_fsdp_gather_bytes_are_two_bytes_per_layer_parameter_each_pass():
    """A FULL_SHARD layer is gathered before its forward and again before its backward, in
    BF16 under both Composer modes clustersim runs: each gather's size is the gathered layer,
    2 B x its parameters (at TP 1), and an FP32 gather (Composer FULL, not run) would be twice it."""
    m, prog = _program()
    layer0 = [o for o in prog.classes[0].ops if is_fsdp_gather(o) and o.layer == 0 and o.microbatch == 0]
    assert len(layer0) == 2
    assert [o.size_bytes for o in layer0] == [pytest.approx(2.0 * m.layer_num_params(0), rel=1e-9)] * 2


def test_fsdp1_gathers_are_prefetched_one_layer_ahead():
    """FSDP1 (BACKWARD_PRE or BACKWARD_POST, with or without limit_all_gathers' two in
    flight) overlaps the next unit's gather with the current unit's compute: every per-layer
    gather of the llm-foundry program is issued in the ``prefetch`` mode."""
    _, prog = _program()
    gathers = [o for o in prog.classes[0].ops if is_fsdp_gather(o)]
    assert gathers and {o.issue for o in gathers} == {Issue.PREFETCH}
