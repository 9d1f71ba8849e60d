"""The figures quoted in README.md and docs/, regenerated from the commands that produce them.

A figure in a Markdown page sits between two invisible markers, inline

    the demo's step takes <!--fig:demo.step_s-->8.74<!--/fig--> s

or as a block of whole lines (a code block with its printed output, a table)

    <!--figblock:demo.summary-->
    ```text
    ...
    ```
    <!--/figblock-->

``NAME`` is ``producer.key``: the producer (a function below, registered with
:func:`producer`) runs the command once and returns every key's text. Nothing else in
a page is touched; a marker written inside inline code (a backtick just before it) is an
example, not a figure.

    python experiments/docs_figures.py            # --check: list every figure that differs, exit 1 if any
    python experiments/docs_figures.py --write    # rewrite the figures in place (and the README's Gantt picture)
    python experiments/docs_figures.py --list     # every marked figure, page by page, with its level
    python experiments/docs_figures.py --write --level long   # also the 16,384-GPU studies (about an hour)
    python experiments/docs_figures.py --import-predictions results/validation   # after `make validate`

Simulated figures are deterministic: the same code gives the same digits. The accuracy
figures are read from the committed prediction tables in ``experiments/predictions/``
(``make validate`` regenerates them from the reference sets, which takes about 16 minutes with 2 workers,
so the default test suite checks the pages against those tables rather than simulating the
rows again; the ``validation`` suite checks the tables against fresh predictions of its
subset). Wall-clock figures (how long a command takes) depend on the machine and are not
marked: they carry their date and machine in the text instead.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import difflib
import io
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:                    # run as a script from any directory
    sys.path.insert(0, str(ROOT))

PAGES = ("README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")))
"""The pages whose marked figures are kept true (paths relative to the repository root)."""

PREDICTIONS = ROOT / "experiments" / "predictions"
"""The committed prediction tables, one ``predictions_<set>.csv`` per reference set."""

DEMO = ROOT / "experiments" / "configs" / "llama3-70b-64xh100.yaml"
DEMO_GANTT = ROOT / "docs" / "images" / "demo-gantt.png"

INLINE = re.compile(r"(?<!`)<!--fig:(?P<name>[\w.-]+)-->(?P<text>.*?)<!--/fig-->")
BLOCK = re.compile(r"^<!--figblock:(?P<name>[\w.-]+)-->\n(?P<text>.*?)^<!--/figblock-->$", re.M | re.S)

_PRODUCERS: dict[str, Callable[[], dict[str, str]]] = {}
_LEVEL: dict[str, str] = {}
_CACHE: dict[str, dict[str, str]] = {}

LEVELS = ("fast", "slow", "long")
"""How long a producer takes, which decides who checks it: ``fast`` (seconds) the default test
suite, ``slow`` (minutes) the slow suite (``make test-slow``, run by CI), ``long`` (tens of
minutes: the studies at 16,384 GPUs) only ``--level long``. A check below a figure's level leaves
that figure as written."""


def producer(fn=None, *, level: str = "fast"):
    """Register ``fn`` as the producer named after it (``demo`` gives ``demo.*``)."""
    if level not in LEVELS:
        raise ValueError(f"level {level!r}: one of {LEVELS}")

    def register(f):
        _PRODUCERS[f.__name__] = f
        _LEVEL[f.__name__] = level
        return f
    return register(fn) if fn is not None else register


def value(name: str) -> str:
    """The text of figure ``name`` (``producer.key``), running its producer once."""
    prod, _, key = name.partition(".")
    if prod not in _PRODUCERS:
        raise KeyError(f"figure {name!r}: no producer {prod!r} (known: {', '.join(sorted(_PRODUCERS))})")
    if prod not in _CACHE:
        _CACHE[prod] = _PRODUCERS[prod]()
    if key not in _CACHE[prod]:
        raise KeyError(f"figure {name!r}: producer {prod!r} gives {', '.join(sorted(_CACHE[prod]))}")
    return _CACHE[prod][key]


def _within(name: str, level: str) -> bool:
    return LEVELS.index(_LEVEL.get(name.partition(".")[0], "fast")) <= LEVELS.index(level)


# ---------------------------------------------------------------------------------------------
# Simulated figures


def _pct(x: float, digits: int = 1) -> str:
    return f"{x * 100:.{digits}f}"


def _run(sc, **kw):
    from simulator import run
    return run(sc, **kw)


@producer
def demo() -> dict[str, str]:
    """`make demo`: Llama-3 70B on 64 H100 (TP 8, PP 4, DP 2, 1F1B): its printed summary and figures."""
    from simulator.cli import summary_table
    res = _run(str(DEMO))
    m = res.metrics
    # the summary as `clustersim run` prints it, less the wall-clock line (machine-dependent)
    lines = [ln for ln in summary_table(res).splitlines() if not ln.lstrip().startswith("simulated in")]
    out = {"step_s": f"{m['step_time_s']:.2f}", "step_s4": f"{m['step_time_s']:.4f}",
           "mfu": _pct(m["mfu"]), "hfu": _pct(m["hfu"]),
           "bubble_s": f"{m['breakdown_s']['bubble']:.3f}",
           "summary": "```text\n$ clustersim run experiments/configs/llama3-70b-64xh100.yaml\n"
                      + "\n".join(lines) + "\n```\n",
           "python": ("```python\nfrom simulator import run\n\n"
                      'res = run("experiments/configs/llama3-70b-64xh100.yaml")   # a path, a dict or a Scenario\n'
                      f'res.metrics["step_time_s"], res.metrics["mfu"]             # {m["step_time_s"]:.2f} s, '
                      f'{_pct(m["mfu"])} %\n'
                      'res.metrics["breakdown_s"]      # compute, recompute, exposed_<axis>, host_issue, bubble\n'
                      "res.timeline                    # pandas DataFrame, one row per executed op of each cell\n"
                      "res.rank_timeline(ranks=[0])    # the same for chosen ranks\n"
                      'run("experiments/configs/llama3-70b-64xh100.yaml", whatif={"slow_gpus": {5: 1.2}})\n```\n')}
    if _WRITE_PICTURES:      # the README's picture is the chart `make demo` draws
        from simulator.cli import main as cli
        with contextlib.redirect_stdout(io.StringIO()):
            cli(["run", str(DEMO), "--gantt", str(DEMO_GANTT), "--quiet"])
    return out


@producer
def stacks() -> dict[str, str]:
    """Llama 3 8B, ZeRO-3 over 8 and 64 H100, seq 8k and 32k: step time of each PyTorch stack
    relative to megatron_core (docs/modelling.md, "Framework stacks")."""
    out = {}
    for nodes in (1, 8):
        for seq in (8192, 32768):
            times = {}
            for fw in ("megatron_core", "torchtitan_compile", "torchtitan", "pytorch_fsdp", "deepspeed"):
                dp = 8 * nodes
                sc = {"model": "llama3-8b", "cluster": {"preset": "dgx-h100", "num_nodes": nodes},
                      "parallel": {"tp": 1, "pp": 1, "cp": 1, "dp": dp, "micro_batch_size": 1, "global_batch_size": dp,
                                   "seq_len": seq, "zero_stage": 3, "distributed_optimizer": True,
                                   "recompute": "full"},
                      "precision": "bf16", "num_steps": 2, "framework": fw}
                times[fw] = _run(sc, progress=False).metrics["step_time_s"]
            for fw, t in times.items():
                if fw != "megatron_core":
                    out[f"{fw}_{8 * nodes}_{seq // 1024}k"] = f"{t / times['megatron_core'] - 1:+.1%}".replace("%", " %")
            out[f"deepspeed_vs_fsdp_{8 * nodes}_{seq // 1024}k"] = \
                f"{times['deepspeed'] / times['pytorch_fsdp'] - 1:+.1%}".replace("%", " %")
    return out


@producer
def deepspeed_zero() -> dict[str, str]:
    """Llama 3 8B on the deepspeed stack, 8 H100, seq 8k: exposed data-parallel time at ZeRO-1
    (with and without overlap_comm) and ZeRO-3, and ZeRO-3 with FP32 reductions against
    pytorch_fsdp (docs/modelling.md, "Framework stacks")."""
    def metrics(fw, zero, deepspeed=None):
        sc = {"model": "llama3-8b", "cluster": {"preset": "dgx-h100", "num_nodes": 1},
              "parallel": {"dp": 8, "micro_batch_size": 1, "global_batch_size": 8, "seq_len": 8192,
                           "zero_stage": zero, "distributed_optimizer": True, "recompute": "full"},
              "precision": "bf16", "num_steps": 2, "framework": fw}
        if deepspeed:
            sc["deepspeed"] = deepspeed
        return _run(sc, progress=False).metrics

    def ms(m):
        return f"{m['breakdown_s']['exposed_dp'] * 1e3:.0f}"
    fsdp = metrics("pytorch_fsdp", 3)["step_time_s"]
    fp32 = metrics("deepspeed", 3, {"communication_data_type": "fp32"})["step_time_s"]
    return {"z1_ms": ms(metrics("deepspeed", 1)), "z1_overlap_ms": ms(metrics("deepspeed", 1, {"overlap_comm": True})),
            "z3_ms": ms(metrics("deepspeed", 3)), "fp32_vs_fsdp": f"{fp32 / fsdp - 1:+.1%}".replace("%", " %")}


@producer
def stacks_more() -> dict[str, str]:
    """torchtitan against megatron_core on a MoE (Mixtral 8x7B, ZeRO-3 over 16 H100, seq 4k) and
    under torchao's float8 tensorwise casts (Llama 3 8B, ZeRO-3 over 8 H100, seq 8k)
    (docs/modelling.md, "Framework stacks")."""
    out = {}
    for key, model, nodes, seq, precision in (("mixtral", "mixtral-8x7b", 2, 4096, "bf16"),
                                              ("fp8", "llama3-8b", 1, 8192, "fp8_tensorwise")):
        times = {}
        for fw in ("megatron_core", "torchtitan_compile", "torchtitan"):
            dp = 8 * nodes
            sc = {"model": model, "cluster": {"preset": "dgx-h100", "num_nodes": nodes},
                  "parallel": {"tp": 1, "pp": 1, "cp": 1, "dp": dp, "micro_batch_size": 1, "global_batch_size": dp,
                               "seq_len": seq, "zero_stage": 3, "distributed_optimizer": True, "recompute": "full"},
                  "precision": precision, "num_steps": 2, "framework": fw}
            times[fw] = _run(sc, progress=False).metrics["step_time_s"]
        for fw in ("torchtitan_compile", "torchtitan"):
            out[f"{fw}_{key}"] = f"{times[fw] / times['megatron_core'] - 1:+.1%}".replace("%", " %")
    return out


@producer
def estimate() -> dict[str, str]:
    """The closed-form estimate of the demo scenario against its simulation."""
    from simulator import estimate as est_fn
    est = est_fn(str(DEMO))
    sim = float(value("demo.step_s4"))
    return {"step_s": f"{est['step_time_s']:.2f}", "vs_sim_pct": f"{(est['step_time_s'] / sim - 1) * 100:+.1f}",
            "python": ("```python\nfrom simulator import estimate\n\n"
                       'est = estimate("experiments/configs/llama3-70b-64xh100.yaml")\n'
                       'print(est["step_time_s"], est["bubble_fraction"], est["fits"])   '
                       f"# {est['step_time_s']:.2f} s vs {sim:.2f} s simulated\n```\n")}


WHATIF_SCENARIO = {"model": "tiny-dense", "cluster": {"preset": "dgx-h100", "num_nodes": 2},
                   "parallel": {"tp": 8, "dp": 2, "global_batch_size": 16, "seq_len": 2048}, "host": "none"}


@producer
def whatif() -> dict[str, str]:
    """docs/whatifs.md's Python example: a slow GPU, a failed NIC, PXN failover, jitter."""
    from simulator import JobStopped, WhatIf
    sc = WHATIF_SCENARIO
    base = _run(sc).metrics["step_time_s"]
    slow = _run(sc, whatif={"slow_gpus": {3: 1.5}})
    try:
        _run(sc, whatif={"failed_nics": ["nic1.0"]})
        stopped = "(the job did not stop)"
    except JobStopped as e:
        stopped = str(e)
    pxn = _run(sc, whatif={"failed_nics": ["nic1.0"], "nic_failover": "pxn"})
    wi = WhatIf.from_dict({"jitter": {"scope": "gpu_step", "dist": "lognormal(0, 0.1)"}})
    jitter = _run(sc, whatif=wi).metrics["step_time_s"] / base
    short = stopped if len(stopped) <= 60 else stopped[:57].rstrip() + " ..."
    return {"python": (
        "```python\nfrom simulator import JobStopped, WhatIf, run\n\n"
        'sc = {"model": "tiny-dense", "cluster": {"preset": "dgx-h100", "num_nodes": 2},\n'
        '      "parallel": {"tp": 8, "dp": 2, "global_batch_size": 16, "seq_len": 2048}, "host": "none"}\n'
        'base = run(sc).metrics["step_time_s"]\n\n'
        'slow = run(sc, whatif={"slow_gpus": {3: 1.5}})\n'
        f'print(slow.metrics["step_time_s"] / base, len(slow.folding.cells))   '
        f"# {slow.metrics['step_time_s'] / base:.3f}, {len(slow.folding.cells)} cells\n\n"
        "try:\n"
        '    run(sc, whatif={"failed_nics": ["nic1.0"]})\n'
        "except JobStopped as e:\n"
        f"    print(e)             # {short}\n\n"
        'pxn = run(sc, whatif={"failed_nics": ["nic1.0"], "nic_failover": "pxn"})\n'
        f'print(pxn.metrics["step_time_s"] / base)          # {pxn.metrics["step_time_s"] / base:.3f}\n'
        'wi = WhatIf.from_dict({"jitter": {"scope": "gpu_step", "dist": "lognormal(0, 0.1)"}})\n'
        f'print(run(sc, whatif=wi).metrics["step_time_s"] / base)   # {jitter:.3f}\n```\n')}


