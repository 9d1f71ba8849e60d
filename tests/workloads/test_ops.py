"""The op taxonomy: every field the simulator dispatches on is an enumeration member."""

from __future__ import annotations

import pytest

from topologies import build_cluster
from workloads import ParallelConfig, build_program, load_model
from workloads.ops import (FSDP_GATHERS, GRAD_BUCKETS, PARAM_GATHERS, Coll, Group, Op, OpKind, OpName, Phase, Stream,
                           is_ep_combine, is_fsdp_gather, is_grad_bucket, is_grad_norm, is_p2p, is_param_gather,
                           is_step_sync)

LAYOUTS = [
    ("tiny-dense", {"tp": 2, "pp": 2, "dp": 2, "sequence_parallel": True}),
    ("tiny-dense", {"tp": 2, "pp": 2, "dp": 2, "sequence_parallel": False, "scatter_gather_tensors_in_pipeline": True}),
    ("tiny-dense", {"tp": 1, "pp": 2, "dp": 2, "cp": 2, "zero_stage": 3}),
    ("tiny-dense", {"pp": 2, "dp": 4, "vpp": 2, "schedule": "interleaved_1f1b", "recompute": "full"}),
    ("tiny-dense", {"pp": 2, "dp": 4, "schedule": "zb_h1"}),
    ("tiny-moe", {"tp": 2, "pp": 2, "dp": 2, "ep": 2, "etp": 2, "schedule": "dualpipe"}),
]


def _program(model, par):
    m = load_model({"preset": model, "num_layers": 8, "num_kv_heads": 8,
                    **({"moe": {"num_experts": 8}} if model == "tiny-moe" else {})})
    cluster = build_cluster({"preset": "dgx-h100", "num_nodes": 1})
    p = ParallelConfig.from_dict({"micro_batch_size": 1, "global_batch_size": 16, "seq_len": 1024, **par})
    return build_program(m, p.resolve(cluster.num_gpus), cluster.gpu, num_gpus=cluster.num_gpus)


@pytest.mark.parametrize("model, par", LAYOUTS)
def test_every_field_of_every_op_is_a_taxonomy_member(model, par):
    prog = _program(model, par)
    names = set()
    for cls in prog.classes:
        for op in cls.ops:
            assert isinstance(op, Op)
            assert type(op.kind) is OpKind and type(op.stream) is Stream and type(op.name) is OpName
            assert type(op.phase) is Phase and type(op.coll) is Coll and type(op.group) is Group
            assert (op.kind == OpKind.COLLECTIVE) == (op.group != Group.NONE)
            assert (op.kind in (OpKind.COMPUTE, OpKind.HOST_SYNC)) == (op.stream == Stream.COMPUTE) == \
                (op.coll == Coll.NONE)
            assert op.kind != OpKind.HOST_SYNC or (op.host_s == 0.0 and op.flops == 0.0 and op.duration_s >= 0.0)
            assert is_p2p(op) == (op.stream == Stream.PP) == (op.coll == Coll.SEND_RECV)
            names.add(op.name)
    assert names & GRAD_BUCKETS and OpName.GRAD_NORM in names


def test_the_roles_are_the_ops_the_engine_treats_apart():
    prog = _program("tiny-moe", {"tp": 1, "pp": 2, "dp": -1, "ep": 2, "zero_stage": 1})
    ops = [op for cls in prog.classes for op in cls.ops]
    assert {op.name for op in ops if is_grad_bucket(op)} == set(GRAD_BUCKETS)
    assert {op.name for op in ops if is_param_gather(op)} == set(PARAM_GATHERS)
    assert {op.name for op in ops if is_ep_combine(op)} == {OpName.EP_COMBINE, OpName.EP_COMBINE_BWD}
    assert all(op.stream == Stream.DP and op.kind == OpKind.COLLECTIVE for op in ops if is_grad_bucket(op))
    assert [op.name for op in ops if is_grad_norm(op)] == [OpName.GRAD_NORM] * len(prog.classes)
    assert {op.group for op in ops if is_step_sync(op)} == {Group.DP_CP, Group.EDP, Group.WORLD}
    z3 = _program("tiny-dense", {"pp": 2, "dp": 4, "zero_stage": 3})
    assert {op.name for c in z3.classes for op in c.ops if is_fsdp_gather(op)} == set(FSDP_GATHERS)


def test_members_are_their_strings():
    """Timelines, CSVs and JSON hold plain strings; code may compare either way."""
    assert OpName.GRAD_DENSE == "grad_dense" and f"{Stream.DP}" == "dp" and str(Phase.R) == "R"
    assert {"tp": 1}[Group.TP] == 1 and hash(Coll.ALL_TO_ALL) == hash("all_to_all")
    assert len({m.value for m in OpName}) == len(OpName)


def test_nothing_dispatches_on_op_names():
    """What an op is for is asked through the predicates of workloads.ops, never by
    spelling out (part of) its name: a renamed or new op cannot silently change roles."""
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    pattern = re.compile(r"""\b(op|o|nxt|prev|a|b)\.name\b\s*(\.startswith|\.endswith|==|!=|\.split)"""
                         r"""|['"]\s+in\s+(op|o|nxt)\.name\b""")
    hits = [f"{p.relative_to(root)}:{i}: {line.strip()}"
            for p in [*(root / "simulator").rglob("*.py"), root / "workloads" / "program.py"]
            for i, line in enumerate(p.read_text().splitlines(), 1)
            if pattern.search(line) and "kernel-level" not in line]
    assert hits == []


def test_ep_all_to_alls_move_data_by_direction():
    """Skewed dispatch: every source sends 3 tokens to EP rank 1 and 1 to rank 0.  The
    combine returns outputs rank 1 -> sources (transpose); the backward of the combine sends
    the output gradients to the experts that made the outputs (the dispatch's way); the
    backward of the dispatch returns input gradients to the sources (transpose)."""
    import numpy as np
    from workloads.ops import ep_a2a_matrix
    d = np.array([[1.0, 3.0], [1.0, 3.0]])
    assert ep_a2a_matrix(OpName.EP_DISPATCH, d).tolist() == d.tolist()
    assert ep_a2a_matrix(OpName.EP_COMBINE_BWD, d).tolist() == d.tolist()
    assert ep_a2a_matrix(OpName.EP_COMBINE, d).tolist() == d.T.tolist()
    assert ep_a2a_matrix(OpName.EP_DISPATCH_BWD, d).tolist() == d.T.tolist()
