"""Steady-state periodicity of programs (workloads.periodicity)."""

from topologies import get_gpu_spec
from workloads import ParallelConfig, load_model
from workloads.periodicity import periodicity, shifted
from workloads.program import build_program

H100 = get_gpu_spec("H100-SXM")


def prog(**kw):
    base = dict(tp=2, pp=2, dp=2, micro_batch_size=1, global_batch_size=32, seq_len=256)
    base.update(kw)
    return build_program(load_model("tiny-dense"), ParallelConfig(**base), H100)


def _check_window(ops, c):
    # inside the window, op i + L is op i moved c.microbatches on; sequence numbers move by a
    # constant per group kind (the collectives of that kind in one period)
    seq_step: dict = {}
    for i in range(c.first, c.last - c.ops):
        a, b = ops[i], ops[i + c.ops]
        assert shifted(a, c.microbatches)._replace(seq=b.seq) == b, i
        if a.seq >= 0:
            assert seq_step.setdefault(a.group, b.seq - a.seq) == b.seq - a.seq


def test_1f1b_repeats_every_microbatch():
    p = prog(schedule="1f1b")
    per = periodicity(p)
    assert per.microbatches == 1
    for cls, c in zip(p.classes, per.classes):
        assert c.ops > 0 and c.periods >= 10          # 16 micro-batches per pipeline
        _check_window(cls.ops, c)
    assert 0 < per.skippable_ops < per.total_ops


def test_interleaved_repeats_every_round_of_pp_microbatches():
    p = prog(schedule="interleaved_1f1b", vpp=2)
    per = periodicity(p)
    assert per.microbatches == 2                      # pp = 2: one round through both chunks
    for cls, c in zip(p.classes, per.classes):
        _check_window(cls.ops, c)
    assert per.skippable_periods >= 3


def test_shift_moves_tags_and_leaves_step_ops():
    p = prog(schedule="1f1b")
    ops = p.classes[0].ops
    send = next(o for o in ops if o.tag is not None and len(o.tag) == 5)
    moved = shifted(send, 3)
    assert moved.microbatch == send.microbatch + 3 and moved.tag[3] == send.tag[3] + 3
    step_op = next(o for o in ops if o.microbatch < 0)
    assert shifted(step_op, 3) is step_op


def test_no_period_without_a_steady_phase():
    # GPipe runs every forward, then every backward (in reverse micro-batch order, which a
    # shift to later micro-batches does not follow): no steady period is claimed
    per = periodicity(prog(schedule="gpipe", global_batch_size=8))
    assert per.skippable_periods == 0 and per.skippable_ops == 0