@producer
def cp_mla_latent() -> dict[str, str]:
    """docs/whatifs.md's cp_mla_latent example: DeepSeek-V3's MLA (two dense layers) at 32k
    tokens, TP 2 x CP 8 on 2 DGX H100, the ring crossing InfiniBand; with and without the what-if."""
    from workloads import load_model
    from workloads.stacks.megatron_te.context_parallel import mla_cp_bytes_per_token
    sc = {"model": {"preset": "deepseek-v3", "num_layers": 2, "mtp_layers": 0, "moe": None},
          "cluster": {"preset": "dgx-h100", "num_nodes": 2},
          "parallel": {"tp": 2, "cp": 8, "dp": 1, "micro_batch_size": 1, "global_batch_size": 1,
                       "seq_len": 32768, "sequence_parallel": True}, "num_steps": 2}
    base = _run(sc).metrics
    what = _run({**sc, "whatif": {"cp_mla_latent": True}}).metrics
    kv1, latent = mla_cp_bytes_per_token(load_model("deepseek-v3"), 1)
    return {"base_ms": f"{base['step_time_s'] * 1e3:.0f}", "what_ms": f"{what['step_time_s'] * 1e3:.0f}",
            "base_cp_ms": f"{base['breakdown_s']['exposed_cp'] * 1e3:.0f}",
            "what_cp_ms": f"{what['breakdown_s'].get('exposed_cp', 0.0) * 1e3:.0f}",
            "kv_tp1": f"{kv1:,.0f}", "latent": f"{latent:,.0f}", "ratio_tp1": f"{kv1 / latent:.0f}"}


