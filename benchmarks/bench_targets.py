"""The scale questions users ask, pinned: each case through the CLI end to end.

Every case is one ``clustersim run SCENARIO --json --profile --quiet`` in its own process
(cluster build included), timed from outside, with the child's peak RSS and the run's own
profile (scenario and graph, program, folding, event loop, of which max-min solves).
The refusal rows time ``clustersim run`` on scenarios that must be refused before any
graph is built.

    python benchmarks/bench_targets.py                 # the cases that finish in minutes
    python benchmarks/bench_targets.py --all           # also the long ones (jitter at 16k, Zipf)
    python benchmarks/bench_targets.py --case NAME     # one case (names: --list)
    python benchmarks/bench_targets.py --timeout 900   # per-case limit in seconds (default 600)

The ``goal`` column is the time clustersim is meant to take on a 2-core machine; rows over it are the
engine work still to do (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

L405B_GB200 = {
    "model": "llama3.1-405b", "precision": "fp8_delayed", "num_steps": 2,
    "cluster": {"preset": "gb200-nvl72", "num_nodes": 64, "nvlink_domain_size": 64, "hosts_per_leaf": 16,
                "nvls": False},
    "parallel": {"tp": 4, "pp": 16, "vpp": 4, "dp": 4, "schedule": "interleaved_1f1b", "micro_batch_size": 1,
                 "global_batch_size": 1536, "seq_len": 8192, "account_for_embedding_in_pipeline_split": True,
                 "account_for_loss_in_pipeline_split": True},
    "overlap": {"tp_comm": True, "p2p": True, "grad_reduce": True, "param_gather": True}}
L405B_16K = {
    "model": "llama3.1-405b", "cluster": "h100-16k", "num_steps": 2,
    "parallel": {"tp": 8, "pp": 16, "dp": 128, "micro_batch_size": 1, "global_batch_size": 2048, "seq_len": 8192,
                 "num_layers_in_first_pipeline_stage": 7, "num_layers_in_last_pipeline_stage": 7}}
DSV3 = {
    "model": "deepseek-v3", "cluster": {"preset": "dgx-h100", "num_nodes": 256}, "num_steps": 2,
    "parallel": {"tp": 1, "pp": 16, "dp": 2, "ep": 64, "micro_batch_size": 1, "global_batch_size": 2048,
                 "seq_len": 4096, "num_layers_in_first_pipeline_stage": 4, "num_layers_in_last_pipeline_stage": 1}}
L405B_131K = {**L405B_16K, "cluster": {"preset": "h100-16k", "num_nodes": 16384},
              "parallel": {**L405B_16K["parallel"], "dp": 1024, "global_batch_size": 16384}}
JITTER = {"jitter": {"scope": "gpu_step", "dist": "lognormal(0, 0.05)"}}

_CHILD = ("import resource, sys\nfrom simulator.cli import main\nrc = main(sys.argv[1:])\n"
          "print('peak_rss_kib', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
          "sys.exit(rc)")

# name -> (scenario, target seconds, target GiB or None, long: only with --all, must be refused)
CASES = {
    "llama3.1-405b-256xgb200-vpp4": (L405B_GB200, 10, None, False, False),
    "llama3.1-405b-16k": (L405B_16K, 2, None, False, False),
    "llama3.1-405b-16k-jitter": ({**L405B_16K, "whatif": JITTER}, 300, 4, True, False),
    "deepseek-v3-2048-balanced": ({**DSV3, "moe_routing": "balanced"}, 2, None, False, False),
    "deepseek-v3-2048-zipf1.2": ({**DSV3, "moe_routing": "zipf(1.2)"}, 60, None, True, False),
    # the same with the opt-in coupled_all_to_all approximation (docs/performance.md#approximations)
    "deepseek-v3-2048-zipf1.2-coupled": ({**DSV3, "moe_routing": "zipf(1.2)", "approximations": ["coupled_all_to_all"]},
                                         60, None, True, False),
    "llama3.1-405b-131k": (L405B_131K, 10, 4, False, False),
    # scaled-down versions of the two slowest exact cases, for profiling and paired timing:
    # GBS 192 (48 micro-batches per pipeline, 1/8 of the work; goal 1/8 of the full one's) and
    # Zipf(1.2) at GBS 128 for one step (1/32 of the work; goal about 1/32 of 60 s)
    "llama3.1-405b-256xgb200-vpp4-gbs192": (
        {**L405B_GB200, "parallel": {**L405B_GB200["parallel"], "global_batch_size": 192}}, 1.25, None, True, False),
    "deepseek-v3-zipf1.2-gbs128-1step": (
        {**DSV3, "moe_routing": "zipf(1.2)", "num_steps": 1, "parallel": {**DSV3["parallel"], "global_batch_size": 128}},
        2, None, True, False),
    "refuse-131k-degrees": ({**L405B_131K, "parallel": {**L405B_131K["parallel"], "dp": 128}}, 1, None, False, True),
    "refuse-1m-gpus": ({**L405B_131K, "cluster": {"preset": "h100-16k", "num_nodes": 131072},
                        "parallel": {**L405B_131K["parallel"], "dp": -1}}, 1, None, False, True),
}

#: extra ``clustersim run`` arguments per case: the jitter case streams its timeline (per-rank
#: summaries, no full rows), whatever the machine's memory would allow
EXTRA_ARGS = {"llama3.1-405b-16k-jitter": ["--timeline", "stream"]}


def child_env() -> dict:
    """The environment of each timed process: this one's, but with Python's bytecode cache
    on, as an installed clustersim has it after its first run (a machine that sets
    PYTHONDONTWRITEBYTECODE recompiles every module on every start: about 0.2 s here)."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def warm_up() -> None:
    """Import the CLI once, untimed, so that the bytecode cache exists before the first case."""
    subprocess.run([sys.executable, "-c", "import simulator.cli"], env=child_env(), check=True)


