"""The constants registry (simulator/validation/constants.py): names resolve, provenance
classes are valid, ``scaled()`` changes and restores values exactly, and the table in
docs/accuracy.md is the one the registry generates."""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path

import pytest

from simulator.validation import constants as C

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "accuracy.md"
BEGIN, END = "<!-- constants-registry:begin -->", "<!-- constants-registry:end -->"


def _numbers(value) -> list[float]:
    """The numeric leaves of a value, in a fixed order."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return []
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, dict):
        return [x for k in value for x in _numbers(value[k])]
    if isinstance(value, tuple):
        return [x for v in value for x in _numbers(v)]
    if hasattr(value, "__dataclass_fields__"):
        return [x for f in value.__dataclass_fields__ for x in _numbers(getattr(value, f))]
    return []


@pytest.mark.parametrize("entry", C.REGISTRY, ids=lambda e: e.name)
def test_every_name_resolves(entry):
    value = C.resolve(entry.name)
    assert value is not None
    assert _numbers(value), f"{entry.name} has no numeric value"


def test_registry_shape():
    names = [e.name for e in C.REGISTRY]
    assert len(names) == len(set(names))
    assert 25 <= len(names) <= 45
    for e in C.REGISTRY:
        assert e.provenance in C.PROVENANCES, e.name
        assert e.value and e.source and e.shapes, e.name
    assert {e.provenance for e in C.REGISTRY} == set(C.PROVENANCES)


def test_bound_defaults_exist():
    """Every bound dataclass default names a real field whose default equals the constant."""
    import importlib
    for e in C.REGISTRY:
        for path in e.bound:
            owner, _, field = path.rpartition(".")
            module, _, cls = owner.rpartition(".")
            fld = getattr(importlib.import_module(module), cls).__dataclass_fields__[field]
            assert fld.default in _numbers(C.resolve(e.name)), path


def test_scaled_scalar_changes_and_restores():
    from workloads.costs import compute
    original = compute.HBM_EFFICIENCY
    with C.scaled("workloads.costs.compute.HBM_EFFICIENCY", 1.1):
        assert compute.HBM_EFFICIENCY == pytest.approx(original * 1.1)
        assert compute.MemoryModel(1e12).efficiency == pytest.approx(original * 1.1)   # the bound default
    assert compute.HBM_EFFICIENCY is original
    assert compute.MemoryModel(1e12).efficiency is original


def test_scaled_scalar_reaches_modules_that_imported_it():
    import simulator.engine.fold  # noqa: F401
    from simulator.collectives import engine
    fold = sys.modules["simulator.engine.fold"]
    original = engine.TINY_CALL_BYTES
    with C.scaled("simulator.collectives.engine.TINY_CALL_BYTES", 2):
        assert engine.TINY_CALL_BYTES == fold.TINY_CALL_BYTES == 2 * original
    assert engine.TINY_CALL_BYTES is original and fold.TINY_CALL_BYTES is original


def test_scaled_dict_changes_in_place_and_restores():
    from workloads.costs import compute
    table = compute.FLASH_ATTENTION_EFFICIENCY
    before = copy.deepcopy(table)
    inner = table[("hopper", "bf16")]
    with C.scaled("workloads.costs.compute.FLASH_ATTENTION_EFFICIENCY", 0.9):
        assert compute.FLASH_ATTENTION_EFFICIENCY is table                # same object, changed in place
        assert table[("hopper", "bf16")] is inner
        assert inner["F"] == pytest.approx(before[("hopper", "bf16")]["F"] * 0.9)
    assert table == before and table[("hopper", "bf16")] is inner


def test_scaled_dict_of_tuples_and_named_tuples():
    from workloads.costs import compute, host as host_model
    host = compute.HOST_COSTS["eager"]
    with C.scaled("workloads.costs.host.HOST_COSTS", 2.0):
        assert compute.HOST_COSTS["eager"].kernel_s == pytest.approx(2 * host.kernel_s)   # compute re-exports it
        assert host_model.host_costs("eager").kernel_s == pytest.approx(2 * host.kernel_s)
        assert type(compute.HOST_COSTS["eager"]) is type(host)
    assert compute.HOST_COSTS["eager"] is host


def test_scaled_table_field_and_restores():
    from topologies import specs
    h100 = specs.GPU_SPECS["H100-SXM"]
    with C.scaled("topologies.specs.GPU_SPECS[*].peak_flops", 1.1):
        assert specs.GPU_SPECS["H100-SXM"].peak_flops["bf16"] == pytest.approx(989e12 * 1.1)
        assert specs.GPU_SPECS["H100-SXM"].hbm_bandwidth_bytes_per_s == h100.hbm_bandwidth_bytes_per_s
    assert specs.GPU_SPECS["H100-SXM"] is h100


def test_scaled_restores_after_an_exception():
    from simulator.engine import simulate
    before = dict(simulate.COMM_SLOWDOWN)
    with pytest.raises(RuntimeError), C.scaled("simulator.engine.simulate.COMM_SLOWDOWN", 1.5):
        raise RuntimeError("boom")
    assert simulate.COMM_SLOWDOWN == before


@pytest.mark.parametrize("entry", C.assumptions(), ids=lambda e: e.name)
def test_every_assumption_can_be_perturbed(entry):
    before = _numbers(C.resolve(entry.name))
    with entry.perturb(1.1):
        during = _numbers(C.resolve(entry.name))
        assert any(math.isclose(d, b * 1.1) and b != 0 for d, b in zip(during, before))
    assert _numbers(C.resolve(entry.name)) == before


def test_a_perturbed_assumption_reaches_the_compute_model():
    from workloads.costs.compute import RooflineComputeModel
    from workloads.costs.flops import ComputeOp
    op = ComputeOp("mlp_act", "F", "elementwise", 0.0, 0, 0, 0, mem_bytes=1e9)
    base = RooflineComputeModel("H100").op_cost(op).memory_s
    with C.scaled("workloads.costs.compute.HBM_EFFICIENCY", 0.5):
        assert RooflineComputeModel("H100").op_cost(op).memory_s == pytest.approx(2 * base)
    gemm = ComputeOp("fc1", "W", "gemm", 2.0 * 4096 * 4096 * 256, 4096, 4096, 256)
    t = RooflineComputeModel("H100").op_cost(gemm).compute_s
    with C.scaled("workloads.costs.compute.GEMM_K_OVERHEAD", 2.0):
        assert RooflineComputeModel("H100").op_cost(gemm).compute_s > t


def test_docs_table_matches_registry():
    text = DOC.read_text()
    assert BEGIN in text and END in text, f"{DOC.name} lacks the registry markers"
    table = text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"
    assert table == C.registry_markdown(), "regenerate the table with registry_markdown()"