@producer
def host_modes() -> dict[str, str]:
    """The topology study's dense job (Llama-3 8B, TP 8 x DP 8, 64 H100) under CUDA graphs and
    eager, and a 2x straggler in a TP group in eager mode."""
    sc = {"model": "llama3-8b", "cluster": {"preset": "dgx-h100", "num_nodes": 8, "hosts_per_leaf": 2},
          "parallel": {"tp": 8, "pp": 1, "dp": 8, "global_batch_size": 32, "seq_len": 4096}, "num_steps": 2}
    graphs = _run({**sc, "host": "cuda_graphs"}).metrics["step_time_s"]
    eager = _run({**sc, "host": "eager"}).metrics["step_time_s"]
    slow = _run({**sc, "host": "eager"}, whatif={"slow_gpus": {3: 2.0}}).metrics["step_time_s"]
    return {"graphs_ms": f"{graphs * 1e3:.0f}", "eager_ms": f"{eager * 1e3:.0f}",
            "eager_straggler_ratio": f"{slow / eager:.3f}"}


@producer
def contention() -> dict[str, str]:
    """`clustersim demo`'s contention example: a 1 GiB all-reduce alone and beside an all-to-all."""
    from simulator.cli import main as cli
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        cli(["demo"])
    m = re.search(r"takes ([\d.]+) ms alone, ([\d.]+) ms while .*\(([\d.]+)x\)", buf.getvalue())
    if m is None:
        raise RuntimeError("`clustersim demo` printed no contention line")
    return {"alone_ms": m[1], "shared_ms": m[2], "ratio": m[3]}