def run_case(name: str, timeout: float, workdir: Path) -> dict:
    sc, target_s, target_gb, _, refuse = CASES[name]
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**sc, "name": name}, sort_keys=False))
    # the CLI's main, then the process's own peak RSS on stderr
    cmd = [sys.executable, "-c", _CHILD, "run", str(path), "--json", "--profile", "--quiet", *EXTRA_ARGS.get(name, [])]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    try:
        out, err = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        timed_out = True
    wall = time.perf_counter() - t0
    rec = {"case": name, "wall_s": wall, "target_s": target_s, "target_gb": target_gb, "rc": proc.returncode,
           "timed_out": timed_out, "refused": proc.returncode == 2, "must_refuse": refuse}
    lines = err.strip().splitlines()
    if lines and lines[-1].startswith("peak_rss_kib "):
        rec["peak_gb"] = int(lines.pop().split()[1]) / 2**20
        err = "\n".join(lines)
    if proc.returncode == 0:
        m = json.loads(out.strip().splitlines()[-1])
        rec.update(step_s=m["step_time_s"], mfu=m["mfu"], cells=m["fold"].get("rank_cells"),
                   events=m["num_events"], flows=m["num_flows"], solves=m["num_solves"])
        rec["profile"] = err.strip().splitlines()[-6:]
    else:
        rec["message"] = (err.strip().splitlines() or ["(no output)"])[-1][:200]
    return rec


def _line(r: dict) -> str:
    ok = (r["refused"] if r["must_refuse"] else r["rc"] == 0) and not r["timed_out"] and r["wall_s"] <= r["target_s"]
    status = "timeout" if r["timed_out"] else ("refused" if r["refused"] else ("ok" if r["rc"] == 0 else "error"))
    extra = ""
    if r["rc"] == 0:
        extra = (f"step {r['step_s']:.3f} s, MFU {r['mfu']:.1%}, {r['cells']} cells, {r['events']:,} events, "
                 f"{r['flows']:,} flows, {r['solves']:,} solves")
    elif "message" in r:
        extra = r["message"]
    peak = f"{r['peak_gb']:.2f} GB" if "peak_gb" in r else "-"
    return (f"{r['case']:<32} {r['wall_s']:8.1f} s  (goal {r['target_s']:>4} s) {'OK  ' if ok else 'OVER'} "
            f"{status:<8} peak {peak:>8}  {extra}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all", action="store_true", help="also the long cases")
    ap.add_argument("--case", action="append", help="run only these cases")
    ap.add_argument("--list", action="store_true", help="list the cases")
    ap.add_argument("--timeout", type=float, default=600.0, help="per-case limit, seconds")
    ap.add_argument("--profile", action="store_true", help="print each run's wall-time profile")
    args = ap.parse_args()
    if args.list:
        print("\n".join(CASES))
        return 0
    names = args.case or [n for n, c in CASES.items() if args.all or not c[3]]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"bench_targets: unknown case {unknown[0]!r}; --list names them", file=sys.stderr)
        return 2
    warm_up()
    with tempfile.TemporaryDirectory() as d:
        for name in names:
            r = run_case(name, args.timeout, Path(d))
            print(_line(r), flush=True)
            if args.profile and "profile" in r:
                print("    " + "\n    ".join(r["profile"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
