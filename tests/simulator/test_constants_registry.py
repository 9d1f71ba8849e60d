"""The constants registry (simulator/validation/constants.py): names resolve, provenance
classes are valid, ``scaled()`` reaches the models through the run's Constants object and
changes no module global, a scaled run moves and the next unscaled one is bit-identical, and
the table in docs/accuracy.md is the one the registry generates."""

from __future__ import annotations

import copy
import math
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


def _module_state():
    """Every registered constant's module attribute: the object, and a deep copy of its value."""
    import importlib
    from topologies.constants import split_name
    out = {}
    for e in C.REGISTRY:
        module, attr, _ = split_name(e.name)
        obj = getattr(importlib.import_module(module), attr)
        out[e.name] = (obj, copy.deepcopy(obj))
    return out


def _dataclass_defaults():
    """The defaults of the dataclass fields that used to copy a constant."""
    from topologies.cluster import ClusterSpec
    from workloads.costs import compute
    from workloads.memory_accounting import MemoryOptions
    out = {}
    for cls in (compute.GemmModel, compute.AttentionModel, compute.MemoryModel, ClusterSpec, MemoryOptions):
        init = cls.__init__
        out[cls.__name__] = (init.__defaults__, copy.copy(init.__kwdefaults__),
                             {f: v.default for f, v in cls.__dataclass_fields__.items()})
    return out


@pytest.mark.parametrize("entry", C.REGISTRY, ids=lambda e: e.name)
def test_scaled_changes_no_module_global(entry):
    """scaled() installs a scaled Constants object: no module attribute, table entry or
    dataclass default changes (or is replaced) inside the block, and the value the run reads
    is the scaled one."""
    from topologies.constants import DEFAULT, active
    before, defaults, ref = _module_state(), _dataclass_defaults(), _numbers(C.resolve(entry.name))
    with C.scaled(entry.name, 1.25) as c:
        assert active() is c and c.overrides.keys() == {entry.name}
        assert _numbers(C.resolve(entry.name)) != ref
        for name, (obj, value) in _module_state().items():
            assert obj is before[name][0] and obj == value == before[name][1], name
        assert _dataclass_defaults() == defaults
    assert active() is DEFAULT
    assert _numbers(C.resolve(entry.name)) == ref


def test_scaled_reaches_the_cost_models_not_the_module():
    from workloads.costs import compute
    original = compute.HBM_EFFICIENCY
    with C.scaled("workloads.costs.compute.HBM_EFFICIENCY", 1.1):
        assert compute.HBM_EFFICIENCY is original
        assert compute.RooflineComputeModel("H100").memory.efficiency == pytest.approx(original * 1.1)
        kept = compute.RooflineComputeModel("H100")
    assert kept.memory.efficiency == pytest.approx(original * 1.1)      # built inside: keeps its constants
    assert compute.RooflineComputeModel("H100").memory.efficiency is original


def test_scaled_reaches_the_collective_engine():
    import simpy
    from simulator.collectives import engine
    from topologies import build_cluster
    cluster = build_cluster({"preset": "dgx-h100", "num_nodes": 2})
    original = engine.TINY_CALL_BYTES
    with C.scaled("simulator.collectives.engine.TINY_CALL_BYTES", 2):
        assert engine.CollectiveEngine(simpy.Environment(), cluster).tiny_call_bytes == 2 * original
        assert engine.TINY_CALL_BYTES is original
    with C.scaled("simulator.collectives.nccl.BASE_LAT_US", 2):
        t = engine.CollectiveEngine(simpy.Environment(), cluster).nccl
        assert t.base_lat_us["ring"] == tuple(2 * x for x in engine.nccl.BASE_LAT_US["ring"])
    assert engine.CollectiveEngine(simpy.Environment(), cluster).tiny_call_bytes is original