@producer
def fb_overlap() -> dict[str, str]:
    """docs/design.md's DualPipe F&B overlap example (Mixtral 8x7B on 64 H100)."""
    import yaml
    sc = yaml.safe_load(open(ROOT / "experiments" / "configs" / "mixtral-8x7b-64xh100.yaml"))
    sc["parallel"].update(schedule="dualpipe", global_batch_size=128)
    out = {}
    for fb, key in ((True, "on"), (False, "off")):
        m = _run({**sc, "overlap": {"fb_overlap": fb}}).metrics
        out[f"{key}_step_s"] = f"{m['step_time_s']:.3f}"
        out[f"{key}_ep_s"] = f"{m['exposed_comm_s']['ep']:.3f}"
        out[f"{key}_compute_s"] = f"{m['breakdown_s']['compute']:.3f}"
        m = _run({**sc, "overlap": {"fb_overlap": fb, "comm_slowdown": False}}).metrics
        out[f"{key}_noslow_step_s"] = f"{m['step_time_s']:.3f}"
    return out


@producer
def presets() -> dict[str, str]:
    """How many model and cluster presets ship."""
    from topologies.cluster import CLUSTER_PRESETS
    from workloads import MODEL_PRESETS
    return {"models": str(len(MODEL_PRESETS)), "clusters": str(len(CLUSTER_PRESETS))}


@producer
def amd_mesh() -> dict[str, str]:
    """MI300X all-reduce bus bandwidth over the xGMI mesh (4 GiB, 2 and 8 GPUs) against the
    published rows of experiments/reference/rccl_mi300x.csv (tests/simulator/test_mesh_collectives.py)."""
    import simpy
    from simulator.collectives import CollectiveEngine
    from topologies import build_cluster
    c = build_cluster("mi300x")
    ref = ROOT / "experiments" / "reference" / "rccl_mi300x.csv"
    pub = {int(r["gpus"]): float(r["busbw_GBps"]) for r in csv.DictReader(open(ref)) if r["collective"] == "all_reduce"}
    out = {}
    for n in (2, 8):
        env = simpy.Environment()
        eng = CollectiveEngine(env, c)
        eng.issue(eng.register_group(range(n)), 0, "all_reduce", 2**32, count=n)
        env.run()
        r = eng.records[-1]
        bw = 2**32 * 2 * (n - 1) / n / (r.end_s - r.start_s) / 1e9
        out[f"sim_{n}"], out[f"pub_{n}"] = f"{bw:.1f}", f"{pub[n]:.1f}"
        out[f"err_{n}"] = f"{bw / pub[n] - 1:+.1%}".replace("%", " %")
    return out


# ---------------------------------------------------------------------------------------------
# The what-if studies (experiments/whatif/<study>/run.py at their shipped configurations)