def test_scaled_dict_is_a_new_table():
    from workloads.costs import compute
    table = compute.FLASH_ATTENTION_EFFICIENCY
    before = copy.deepcopy(table)
    with C.scaled("workloads.costs.compute.FLASH_ATTENTION_EFFICIENCY", 0.9):
        att = compute.AttentionModel.for_gpu(compute.get_gpu_spec("H100"))
        assert att.table[("hopper", "bf16")]["F"] == pytest.approx(before[("hopper", "bf16")]["F"] * 0.9)
    assert compute.FLASH_ATTENTION_EFFICIENCY is table and table == before


def test_scaled_dict_of_named_tuples():
    from workloads.costs import compute, host as host_model
    host = compute.HOST_COSTS["eager"]
    with C.scaled("workloads.costs.host.HOST_COSTS", 2.0):
        got = host_model.host_costs("eager")
        assert got.kernel_s == pytest.approx(2 * host.kernel_s) and type(got) is type(host)
        assert compute.HOST_COSTS["eager"] is host
    assert host_model.host_costs("eager") is host


def test_scaled_table_field():
    from topologies import specs
    h100 = specs.GPU_SPECS["H100-SXM"]
    with C.scaled("topologies.specs.GPU_SPECS[*].peak_flops", 1.1):
        got = specs.get_gpu_spec("H100")
        assert got.peak_flops["bf16"] == pytest.approx(989e12 * 1.1)
        assert got.hbm_bandwidth_bytes_per_s == h100.hbm_bandwidth_bytes_per_s
        assert specs.GPU_SPECS["H100-SXM"] is h100 and h100.peak_flops["bf16"] == 989e12
    assert specs.get_gpu_spec("H100") is h100


def test_scaled_restores_after_an_exception():
    from topologies.constants import DEFAULT, active
    with pytest.raises(RuntimeError), C.scaled("simulator.engine.simulate.COMM_SLOWDOWN", 1.5):
        raise RuntimeError("boom")
    assert active() is DEFAULT


def test_scaled_rejects_an_unregistered_name():
    with pytest.raises(KeyError, match="not a registered constant"):
        with C.scaled("workloads.costs.compute._E_MAX_8", 2.0):
            pass


def test_constants_object_is_immutable_and_picklable():
    import pickle
    from topologies.constants import DEFAULT, Constants
    c = DEFAULT.scaled("workloads.costs.compute.HBM_EFFICIENCY", 0.5).replace(
        "simulator.engine.simulate.COMM_SLOWDOWN", {"hopper": 1.0, "ampere": 1.0, "blackwell": 1.0})
    assert DEFAULT.is_default and not c.is_default
    assert pickle.loads(pickle.dumps(c)) == c
    with pytest.raises(AttributeError):
        c._overrides = {}
    with pytest.raises(ValueError, match="names no module attribute"):
        Constants({"workloads.costs.compute.NO_SUCH_THING": 1})


def test_a_scaled_run_differs_and_the_next_unscaled_run_is_bit_identical():
    """On a golden case: scaled constants move the ops; an unscaled run afterwards reproduces
    the run before it digest for digest; run(constants=...) is the same as running inside
    scaled()."""
    from simulator.engine import run
    from tests.golden.cases import cases, compute, metrics_digest, ops_digest
    from topologies.constants import DEFAULT
    name = "cp2"                    # overlaps communication with compute: COMM_SLOWDOWN shows
    before = compute(name)
    for const in ("workloads.costs.compute.HBM_EFFICIENCY", "simulator.engine.simulate.COMM_SLOWDOWN",
                  "simulator.collectives.nccl.BASE_LAT_US", "workloads.blocks.kernels.ACT_BYTES"):
        with C.scaled(const, 1.5):
            moved = compute(name)
        assert moved["ops"] != before["ops"], const
        assert compute(name) == before, const
    sc, kw = cases()[name]
    explicit = run(copy.deepcopy(sc), constants=DEFAULT.scaled("workloads.costs.compute.HBM_EFFICIENCY", 1.5), **kw)
    with C.scaled("workloads.costs.compute.HBM_EFFICIENCY", 1.5):
        moved = compute(name)
    assert (ops_digest(explicit), metrics_digest(explicit)) == (moved["ops"], moved["metrics"])
    assert compute(name) == before


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


def test_constants_the_golden_cases_do_not_exercise_still_reach_their_model():
    """The registered constants that move none of the cp2, a100, ep4-zipf, host-eager and
    llama3-70b golden cases at x1.5 (no such GPU, kernel, algorithm or call size there) are
    read from the active constants all the same."""
    import simpy
    from simulator.collectives import engine, nccl
    from topologies import build_cluster
    from workloads.costs.compute import RooflineComputeModel
    from workloads.costs.flops import ComputeOp
    half = 0.5
    for name, model, read in (
            ("MAMF_FALLBACK_FRACTION", "H800", lambda m: m.gemm.mamf_flops["bf16"]),
            ("_MAMF_DEFAULT_FRACTION", "B200", lambda m: m.gemm.mamf_flops["fp4"]),
            ("KERNEL_HBM_FRACTION", "H100", lambda m: 1.0 / m.op_cost(
                ComputeOp("ssd_scan", "F", "elementwise", 0.0, 0, 0, 0, mem_bytes=1e9)).memory_s)):
        base = read(RooflineComputeModel(model))
        with C.scaled(f"workloads.costs.compute.{name}", half):
            assert read(RooflineComputeModel(model)) == pytest.approx(half * base), name
    args = {"TREE_CORRECTION": (nccl.bandwidth_factor, ("all_reduce", "tree", "LL", 2, 2 ** 20)),
            "NET_OVERHEAD_US": (nccl.latency_us, ("all_reduce", "ring", "LL", 16, 2)),
            "COLLNET_ARITY_US": (nccl.latency_us, ("all_reduce", "collnet_direct", "Simple", 16, 2))}
    for name, (fn, a) in args.items():
        base = fn(*a)
        with C.scaled(f"simulator.collectives.nccl.{name}", 100.0 if name == "NET_OVERHEAD_US" else 2.0):
            assert fn(*a) != base, name
        assert fn(*a) == base, name
    cluster = build_cluster({"preset": "dgx-h100", "num_nodes": 2})
    ring = engine.CollectiveEngine(simpy.Environment(), cluster).plan(tuple(range(16)), "all_reduce", "ring")[0]
    with C.scaled("simulator.collectives.nccl.RING_PLATEAU_FACTOR", 2.0), \
            C.scaled("simulator.collectives.plans.MAX_RING_CHANNELS", 0.125):
        coll = engine.CollectiveEngine(simpy.Environment(), cluster)
        assert coll.nccl.ring_plateau_factor["hopper"] == 2 * nccl.RING_PLATEAU_FACTOR["hopper"]
        assert ring.n_channels == 8 and coll.plan(tuple(range(16)), "all_reduce", "ring")[0].n_channels == 4


def test_a_perturbation_reaches_worker_processes():
    """validate(..., workers>1) hands the active constants to its workers (evaluate._simulate):
    a spawned process given the scaled constants computes what this process computes under
    scaled(), and the unscaled one what it computes without."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from simulator.engine import run
    from simulator.validation.evaluate import _simulate
    from tests.golden.cases import cases
    from topologies.constants import active
    sc, _ = cases()["cp2"]
    name = "workloads.costs.compute.HBM_EFFICIENCY"
    with C.scaled(name, 1.5):
        here_scaled, c = _simulate(copy.deepcopy(sc), run), active()
    here = _simulate(copy.deepcopy(sc), run)
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        there_scaled = pool.submit(_simulate, copy.deepcopy(sc), run, c).result()
        there = pool.submit(_simulate, copy.deepcopy(sc), run, None).result()
    assert here_scaled["metrics"] == there_scaled["metrics"] != there["metrics"] == here["metrics"]


def test_docs_table_matches_registry():
    text = DOC.read_text()
    assert BEGIN in text and END in text, f"{DOC.name} lacks the registry markers"
    table = text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"
    assert table == C.registry_markdown(), "regenerate the table with registry_markdown()"