def _study(name: str, *args: str) -> tuple[list[dict], Path]:
    """Run study ``name``'s ``main`` into a scratch folder; its rows and that folder."""
    import importlib.util
    import tempfile
    spec = importlib.util.spec_from_file_location(f"study_{name}", ROOT / "experiments" / "whatif" / name / "run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = Path(tempfile.mkdtemp(prefix=f"docs-figures-{name}-"))
    with contextlib.redirect_stdout(io.StringIO()):
        rows = mod.main(["--out", str(out), *args])
    return rows, out


def _ratio(rows, **match) -> float:
    return next(r["ratio"] for r in rows if all(r[k] == v for k, v in match.items()))


@producer
def straggler() -> dict[str, str]:
    """The straggler study on 32 H100: step-time ratio of one slow GPU by placement."""
    rows, _ = _study("straggler")
    out = {f"{case}_2x": f"{_ratio(rows, case=case, slowdown=2.0):.2f}"
           for case in ("tp_group", "pp_first_stage", "pp_last_stage", "dp_replica", "ep_group")}
    out["pp_first_stage_1.5x"] = f"{_ratio(rows, case='pp_first_stage', slowdown=1.5):.3f}"
    return out


@producer
def topology() -> dict[str, str]:
    """The topology study: oversubscription, rail optimisation, NVLink domain size."""
    rows, _ = _study("topology")
    get = {(r["study"], r["setting"]): r for r in rows}
    ms = lambda r, k: f"{r[k] * 1e3:.0f}"          # noqa: E731
    o1, o2, o4 = (get[("oversubscription", f"{o}:1")] for o in (1, 2, 4))
    rail, norail = get[("rail_optimized", "rail-optimised")], get[("rail_optimized", "not rail-optimised")]
    d8, d72 = get[("nvlink_domain", "NVLink domain 8")], get[("nvlink_domain", "NVLink domain 72")]
    return {"over2_ratio": f"{o2['ratio']:.2f}", "over4_ratio": f"{o4['ratio']:.2f}",
            "over1_dp_ms": ms(o1, "exposed_dp_s"), "over4_dp_ms": ms(o4, "exposed_dp_s"),
            "rail_ratio": f"{norail['step_time_s'] / rail['step_time_s']:.2f}",
            "d72_ms": ms(d72, "step_time_s"), "d8_ms": ms(d8, "step_time_s"),
            "d8_ep_ms": ms(d8, "exposed_ep_s"), "d72_ep_ms": ms(d72, "exposed_ep_s"),
            "d8_dp_ms": ms(d8, "exposed_dp_s"), "d72_dp_ms": ms(d72, "exposed_dp_s")}


@producer
def mesh_order() -> dict[str, str]:
    """The mesh-order study: TP innermost against EP innermost, TP 4 x EP 8."""
    rows, _ = _study("mesh_order")
    out = {}
    for r in rows:
        key = f"{'mixtral' if r['model'].startswith('mixtral') else 'qwen'}_{r['innermost']}"
        out[f"{key}_ms"] = f"{r['step_time_s'] * 1e3:.0f}"
        out[f"{key}_tp_ms"] = f"{r['exposed_tp_s'] * 1e3:.0f}"
        out[f"{key}_ep_ms"] = f"{r['exposed_ep_s'] * 1e3:.0f}"
    return out


@producer
def failures() -> dict[str, str]:
    """The failures study: a leaf-spine link down, a NIC down without and with PXN."""
    rows, out_dir = _study("failures")
    cut = next(r for r in rows if "link" in r["case"])
    stop = next(r for r in rows if "no failover" in r["case"])
    pxn = next(r for r in rows if "pxn" in r["case"])
    with open(out_dir / "links.csv", newline="") as f:
        links = list(csv.DictReader(f))
    busiest = lambda col: max(float(r[col]) for r in links)          # noqa: E731
    return {"cut_ratio": f"{cut['ratio']:.3f}", "stop_ms": f"{stop['stop_time_s'] * 1e3:.0f}",
            "stop_gpus": stop["stop_gpus"], "pxn_ratio": f"{pxn['ratio']:.2f}",
            "util_before_pct": f"{busiest('utilisation_before') * 100:.0f}",
            "util_after_pct": f"{busiest('utilisation_after') * 100:.0f}"}


@producer(level="long")
def straggler_16k() -> dict[str, str]:
    """The straggler study at 16,384 H100 (config_16k.yaml; about 10 minutes)."""
    rows, _ = _study("straggler", "--config", str(ROOT / "experiments" / "whatif" / "straggler" / "config_16k.yaml"))
    out = {f"{case}_2x": f"{_ratio(rows, case=case, slowdown=2.0):.2f}"
           for case in ("pp_first_stage", "pp_middle_stage", "pp_last_stage")}
    out["cells_straggler"] = str(max(r["rank_cells"] for r in rows))
    out["cells_base"] = str(min(r["rank_cells"] for r in rows))
    return out


@producer(level="long")
def moe_routing() -> dict[str, str]:
    """The MoE routing study (Qwen3-30B-A3B on 64 H100; about 12 minutes)."""
    rows, _ = _study("moe_routing")
    get = {(r["ep"], r["routing"]): r for r in rows}
    out = {}
    for ep in (8, 32, 64):
        z, b, t = get[(ep, "zipf(1.2)")], get[(ep, "balanced")], get[(ep, "trace")]
        out[f"ep{ep}_zipf1.2"] = f"{z['ratio']:.2f}"
        out[f"ep{ep}_ep_bal_s"] = f"{b['exposed_ep_s']:.2f}"
        out[f"ep{ep}_ep_zipf_s"] = f"{z['exposed_ep_s']:.2f}"
        out[f"ep{ep}_busiest"] = f"{z['busiest_ep_rank_over_mean']:.1f}"
        out[f"ep{ep}_trace"] = f"{t['ratio']:.2f}"
    out["ep64_zipf1.0"] = f"{get[(64, 'zipf(1.0)')]['ratio']:.2f}"
    out["ep64_zipf1.5"] = f"{get[(64, 'zipf(1.5)')]['ratio']:.2f}"
    return out


@producer(level="long")
def tail_at_scale() -> dict[str, str]:
    """The tail-at-scale study: per-GPU jitter up to 16,384 GPUs (about 40 minutes)."""
    rows, _ = _study("tail_at_scale")
    out = {}
    for r in rows:
        n, scope = r["num_gpus"], r["scope"]
        out[f"{scope}_{n}"] = f"{r['ratio_mean']:.2f}"
        if scope == "gpu_step":
            out[f"closed_{n}"] = f"{r['expected_step_ratio']:.2f}"
            out[f"emax_{n}"] = f"{r['expected_max_factor']:.2f}"
    op = [r["ratio_mean"] for r in rows if r["scope"] == "op"]
    out["op_range"] = f"{min(op):.2f}-{max(op):.2f}"
    return out


@producer(level="long")
def config_search() -> dict[str, str]:
    """experiments/configuration_search_example.py: the 28 shapes of 64 H100 under two cross-rack
    fabrics, and the full-knob search at 25 GB/s (about 5-10 minutes)."""
    import importlib.util
    import tempfile

    import pandas as pd
    spec = importlib.util.spec_from_file_location("configuration_search_example",
                                                  ROOT / "experiments" / "configuration_search_example.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.OUT = Path(tempfile.mkdtemp(prefix="docs-figures-search-"))
    argv, sys.argv = sys.argv, ["configuration_search_example.py"]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            mod.main()
    finally:
        sys.argv = argv
    shapes = pd.read_csv(mod.OUT / "shapes.csv")
    out = {}
    for fabric, key in (("25 GB/s", "25"), ("200 GB/s", "200")):
        sub = shapes[shapes["fabric"] == fabric]
        ok = sub[sub["sim_step_s"].notna()].sort_values("sim_step_s")
        best = ok.iloc[0]
        shape = lambda r: f"({r.dp}, {r.pp}, {r.tp})"          # noqa: E731
        at = lambda d, p, t: sub[(sub.dp == d) & (sub.pp == p) & (sub.tp == t)].iloc[0].sim_step_s  # noqa: E731
        out[f"{key}_best"] = f"{shape(best)}: {best.sim_step_s:.2f} s"
        out[f"{key}_118"] = f"{at(1, 8, 8):.2f} s"
        out[f"{key}_818"] = f"{at(8, 1, 8):.2f} s"
        out[f"{key}_oom"] = str(int((sub.status == "oom").sum()))
        out[f"{key}_invalid"] = str(int((sub.status == "invalid").sum()))
    tab = pd.read_csv(mod.OUT / "search_25GBps.csv")
    sim = tab[tab["sim_step_s"].notna()].sort_values("sim_step_s")
    out["search_candidates"] = f"{len(tab):,}"
    out["search_feasible"] = f"{int((tab.status == 'ok').sum()):,}"
    out["search_simulated"] = str(len(sim))
    for i, name in ((0, "first"), (1, "second")):
        r = sim.iloc[i]
        out[f"search_{name}"] = (f"{r.schedule} with TP {r.tp}, PP {r.pp}, DP {r.dp} (ZeRO-{r.zero_stage}), "
                                 f"recompute {r.recompute}, {r.sim_step_s:.2f} s")
        out[f"search_{name}_s"] = f"{r.sim_step_s:.2f}"
    best28 = shapes[(shapes["fabric"] == "25 GB/s") & shapes["sim_step_s"].notna()]["sim_step_s"].min()
    out["search_gain_pct"] = f"{(1 - sim.iloc[0].sim_step_s / best28) * 100:.0f}"
    return out


def estimate_against_simulation(n: int = 200):
    """(estimated, simulated) step times of ``n`` feasible layouts drawn (seed 0) from a 16-GPU
    space: an 8-layer Llama-3 8B on 2 DGX H100, every knob free.  The slow test
    ``test_estimate_ranks_200_candidates_like_the_simulator`` asserts on the same numbers."""
    import numpy as np

    from simulator import run
    from simulator.explore.search import SearchSpec, candidates, screen
    spec = SearchSpec.from_dict({"model": {"preset": "llama3-8b", "num_layers": 8},
                                 "cluster": {"preset": "dgx-h100", "num_nodes": 2}, "global_batch_size": 32,
                                 "seq_len": 2048})
    cands = candidates(spec)
    rng = np.random.default_rng(0)
    table = screen(spec, [cands[i] for i in rng.permutation(len(cands))[:3 * n]])
    ok = table[table["status"] == "ok"].head(n)
    sims = []
    for _, r in ok.iterrows():
        par = {k: (int(r[k]) if k not in ("schedule", "recompute") else r[k]) for k in
               ("tp", "cp", "pp", "dp", "ep", "micro_batch_size", "schedule", "vpp", "recompute", "zero_stage")}
        sims.append(run({**spec.scenario_for({**par, "distributed_optimizer": par["zero_stage"] >= 1,
                                              "sequence_parallel": par["tp"] > 1}), "num_steps": 2}
                        ).metrics["step_time_s"])
    return ok["est_step_s"].to_numpy(), np.array(sims)


def rank_correlation(a, b) -> float:
    """Spearman's rank correlation of two arrays without ties."""
    import numpy as np
    return float(np.corrcoef(np.argsort(np.argsort(a)), np.argsort(np.argsort(b)))[0, 1])


@producer(level="long")
def estimate_ranking() -> dict[str, str]:
    """The estimator against the simulator on 200 feasible layouts (about 3 minutes)."""
    import numpy as np
    est, sims = estimate_against_simulation()
    return {"spearman": f"{rank_correlation(est, sims):.3f}",
            "median_pct": f"{np.median(np.abs(est / sims - 1)) * 100:.1f}"}


# ---------------------------------------------------------------------------------------------
# Accuracy figures, from the committed prediction tables


def predictions(name: str) -> list[dict]:
    """The committed predictions of reference set ``name`` (rows as written by ``validate``)."""
    path = PREDICTIONS / f"predictions_{name}.csv"
    if not path.exists():
        raise FileNotFoundError(f"{path.relative_to(ROOT)}: missing; run `make validate`")
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _stat_cells(rows: list[dict], keys=("median", "p90", "max", "mean")) -> list[str]:
    from simulator.validation.report import _stats
    s = _stats(rows)
    return [f"{s[k]:.1f} %" for k in keys] + [f"{s['bias']:+.1f} %".replace("+-", "-")]


def _ok(rows):
    return sum(r["status"] == "ok" for r in rows)


@producer
def accuracy() -> dict[str, str]:
    """Step-time error tables of the reference sets (experiments/predictions/)."""
    from simulator.validation.report import _stats, family, per_config
    h100, vtrain, bw, single, lf = (predictions(n) for n in ("h100", "vtrain", "blackwell", "vtrain_single",
                                                              "llmfoundry"))

    def row(label, rows, *, coverage=True):
        cells = _stat_cells(rows)
        sim = f"{_ok(rows):,} / {len(rows):,}" if coverage else f"{len(rows):,}"
        return f"| {label} | {sim} | " + " | ".join(cells) + " |"

    head = "| source | rows simulated | median | p90 | max | mean | median signed |\n| --- | --- | --- | --- | --- | --- | --- |\n"
    main_table = head + "\n".join([
        row("`published_runs_h100.csv` (NVIDIA DGX Cloud, 32-2,304 H100, BF16 and FP8)", h100),
        row("vTrain multi-node (Megatron-DeepSpeed, 64-512 A100)", vtrain),
        row("all of the above", h100 + vtrain),
        row("vTrain single host (1,440 runs on one 8-GPU A100 host; reported separately, see below)", single),
        row("MosaicML llm-foundry (MPT on PyTorch FSDP through Composer, 8-512 A100 and H100; reported "
            "separately, see below)", lf),
    ]) + "\n"
    with open(ROOT / "experiments" / "reference" / "published_runs_llmfoundry.csv", newline="") as f:
        seq_of = {r["row_id"]: int(r["seq_len"]) for r in csv.DictReader(f)}
    lf_rows = [
        row("all", lf), row("A100 (40 and 80 GB)", [r for r in lf if "A100" in r["gpu"].upper()]),
        row("H100", [r for r in lf if "H100" in r["gpu"].upper()]),
        *(row(label, [r for r in lf if lo <= seq_of[r["id"]] <= hi])
          for label, lo, hi in (("sequence 512-2,048", 0, 2048), ("sequence 4,096-8,192", 4096, 8192),
                                ("sequence 16,384-65,536", 16384, 1 << 20)))]
    lf_table = head.replace("| source |", "| rows |") + "\n".join(lf_rows) + "\n"

    configs = per_config(bw)
    fam = {f: [r for r in bw if family(r["model"]) == f] for f in ("Llama", "DeepSeek", "Qwen", "gpt-oss", "Nemotron")}
    gens = {g: [r for r in bw if "GB200" in r["gpu"].upper()] if g == "GB200"
            else [r for r in bw if "GB200" not in r["gpu"].upper()] for g in ("B200", "GB200")}
    bw_head = "| rows | simulated | median | p90 | max | mean | median signed |\n| --- | --- | --- | --- | --- | --- | --- |\n"
    bw_table = bw_head + "\n".join([
        row(f"all {len(bw)}", bw),
        row(f"per distinct configuration ({len(configs)}; each the median of its releases)", configs),
        row("B200 rows", gens["B200"]),
        row("GB200 rows", gens["GB200"]),
        row("Llama 3 8B / 70B, Llama 3.1 405B", fam["Llama"]),
        row("DeepSeek-V3 (V4-Flash has no sourced dimensions)", fam["DeepSeek"]),
        row("Qwen3 30B-A3B / 235B-A22B", fam["Qwen"]),
        row("gpt-oss-120b", fam["gpt-oss"]),
        row("Nemotron 3 (Nano, Super; Ultra and 3.5 Lightning have no sourced dimensions)", fam["Nemotron"]),
    ]) + "\n"

    def readme_row(label, rows):
        s = _stats(rows)
        return f"| {label} | {len(rows)} | {s['median']:.1f} % | {s['max']:.1f} % | {s['mean']:.1f} % |"

    readme = ("| measured runs | rows | median error | max | mean |\n| --- | --- | --- | --- | --- |\n" + "\n".join([
        readme_row("NVIDIA DGX Cloud, 32-2,304 H100, BF16 and FP8", h100),
        readme_row("vTrain, Megatron-DeepSpeed on 64-512 A100", vtrain),
        readme_row(f"Megatron-Bridge on 8-256 B200 / GB200 (each release's recipe), {_ok(bw)} of {len(bw)} simulated",
                   bw),
        readme_row("MosaicML llm-foundry, PyTorch FSDP on 8-512 A100 / H100 (its attention kernel; the rest Megatron-Core's)", lf)])
              + "\n")
    def share(rows, part) -> str:
        ok = [r for r in rows if r["status"] == "ok"]
        v = sorted(part(r) / float(r["measured_step_s"]) * 100 for r in ok)
        mid = len(v) // 2
        med = v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2
        return f"{med:.1f} %"
    f = lambda *cols: (lambda r: sum(float(r[c] or 0) for c in cols))       # noqa: E731
    parts = (f("compute_s", "recompute_s"), f("bubble_s"), f("host_issue_s"), f("exposed_ep_s"),
             f("exposed_tp_s", "exposed_pp_s"), lambda r: float(r["measured_step_s"]) - float(r["predicted_step_s"]))
    names = {"Llama": "Llama", "DeepSeek": "DeepSeek-V3", "Qwen": "Qwen3", "gpt-oss": "gpt-oss", "Nemotron": "Nemotron 3"}
    shares = ("| family | compute (with recompute) | bubble | host waits | exposed EP | exposed TP and PP | missing |\n"
              "| --- | --- | --- | --- | --- | --- | --- |\n"
              + "".join(f"| {names[k]} | " + " | ".join(share(rows, p) for p in parts) + " |\n" for k, rows in fam.items()))
    out = {"table": main_table, "shares": shares, "llmfoundry_table": lf_table, "blackwell_table": bw_table, "readme_table": readme,
           "llama_median": f"{_stats(fam['Llama'])['median']:.1f}",
           "bw_ok": str(_ok(bw)), "bw_rows": str(len(bw)),
           "bw_median": f"{_stats(bw)['median']:.1f}", "bw_signed": f"{_stats(bw)['bias']:+.1f}"}
    for key, rows in (("deepseek", fam["DeepSeek"]), ("qwen", fam["Qwen"]), ("gptoss", fam["gpt-oss"]),
                      ("nemotron", fam["Nemotron"]), ("llama", fam["Llama"]), ("b200", gens["B200"]),
                      ("gb200", gens["GB200"])):
        out[f"{key}_signed"] = f"{_stats(rows)['bias']:+.1f}"
    out["h100_median"] = f"{_stats(h100)['median']:.1f}"
    for key, rows in (("bw", bw), ("h100", h100), ("vtrain", vtrain), ("llmfoundry", lf)):
        out[f"{key}_measured_share"], out[f"{key}_measured_rows"] = _measured_share(rows)
    out["h100_max_ceil"] = f"{math.ceil(_stats(h100)['max'] * 2) / 2:.1f}"        # "every row within X %"
    out["vtrain_median"] = f"{_stats(vtrain)['median']:.1f}"
    return out


def _measured_share(rows: list[dict]) -> tuple[str, str]:
    """Median share of the predicted step costed from measured kernel tables over the
    simulated rows (``measured_share_pct``; a table without the column: none), and how many
    rows have any."""
    v = sorted(float(r.get("measured_share_pct") or 0) for r in rows if r["status"] == "ok")
    if not v:
        return "0.0", "0"
    mid = len(v) // 2
    med = v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2
    return f"{med:.1f}", str(sum(1 for x in v if x > 0))


@producer
def intervals() -> dict[str, str]:
    """The error bars' strata and their held-out coverage (simulator/validation/intervals.py),
    from the committed prediction tables."""
    from simulator.validation.intervals import LEVEL, MIN_ROWS, coverage_table, interval_for, residuals
    pool = residuals(sorted(PREDICTIONS.glob("predictions_*.csv")))
    rows = coverage_table(pool)
    lines = ["| stack, GPU generation, family, scope | rows | configurations | sets | measured / predicted "
             f"({LEVEL:.0%}".replace("%", " %") + ") | interval from | held out | inside, held out |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        iv = interval_for(r["stratum"], pool)
        cov = "-" if r["covered"] is None else f"{r['covered'] * 100:.1f} %"
        span = f"{iv.low:.3f}-{iv.high:.3f}" if iv.known else "none"
        lines.append(f"| {r['stratum'].label()} | {r['rows']:,} | {r['configs']:,} | {', '.join(r['sets'])} | {span} | "
                     f"{'its own rows' if r['own'] else 'pooled (' + iv.basis.split('(', 1)[0].removeprefix('pooled over ').strip() + ')'} | "
                     f"{r['fold']} | {cov} |")
    checked = [r["covered"] for r in rows if r["rows"] >= MIN_ROWS and r["covered"] is not None]
    return {"coverage_table": "\n".join(lines) + "\n", "rows": f"{len(pool):,}", "strata": str(len(rows)),
            "checked": str(len(checked)), "min": f"{min(checked) * 100:.1f}", "max": f"{max(checked) * 100:.1f}"}


@producer
def guards() -> dict[str, str]:
    """The medians the accuracy regression test holds (tests/test_validation.py's REACHED)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("test_validation", ROOT / "tests" / "test_validation.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = {}
    for name, (rows, ok, median) in mod.REACHED.items():
        out[f"{name}_rows"], out[f"{name}_ok"], out[f"{name}_median"] = str(rows), str(ok), f"{median:.2f}"
    return out


# ---------------------------------------------------------------------------------------------
# Pages


_WRITE_PICTURES = False


def marked(text: str) -> list[tuple[str, str, str]]:
    """(kind, name, current text) of every marked figure of a page, in page order."""
    found = [(m.start(), "block", m["name"], m["text"]) for m in BLOCK.finditer(text)]
    found += [(m.start(), "inline", m["name"], m["text"]) for m in INLINE.finditer(text)]
    return [(k, n, t) for _, k, n, t in sorted(found)]


def render(text: str, level: str = "fast") -> str:
    """``text`` with every marked figure up to ``level`` replaced by its regenerated value."""
    def block(m):
        if not _within(m["name"], level):
            return m[0]
        v = value(m["name"])
        return f"<!--figblock:{m['name']}-->\n{v if v.endswith(chr(10)) else v + chr(10)}<!--/figblock-->"

    def inline(m):
        if not _within(m["name"], level):
            return m[0]
        return f"<!--fig:{m['name']}-->{value(m['name'])}<!--/fig-->"
    return INLINE.sub(inline, BLOCK.sub(block, text))


def check(pages=PAGES, level: str = "fast") -> list[str]:
    """One unified diff per page whose figures (up to ``level``) differ from what the code gives
    (empty: all true)."""
    diffs = []
    for page in pages:
        old = (ROOT / page).read_text()
        new = render(old, level)
        if new != old:
            diffs.append("".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                                      f"{page} (as written)", f"{page} (as the code gives it)", n=1)))
    return diffs


def import_predictions(src: Path) -> list[Path]:
    """Copy ``predictions_<set>.csv`` from a ``validate_all.py`` output folder into
    experiments/predictions/, without the wall-clock column (so the tables are deterministic)."""
    PREDICTIONS.mkdir(parents=True, exist_ok=True)
    written = []
    for path in sorted(Path(src).glob("predictions_*.csv")):
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        if not rows:
            continue
        cols = [c for c in rows[0] if c != "wall_s"]
        dest = PREDICTIONS / path.name
        with open(dest, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
            w.writeheader()
            w.writerows(rows)
        written.append(dest)
    return written


def main(argv=None) -> int:
    global _WRITE_PICTURES
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="report figures that differ; exit 1 if any (default)")
    mode.add_argument("--write", action="store_true", help="rewrite the figures in place and redraw the README picture")
    mode.add_argument("--list", action="store_true", help="list every marked figure")
    mode.add_argument("--import-predictions", metavar="DIR",
                      help="copy a validate_all.py output folder's predictions_*.csv into experiments/predictions/")
    ap.add_argument("--level", choices=LEVELS, default="slow",
                    help="check or write figures up to this level: fast (seconds), slow (minutes; default), "
                         "long (the 16,384-GPU studies: tens of minutes)")
    ap.add_argument("pages", nargs="*", help=f"pages to treat (default: {', '.join(PAGES)})")
    args = ap.parse_args(argv)
    pages = tuple(args.pages) or PAGES
    for p in pages:
        if not (ROOT / p).is_file():
            ap.error(f"page {p!r}: no such file under {ROOT}")
    if args.import_predictions:
        for dest in import_predictions(Path(args.import_predictions)):
            print(f"wrote {dest.relative_to(ROOT)}")
        return 0
    if args.list:
        for p in pages:
            for kind, name, _ in marked((ROOT / p).read_text()):
                print(f"{p}: {kind} {name} ({_LEVEL.get(name.partition('.')[0], '?')})")
        return 0
    if args.write:
        _WRITE_PICTURES = True
        for p in pages:
            old = (ROOT / p).read_text()
            new = render(old, args.level)
            if new != old:
                (ROOT / p).write_text(new)
                print(f"updated {p}")
        print(f"redrew {DEMO_GANTT.relative_to(ROOT)}" if "demo" in _CACHE else "")
        return 0
    with contextlib.redirect_stdout(io.StringIO()):       # producers' own prints stay out of the report
        diffs = check(pages, args.level)
    for d in diffs:
        print(d)
    print(f"{len(diffs)} page(s) with figures the code no longer gives" if diffs else "every marked figure is current")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
