"""Seeded fuzzing of the whole scenario contract, through the same path as ``clustersim run``.

Draw ``i`` of seed ``S`` is a scenario built from ``random.Random("clustersim-fuzz/S/i")``
alone, so any draw can be rebuilt and rerun on its own (``--replay S:i``).  Draws come in
three families, and the driver knows which family each belongs to:

* **valid by construction** (about 4 in 5): every model preset with a few layers, or a
  small model of random dimensions (dense, MoE, MLA, windowed, hybrid Mamba), on every
  cluster preset with overrides, under every schedule, ZeRO stage, recompute mode,
  precision recipe, CP variant, EP layout and MoE dispatcher, routing, host mode, overlap
  switch and what-if.  The generator follows the documented rules (docs/scenarios.md), so
  the simulator must run these; a refusal is a failure (of the generator or of the
  validation: either way someone has to look).
* **invalid on purpose** (about 1 in 6): a valid draw with one defect of a known field
  (wrong type, out of range, unknown key, inconsistent degrees, a rule of the schedule,
  the precision or the what-ifs), or YAML that is malformed or asks for Python objects.
  These must be refused: exit status 2 and one line naming the field.
* **oversized and mismatched** (the rest): thousands of GPUs whose degrees cannot fill
  them.  These must be refused within a second, before any cluster graph is built.

Each draw runs in a worker process through ``simulator.cli.main(["run", FILE, "--json"])``
(the engine's ``run`` is wrapped to keep the :class:`~simulator.engine.Result` for the
invariants of :mod:`simulator.engine.invariants`; small draws also run unfolded and must
match).  Workers are reused across draws and killed when a draw outlives ``--timeout``.
Outcomes: ``ran`` (finite metrics, invariants hold), ``stopped`` (a failed NIC without
failover stopped the job: exit 1 with the documented message), ``refused``, ``timeout``,
``known`` (a failure of an engine defect listed in :data:`KNOWN_ISSUES`, pinned by a
strict xfail test) and ``failed`` (a traceback, an unexpected exit status, a broken
invariant, a refusal of a valid draw, an accepted invalid one, a slow refusal).

    python experiments/fuzz.py --seed 1 --draws 300 --workers 2
    python experiments/fuzz.py --replay 1:17          # one draw, in this process, verbosely

A JSON summary goes to ``results/fuzz/`` (and one line per draw to a ``.jsonl`` log next to
it, so a long run can be watched).
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import math
import multiprocessing as mp
import os
import random
import sys
import tempfile
import time
import traceback
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: Above this many GPUs a valid draw is not also run unfolded (the unfolded reference is
#: one actor per rank; folded and unfolded must agree wherever both run).
UNFOLD_MAX_GPUS = 16
#: Engine defects already reported and pinned by a strict xfail test, by name: (does the
#: draw have the shape, does the outcome's reason match).  A matching failure is counted as
#: ``known`` instead of ``failed`` so a sample stays green until the fix lands; anything
#: else that fails, fails.
KNOWN_ISSUES: dict = {}      # none open: the DualPipe pair defects it held are fixed (test_invariants.py)


#: A draw built to be refused before any graph is built must be refused this fast.
REFUSE_WITHIN_S = 1.0
DEFAULT_TIMEOUT_S = 20.0

# -- the draws ----------------------------------------------------------------------------------

VALID, INVALID, OVERSIZED, BAD_INPUT = "valid", "invalid", "oversized", "bad_input"


@dataclass
class Draw:
    """One scenario: its YAML text, its family, and what the family allows."""

    seed: int
    index: int
    family: str
    text: str
    fields: tuple = ()
    """For an invalid draw: the field names (any one of them) the refusal must name."""
    may_stop: bool = False
    """A failed NIC without failover: exit 1 (the job stopped) is a correct outcome."""
    unfold: bool = False
    """Also run the unfolded reference and compare."""
    note: str = ""
    """What was done to it (the defect of an invalid draw)."""
    files: tuple = ()
    """A bad-input draw's files, ``(name, bytes or None for a folder)``, made in a fresh folder."""
    argv: tuple = ()
    """A bad-input draw's command line (``{dir}``: that folder); empty: ``run FILE --json --quiet``."""

    @property
    def ref(self) -> str:
        """``S:I`` (``S:bI`` for a bad-input draw): what ``--replay`` takes."""
        return f"{self.seed}:{'b' if self.family == BAD_INPUT else ''}{self.index}"


CLUSTERS = ("dgx-a100", "superpod-a100", "azure-ndv4-a100", "a100-4nic", "dgx-h100", "dgx-h200", "dgx-b200",
            "h100-16k", "hgx-h800", "gb200-nvl72")
GPUS_PER_HOST = {"gb200-nvl72": 4}
GENERATION = {"dgx-a100": "ampere", "superpod-a100": "ampere", "azure-ndv4-a100": "ampere", "a100-4nic": "ampere",
              "dgx-b200": "blackwell", "gb200-nvl72": "blackwell"}
PRECISIONS = {"ampere": ("bf16",), "hopper": ("bf16", "fp8_delayed", "fp8_tensorwise", "fp8_blockwise"),
              "blackwell": ("bf16", "fp8_delayed", "fp8_tensorwise", "fp8_blockwise", "mxfp8", "nvfp4")}
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "dualpipe", "zb_v")
RECOMPUTE_MODULES = ("core_attn", "mlp", "moe", "moe_act", "layernorm", "mla_up_proj", "shared_experts")
OVERLAP_SWITCHES = ("grad_reduce", "param_gather", "tp_comm", "p2p", "cp_comm", "fsdp_prefetch", "comm_slowdown",
                    "fb_overlap")
FLOP_CONVENTIONS = ("megatron_core_2025", "megatron_2021", "narayanan_eq3", "nemo_24", "palm_6n")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _model_presets() -> list[str]:
    from workloads import MODEL_PRESETS
    return sorted(MODEL_PRESETS)


class _Gen:
    """Builds one valid scenario mapping from ``rng``; the rules it follows are the
    documented ones (docs/scenarios.md), restated where each choice is made."""

    def __init__(self, rng: random.Random):
        self.r = rng

    def chance(self, p: float) -> bool:
        return self.r.random() < p

    def pick(self, seq):
        return seq[self.r.randrange(len(seq))]

    # cluster ------------------------------------------------------------------------------
    def cluster(self) -> tuple[dict, int, str]:
        r = self.r
        preset = self.pick(CLUSTERS)
        gph = GPUS_PER_HOST.get(preset, 8)
        # mostly one or two hosts: a draw should take well under a second
        nodes = self.pick((1, 1, 2, 2, 2, 4)) if gph == 8 else self.pick((1, 2, 2, 4, 8))
        c: dict = {"preset": preset, "num_nodes": nodes}
        if preset == "h100-16k":
            # its racks of 256 hosts must divide the host count: racks of 1 or 2 hosts here
            c["hosts_per_rack"] = self.pick([d for d in (1, 2) if nodes % d == 0])
        if self.chance(0.15):
            c = {"preset": preset, "num_gpus": nodes * gph, **{k: v for k, v in c.items() if k not in ("preset",
                                                                                                     "num_nodes")}}
        if nodes > 1 and self.chance(0.5):
            c["oversubscription"] = self.pick((1.0, 2.0, 4.0))
        if self.chance(0.3):
            c["routing"] = self.pick(("dmodk", "ecmp_hash", "adaptive"))
        if self.chance(0.2):
            c["seed"] = r.randrange(100)
        for key in ("pxn", "nvls", "rail_optimized"):
            if self.chance(0.15):
                c[key] = self.chance(0.5)
        if self.chance(0.1):
            c["sharp"] = True
        if self.chance(0.15):
            if self.chance(0.6):
                c["nic"] = self.pick(("hdr", "ndr", "xdr"))
            else:
                c["nic_bandwidth"] = self.pick(("100 Gb/s", "25 GB/s", 5e10))
        if nodes > 1 and self.chance(0.15):
            c["hosts_per_leaf"] = self.pick([d for d in _divisors(nodes)])
        if nodes > 1 and preset not in ("h100-16k", "gb200-nvl72") and self.chance(0.1):
            # racks hold whole NVLink domains: none on NVL72, whose domain spans the job here
            c["hosts_per_rack"] = self.pick([d for d in _divisors(nodes) if d < nodes] or [1])
            c["xrack_bandwidth_per_host"] = self.pick(("25 GB/s", "200 GB/s", 100e9))
        if self.chance(0.1):
            c["nvlink_bandwidth"] = self.pick(("300 GB/s", "900 GB/s", 2e11))
        return c, nodes * gph, GENERATION.get(preset, "hopper")

    # model --------------------------------------------------------------------------------
    def model(self, pp: int, vpp: int) -> tuple:
        """(model mapping or preset overrides, its ModelSpec); its layers divide over pp x vpp."""
        from workloads import load_model
        r = self.r
        per = pp * vpp
        kind = r.random()
        if kind < 0.55:
            name = self.pick(_model_presets())
            base = load_model(name)
            spec: dict = {"preset": name}
            if base.hybrid_override_pattern:
                # a short hybrid stack from the preset's own layer kinds, attention included
                # (every kind once at least: mamba and moe sizes given without their layers are errors)
                kinds = sorted(set(base.hybrid_override_pattern))
                n = per * self.pick((1, 2, 2, 3))
                n = per * -(-max(n, len(kinds)) // per)
                pat = [self.pick(kinds) for _ in range(n)]
                for k, pos in zip(kinds, r.sample(range(n), len(kinds))):
                    pat[pos] = k
                spec["num_layers"], spec["hybrid_override_pattern"] = n, "".join(pat)
            else:
                spec["num_layers"] = per * self.pick((1, 2))
                if base.moe is not None and (base.moe.first_k_dense or 0) >= spec["num_layers"]:
                    spec["moe"] = {"first_k_dense": 0}
            if base.mtp_layers and self.chance(0.5):
                spec["mtp_layers"] = 0
            if self.chance(0.3):
                spec["seq_len"] = self.pick((1024, 2048, 4096))
            if self.chance(0.1):
                spec["dropout"] = 0.1
            return spec, load_model(spec)
        if kind < 0.62:
            # a Megatron-LM command line (the model part)
            heads = self.pick((4, 8, 16))
            hidden = heads * self.pick((32, 64))
            n = per * self.pick((1, 2))
            args = (f"--num-layers {n} --hidden-size {hidden} --num-attention-heads {heads} --seq-length 1024 "
                    f"--max-position-embeddings 1024 --vocab-size {self.pick((1024, 32000))}")
            if self.chance(0.5):
                args += " --swiglu --normalization RMSNorm --position-embedding-type rope --untie-embeddings-and-output-weights"
            if self.chance(0.3):
                args += f" --group-query-attention --num-query-groups {self.pick([d for d in _divisors(heads)])}"
            spec = {"megatron_args": args}
            return spec, load_model(spec)
        # a small model of random dimensions
        heads = self.pick((2, 4, 8, 16))
        head_dim = self.pick((16, 32, 64))
        spec = {"name": "fuzz", "num_layers": per * self.pick((1, 2)), "hidden_size": heads * head_dim,
                "num_attention_heads": heads, "num_kv_heads": self.pick(_divisors(heads)),
                "vocab_size": self.pick((1000, 1024, 32000, 50257)), "seq_len": self.pick((256, 512, 1024, 2048)),
                "mlp": self.pick(("swiglu", "gelu", "relu2")), "norm": self.pick(("rmsnorm", "layernorm")),
                "position_embedding": self.pick(("rope", "learned", "none")), "tied_embeddings": self.chance(0.3)}
        if self.chance(0.5):
            spec["ffn_hidden_size"] = spec["hidden_size"] * self.pick((2, 3, 4))
        for key in ("add_bias_linear", "qkv_bias", "qk_norm", "attention_sinks"):
            if self.chance(0.1):
                spec[key] = True
        if self.chance(0.1):
            spec["flash_attention"] = False
        if self.chance(0.15):
            spec["sliding_window"] = self.pick((64, 128))
            if self.chance(0.5) and spec["num_layers"] >= 2:
                spec["window_attn_skip_freq"] = 2
        if self.chance(0.4):
            e = self.pick((2, 4, 8, 16))
            moe: dict = {"num_experts": e, "top_k": self.pick([k for k in (1, 2, 4) if k <= e]),
                         "expert_ffn_hidden_size": spec["hidden_size"] * self.pick((1, 2))}
            if self.chance(0.3):
                moe["num_shared_experts"] = 1
                moe["shared_expert_ffn_hidden_size"] = spec["hidden_size"]
            if self.chance(0.2) and spec["num_layers"] >= 2:
                moe["moe_layer_freq"] = 2
            if self.chance(0.2):
                moe["router_bias"] = True
            if self.chance(0.2):
                moe["latent_size"] = spec["hidden_size"] // 2
            spec["moe"] = moe
        if self.chance(0.15):
            # multi-head latent attention: every head its own K/V, no q/k/v biases or norms,
            # fused attention only (the model's rules)
            spec["mla"] = {"kv_lora_rank": 64, "qk_nope_head_dim": head_dim, "qk_rope_head_dim": 16,
                           "v_head_dim": head_dim, **({"q_lora_rank": 96} if self.chance(0.5) else {})}
            spec["num_kv_heads"] = heads
            for key in ("qkv_bias", "qk_norm", "flash_attention"):
                spec.pop(key, None)
        if self.chance(0.1):
            spec["mtp_layers"] = 1
        return spec, load_model(spec)

    # layout --------------------------------------------------------------------------------
    def parallel(self, world: int, gen: str) -> tuple[dict, dict, object, dict]:
        """(parallel, model mapping, ModelSpec, extra scenario keys)."""
        r = self.r
        schedule = self.pick(SCHEDULES)
        pps = [p for p in _divisors(world) if p <= 8]
        if schedule == "interleaved_1f1b":
            pps = [p for p in pps if p >= 2]
        if schedule == "dualpipe":
            pps = [p for p in pps if p % 2 == 0]
        if not pps:
            schedule, pps = "1f1b", [1]
        pp = self.pick(pps)
        vpp = 2 if schedule in ("interleaved_1f1b", "zb_v") else 1
        model_spec, model = self.model(pp, vpp)
        heads, kv = model.num_attention_heads, model.num_kv_heads
        rest = world // pp
        tps = [t for t in _divisors(rest) if heads % t == 0 and (kv % t == 0 or t % kv == 0) and t <= 8]
        if model.mamba is not None:
            tps = [t for t in tps if model.mamba.num_heads % t == 0 and model.mamba.num_groups % t == 0]
        tp = self.pick(tps)
        seq = self.pick((512, 1024, 2048)) if self.chance(0.6) else (model.seq_len if model.seq_len <= 4096 else 4096)
        par: dict = {"tp": tp, "pp": pp, "schedule": schedule, "seq_len": seq}
        sp = tp > 1 and self.chance(0.85)
        par["sequence_parallel"] = sp
        # context parallelism: sequence divisible by 2 x cp (and by tp per CP rank with SP)
        cps = [c for c in _divisors(rest // tp) if c <= 4 and seq % (2 * c) == 0 and (not sp or (seq // c) % tp == 0)]
        if model.mamba is not None:
            mh, mg = model.mamba.num_heads // tp, model.mamba.num_groups // tp
            cps = [c for c in cps if mh % c == 0 and (mg % c == 0 or c % mg == 0)]
        # context parallelism needs fused (flash) attention, and is not modelled for gated DeltaNet layers
        cp = self.pick(cps) if self.chance(0.35) and model.flash_attention and model.gated_deltanet is None else 1
        if cp > 1:
            par["cp"] = cp
            q_loc = heads // tp
            kv_loc = max(kv // tp, 1) if model.mla is None else q_loc
            kinds = ["p2p", "all_gather"]
            if q_loc % cp == 0 and kv_loc % cp == 0:
                kinds.append("a2a")
            hier = [(a, cp // a) for a in _divisors(cp) if 1 < a < cp and q_loc % a == 0 and kv_loc % a == 0]
            if hier:
                kinds.append("a2a+p2p")
            ctype = self.pick(kinds)
            if ctype != "p2p" or self.chance(0.3):
                par["cp_comm_type"] = ctype
            if ctype == "a2a+p2p":
                par["hierarchical_context_parallel_sizes"] = list(self.pick(hier))
            if ctype in ("p2p", "all_gather") and self.chance(0.15):
                par["cp_split"] = "sequential"
        dp = world // (pp * tp * cp)
        # micro-batches: each schedule's minimum (docs/scenarios.md, "Micro-batches")
        m = {"gpipe": self.pick((1, 2, 3, 4)), "1f1b": self.pick((1, 2, 3, 4)),
             "interleaved_1f1b": pp * self.pick((1, 2)), "zb_h1": pp + self.pick((0, 1, 2)),
             "dualpipe": 2 * pp + 2 * self.pick((0, 1)), "zb_v": pp + self.pick((0, 1, 2 * pp))}[schedule]
        mbs = self.pick((1, 1, 2))
        par["micro_batch_size"] = mbs
        par["global_batch_size"] = m * mbs * dp
        if vpp > 1 or self.chance(0.1):
            par["vpp"] = vpp
        extra: dict = {}
        moe = model.moe
        if moe is not None and self.chance(0.8):
            dispatcher = self.pick(("alltoall", "alltoall", "allgather", "flex"))
            dense = tp * cp * dp
            # the allgather dispatcher is modelled without expert TP only
            etp = 1 if dispatcher == "allgather" else self.pick((1, tp))
            eps = [e for e in _divisors(dense // etp) if moe.num_experts % e == 0 and e <= 16]
            ep = self.pick(eps)
            if ep > 1:
                if etp == tp and dp % ep == 0 and (dispatcher != "allgather" or tp == 1) and self.chance(0.3):
                    # the five-degree form: EP carved out of data parallelism
                    par["ep"], dp_given = ep, dp // ep
                else:
                    par["ep"], par["etp"], dp_given = ep, etp, dp
            else:
                dp_given = dp
                if etp != tp:
                    par["etp"] = etp
            moe_over = {}
            if dispatcher != "alltoall" or self.chance(0.2):
                moe_over["token_dispatcher"] = dispatcher
            if dispatcher == "flex" and self.chance(0.5):
                moe_over["flex_dispatcher_backend"] = self.pick(("deepep", "hybridep"))
            if self.chance(0.2):
                moe_over["capacity_factor"] = self.pick((1.0, 1.25, 2.0))
                if self.chance(0.3):
                    moe_over["token_drop_policy"] = self.pick(("probs", "position"))
            if moe_over:
                model_spec = _merge_model(model_spec, {"moe": moe_over})
            if self.chance(0.6):
                extra["moe_routing"] = self.pick(("balanced", "forced_balanced", f"skew({self.pick((1.0, 1.5, 3.0))})",
                                                  f"zipf({self.pick((0.0, 0.8, 1.5))})"))
            if ep > 1 and dispatcher != "allgather" and self.chance(0.2):
                extra["moe_ep_comm"] = True
        else:
            dp_given = dp
        par["dp"] = -1 if self.chance(0.2) and "etp" in par or ("ep" not in par and self.chance(0.2)) else dp_given
        if par["dp"] == -1 and "ep" in par and "etp" not in par:
            par["dp"] = dp_given            # -1 reads as the folded form; keep the five-degree one explicit
        par["zero_stage"] = self.pick((0, 1, 1, 2, 3))
        if self.chance(0.15):
            par["distributed_optimizer"] = self.chance(0.5)
        rc = self.pick(("none", "selective", "selective", "full"))
        par["recompute"] = rc
        if rc == "selective" and self.chance(0.3):
            mods = [x for x in RECOMPUTE_MODULES if self.chance(0.4)] or ["core_attn"]
            par["recompute_modules"] = mods
        if rc == "full" and self.chance(0.4):
            par["recompute_method"] = self.pick(("uniform", "block"))
            par["recompute_num_layers"] = 1
        if self.chance(0.1):
            axes = ["tp", "cp", "ep", "dp", "pp"]
            r.shuffle(axes)
            if moe is not None:
                # the dense and expert meshes must agree on the pipeline stages: pp at
                # either end of the order always gives that
                axes.remove("pp")
                axes = ["pp", *axes] if self.chance(0.5) else [*axes, "pp"]
            par["mesh_order"] = "-".join(axes)
        if not sp and tp > 1 and self.chance(0.2):
            par["scatter_gather_tensors_in_pipeline"] = True
        return par, model_spec, model, extra

    # options --------------------------------------------------------------------------------
    def scenario(self) -> tuple[dict, int, bool]:
        """(scenario, GPU count, may stop): a valid scenario mapping."""
        cluster, world, gen = self.cluster()
        par, model_spec, model, extra = self.parallel(world, gen)
        sc: dict = {"name": "fuzz", "model": model_spec, "cluster": cluster, "parallel": par,
                    "num_steps": self.pick((1, 2, 2, 3)), "seed": self.r.randrange(1000)}
        prec = self.pick(PRECISIONS[gen])
        if prec != "bf16" or self.chance(0.3):
            sc["precision"] = prec
        if prec.startswith("fp8") and self.chance(0.3):
            sc["precision_options"] = {"fp8_param_gather": True}
        elif prec != "bf16" and self.chance(0.3):
            sc["precision_options"] = {"bf16_first_layers": 1, "bf16_last_layers": 0}
        if self.chance(0.2):
            sc["grad_reduce_dtype"] = self.pick(("fp32", "bf16"))
        overlap = {k: self.chance(0.5) for k in OVERLAP_SWITCHES if self.chance(0.3)}
        if extra.get("moe_ep_comm"):
            ok = par.get("recompute") != "full" and par["schedule"] != "dualpipe" and \
                (par["pp"] == 1 or (par["schedule"] == "interleaved_1f1b" and not overlap.get("p2p")))
            if ok:
                overlap["moe_ep_comm"] = True
        if overlap:
            sc["overlap"] = overlap
        if "moe_routing" in extra:
            sc["moe_routing"] = extra["moe_routing"]
        if self.chance(0.3):
            sc["host"] = self.pick(("eager", "cuda_graphs", "none", {"kernel_us": 5.0, "call_us": 20.0}))
        if self.chance(0.1):
            sc["approximations"] = ["coupled_all_to_all"]
        if self.chance(0.1):
            # NeMo's 2024 count has no term for MLA or Mamba layers (refused for those)
            plain = model.mla is None and model.mamba is None
            sc["flop_convention"] = self.pick([f for f in FLOP_CONVENTIONS if plain or f != "nemo_24"])
        if self.chance(0.1):
            sc["memory_accounting"] = self.pick(("megatron", "zero_paper"))
        if self.chance(0.1):
            sc["hbm_headroom"] = self.pick((0, 0.05, 0.5))
        may_stop = False
        if self.chance(0.35):
            sc["whatif"], may_stop = self.whatif(sc, world)
        return sc, world, may_stop

    def whatif(self, sc: dict, world: int) -> tuple[dict, bool]:
        r = self.r
        w: dict = {}
        g = lambda: r.randrange(world)  # noqa: E731
        if self.chance(0.3):
            w["slow_gpus"] = {g(): self.pick((1.2, 2.0, 0.8))}
            if self.chance(0.3):
                w["slow_gpus"][g()] = {"nic": 2.0, **({"compute": 1.5} if self.chance(0.5) else {})}
        if self.chance(0.2):
            w["slow_ranks"] = {g(): 1.3}
        if self.chance(0.3):
            dist = self.pick(("lognormal(0, 0.1)", "lognormal(0.05, 0.0)", "bernoulli_stall(0.1, 1 ms)",
                              "bernoulli_stall(1, 0.0005)"))
            w["jitter"] = [{"scope": self.pick(("op", "gpu_step", "host_step")), "dist": dist,
                            **({"gpus": [g()]} if self.chance(0.3) else {})}]
        if self.chance(0.2):
            t = {"factor": 1.5, "gpus": self.pick(("all", [g()]))}
            if self.chance(0.5):
                t["start_step"] = r.randrange(sc["num_steps"])
            else:
                t["start_s"] = self.pick((0, "1 ms", 0.01))
            w["thermal"] = [t]
        links = self._links(sc["cluster"])
        if links["any"] and self.chance(0.25):
            w["degraded_links"] = [{"link": list(self.pick(links["any"])), "bandwidth_factor": 0.5,
                                    **({"extra_latency": "5 us"} if self.chance(0.5) else {})}]
        if links["spare"] and not sc["cluster"].get("sharp") and self.chance(0.25):
            w["failed_links"] = [list(self.pick(links["spare"]))]
        may_stop = False
        if links["nics"] and self.chance(0.2):
            w["degraded_nics"] = [{"nic": self.pick(links["nics"]), "bandwidth_factor": 0.25}]
        if links["nics"] and self.chance(0.15):
            w["failed_nics"] = [{"gpu": g(), "at_s": self.pick((0, 0.001))}]
            if self.chance(0.6):
                w["nic_failover"] = "pxn"
            else:
                may_stop = True
        if self.chance(0.15):
            perm = list(range(world))
            r.shuffle(perm)
            w["placement"] = perm
        return w, may_stop

    def _links(self, cluster: dict) -> dict:
        """Link and NIC names of the cluster (the what-ifs name them): any switch-side
        cable, leaf-spine cables whose leaf keeps another spine (failing one leaves a
        route), and NICs."""
        from topologies import build_cluster
        c = build_cluster(dict(cluster))
        g = c.graph
        kind = {n: g.nodes[n].get("kind") for n in g.nodes}
        cables = sorted({tuple(sorted((u, v))) for u, v in c.link_nodes})
        switchy = [e for e in cables if {kind[e[0]], kind[e[1]]} & {"leaf", "spine", "core"}]
        spare = []
        for u, v in cables:
            ks = {kind[u], kind[v]}
            if ks == {"leaf", "spine"}:
                leaf = u if kind[u] == "leaf" else v
                if sum(1 for nb in g.successors(leaf) if kind[nb] == "spine") >= 2:
                    spare.append((u, v))
        nics = sorted(n for n in g.nodes if kind[n] == "nic")
        return {"any": switchy[:64], "spare": spare[:64], "nics": nics}


def _merge_model(spec, over: dict):
    """Model overrides on a preset, a megatron/hf source or a full mapping."""
    spec = dict(spec)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(spec.get(k), dict):
            spec[k] = {**spec[k], **v}
        else:
            spec[k] = v
    return spec


# -- invalid on purpose -----------------------------------------------------------------------
def _invalid(rng: random.Random, sc: dict, world: int) -> tuple[str, tuple, str]:
    """(YAML text, fields the refusal may name, what was broken) from a valid ``sc``."""
    par = sc["parallel"]
    choices = [
        ("parallel.tp", lambda: par.__setitem__("tp", "two"), "tp is a string"),
        ("parallel.pp", lambda: par.__setitem__("pp", 0), "pp = 0"),
        ("parallel.micro_batch_size", lambda: par.__setitem__("micro_batch_size", -1), "negative micro-batch"),
        ("parallel.zero_stage", lambda: par.__setitem__("zero_stage", 4), "zero_stage 4"),
        ("parallel.recompute", lambda: par.__setitem__("recompute", "some"), "unknown recompute"),
        ("parallel.schedule", lambda: par.__setitem__("schedule", "2f2b"), "unknown schedule"),
        ("parallel.sequence_parallel", lambda: par.__setitem__("sequence_parallel", "yes"), "bool as a string"),
        ("parallel.cp_comm_type", lambda: par.__setitem__("cp_comm_type", "ring"), "unknown cp_comm_type"),
        ("parallel.mesh_order", lambda: par.__setitem__("mesh_order", "tp-dp-pp"), "mesh order misses axes"),
        ("parallel", lambda: par.update(tp=par.get("tp", 1) * 2 * world, dp=1), "degrees exceed the GPUs"),
        ("parallel.global_batch_size", lambda: _odd_batch(par, world), "batch not a multiple"),
        ("parallel.etp", lambda: par.__setitem__("etp", None), "a null degree"),
        ("parallel.colour", lambda: par.__setitem__("colour", 3), "unknown parallel key"),
        ("parallel.vpp", lambda: par.update(schedule="interleaved_1f1b", vpp=1), "interleaved with vpp 1"),
        ("scenario.num_steps", lambda: sc.__setitem__("num_steps", 1.5), "num_steps a float"),
        ("scenario.seed", lambda: sc.__setitem__("seed", -3), "negative seed"),
        ("scenario.hbm_headroom", lambda: sc.__setitem__("hbm_headroom", 0.9), "headroom above 0.5"),
        ("scenario.colour", lambda: sc.__setitem__("colour", "blue"), "unknown top-level key"),
        ("scenario.parallel", lambda: sc.pop("parallel"), "parallel missing"),
        ("precision", lambda: sc.__setitem__("precision", "fp7"), "unknown precision"),
        ("overlap.grad_reduce", lambda: sc.__setitem__("overlap", {"grad_reduce": "yes"}), "overlap not a bool"),
        ("overlap.prefetch", lambda: sc.__setitem__("overlap", {"prefetch": True}), "unknown overlap switch"),
        ("scenario.moe_routing", lambda: sc.__setitem__("moe_routing", "skew(0.5)"), "skew below 1"),
        ("scenario.host", lambda: sc.__setitem__("host", "gpu"), "unknown host mode"),
        ("scenario.approximations", lambda: sc.__setitem__("approximations", ["fast"]), "unknown approximation"),
        ("scenario.flop_convention", lambda: sc.__setitem__("flop_convention", "mine"), "unknown FLOP convention"),
        ("cluster.num_nodes", lambda: _cluster(sc).update(num_nodes=0), "no hosts"),
        ("cluster.oversubscription", lambda: _cluster(sc).update(oversubscription=-1), "negative oversubscription"),
        ("cluster.routing", lambda: _cluster(sc).update(routing="random"), "unknown routing"),
        ("cluster.wires", lambda: _cluster(sc).update(wires=3), "unknown cluster key"),
        ("cluster", lambda: _cluster(sc).update(preset="dgx-z100"), "unknown cluster preset"),
        ("model", lambda: sc.__setitem__("model", "llama9-1t"), "unknown model preset"),
        ("model.num_layers", lambda: _model(sc).update(num_layers=-2), "negative layers"),
        ("model.hidden_size", lambda: _model(sc).update(hidden_size="big"), "hidden size a string"),
        ("model.flavour", lambda: _model(sc).update(flavour=1), "unknown model key"),
        ("whatif.slow_gpus", lambda: sc.__setitem__("whatif", {"slow_gpus": {world + 5: 1.5}}), "GPU id out of range"),
        ("whatif.slow_gpus", lambda: sc.__setitem__("whatif", {"slow_gpus": {0: 0}}), "factor 0"),
        ("whatif.jitter", lambda: sc.__setitem__("whatif", {"jitter": [{"dist": "normal(0, 1)"}]}), "unknown dist"),
        ("whatif.thermal", lambda: sc.__setitem__("whatif", {"thermal": [{"factor": 1.5, "start_step":
                                                                          sc.get("num_steps", 2)}]}),
         "thermal after the last step"),
        ("whatif.placement", lambda: sc.__setitem__("whatif", {"placement": list(range(world - 1))}),
         "placement too short"),
        ("whatif.failed_links", lambda: sc.__setitem__("whatif", {"failed_links": [["leaf0.0", "spine9.9"]]}),
         "no such link"),
        ("whatif.nic_failover", lambda: sc.__setitem__("whatif", {"nic_failover": "ecmp"}), "unknown failover"),
        ("whatif.storms", lambda: sc.__setitem__("whatif", {"storms": 1}), "unknown what-if"),
    ]
    field_, mutate, note = choices[rng.randrange(len(choices))]
    mutate()
    return yaml.safe_dump(sc, sort_keys=False), (field_,), note


def _odd_batch(par: dict, world: int) -> None:
    """A global batch that is not a multiple of micro-batch x dp (dense layout, dp >= 2)."""
    for k in ("ep", "etp", "edp"):
        par.pop(k, None)
    par["dp"] = dp = world // (par["tp"] * par["pp"] * par.get("cp", 1))
    par["micro_batch_size"] = 1
    par["global_batch_size"] = 2 * dp + 1 if dp > 1 else 0
    if dp == 1:
        par["global_batch_size"] = -1       # then: a negative batch


def _cluster(sc: dict) -> dict:
    if not isinstance(sc["cluster"], dict):
        sc["cluster"] = {"preset": sc["cluster"]}
    sc["cluster"].pop("num_gpus", None)
    return sc["cluster"]


def _model(sc: dict) -> dict:
    m = sc["model"]
    if isinstance(m, str):
        m = sc["model"] = {"preset": m}
    if "megatron_args" in m:
        m = sc["model"] = {"preset": "tiny-dense"}
    return m


MALFORMED = [
    ("model: tiny-dense\ncluster: {preset: dgx-h100\nparallel: {tp: 2}\n", "unclosed brace"),
    ("model: tiny-dense\n\tcluster: dgx-h100\n", "a tab in the indentation"),
    ("!!python/object/apply:os.system ['echo pwned']\n", "a Python object tag"),
    ("model: !!python/name:os.system\ncluster: dgx-h100\nparallel: {}\n", "a Python name tag"),
    ("- model\n- cluster\n", "a list, not a mapping"),
    ("just a string\n", "a scalar"),
    ("", "an empty file"),
    ("model: tiny-dense\ncluster: dgx-h100\nparallel: {tp: 2, tp: 4}\nmodel: [\n", "unterminated flow sequence"),
    ("model: &a [*a]\n", "a recursive alias"),
    ("model: tiny-dense\ncluster: dgx-h100\nparallel: !!binary aGVsbG8=\n", "a binary tag for a section"),
]


def _oversized(rng: random.Random) -> tuple[str, tuple, str]:
    """Thousands of GPUs with degrees that cannot fill them: refused before a graph is built."""
    kind = rng.randrange(4)
    if kind == 0:
        sc = {"model": "llama3.1-405b", "cluster": "h100-16k",
              "parallel": {"tp": 8, "pp": 16, "dp": rng.choice((3, 100, 129)), "global_batch_size": 2048}}
        return yaml.safe_dump(sc), ("parallel",), "16,384 GPUs, degrees miss the count"
    if kind == 1:
        n = rng.choice((4096, 65536, 1 << 20))
        sc = {"model": "gpt3-175b", "cluster": {"preset": "dgx-h100", "num_nodes": n},
              "parallel": {"tp": 8, "pp": 8, "dp": 7, "global_batch_size": 56}}
        # beyond the size budget the cluster itself is refused first, as fast
        return yaml.safe_dump(sc), ("parallel", "cluster"), f"{n} hosts, degrees miss the count"
    if kind == 2:
        sc = {"model": "deepseek-v3", "cluster": {"preset": "dgx-h100", "num_nodes": 1 << 14},
              "parallel": {"tp": 3, "pp": 8, "dp": -1}}
        return yaml.safe_dump(sc), ("parallel.tp", "parallel.dp"), "tp 3 on 131,072 GPUs"
    sc = {"model": "mixtral-8x22b", "cluster": {"preset": "gb200-nvl72", "num_nodes": 18 * 512},
          "parallel": {"tp": 4, "pp": 8, "ep": 7, "dp": 16, "etp": 1}}
    return yaml.safe_dump(sc), ("parallel.ep",), "ep 7 does not divide 8 experts"


def make_draw(seed: int, index: int) -> Draw:
    """Draw ``index`` of ``seed`` (a pure function of the two)."""
    rng = random.Random(f"clustersim-fuzz/{seed}/{index}")
    u = rng.random()
    if u < 0.04:
        text, fields, note = _oversized(rng)
        return Draw(seed, index, OVERSIZED, text, fields, note=note)
    if u < 0.07:
        text, note = MALFORMED[rng.randrange(len(MALFORMED))]
        # a tag on one section is refused by that section's own check
        return Draw(seed, index, INVALID, text, ("scenario", "parallel"), note=note)
    sc, world, may_stop = _Gen(rng).scenario()
    if u < 0.20:
        text, fields, note = _invalid(rng, sc, world)
        return Draw(seed, index, INVALID, text, fields, note=note)
    return Draw(seed, index, VALID, yaml.safe_dump(sc, sort_keys=False), may_stop=may_stop,
                unfold=world <= UNFOLD_MAX_GPUS)


# -- bad input: files and arguments that are no scenario at all ----------------------------------
# Drawn in their own index space (``S:bI``, ``--bad-inputs``), so the draws above, and the
# results of every seed, stay what they were.  Each must be refused with exit 2 and one line
# naming the argument, before anything is simulated.
_SMALL = {"model": "tiny-dense", "cluster": {"preset": "dgx-h100", "num_nodes": 1},
          "parallel": {"tp": 2, "pp": 2, "dp": 2, "global_batch_size": 8, "seq_len": 512}, "num_steps": 1}
_SMALL_YAML = yaml.safe_dump(_SMALL, sort_keys=False).encode()
_SCENARIO = "{dir}/draw.yaml"


def _binary(rng: random.Random) -> bytes:
    """A file no text reader takes: a PNG signature (not UTF-8) and random bytes."""
    return b"\x89PNG\r\n\x1a\n" + rng.randbytes(rng.randrange(16, 256))


def _bad_scenario_file(rng: random.Random):
    cmd = rng.choice(("run", "memory"))
    kind = rng.randrange(3)
    if kind == 0:
        content, note = _binary(rng), "a binary file"
    elif kind == 1:
        content, note = None, "a folder"
    else:
        content, note = rng.choice((b"", b"\n\n", b"# nothing\n", b"---\n")), "an empty file"
    return (("draw.yaml", content),), (cmd, _SCENARIO), ("scenario",), f"{note} as the scenario of {cmd}"


def _duplicate_key(rng: random.Random):
    sc = _Gen(rng).scenario()[0]
    key = rng.choice(sorted(sc))
    text = yaml.safe_dump(sc, sort_keys=False) + yaml.safe_dump({key: sc[key]}, sort_keys=False)
    return (("draw.yaml", text.encode()),), ("run", _SCENARIO), ("scenario",), f"'{key}' given twice"


def _zero_batch(rng: random.Random):
    sc = {**_SMALL, "parallel": {**_SMALL["parallel"], "global_batch_size": rng.choice((0, -8))}}
    return ((("draw.yaml", yaml.safe_dump(sc).encode()),), ("run", _SCENARIO), ("parallel.global_batch_size",),
            "a global batch below 1")


def _bad_set(rng: random.Random):
    item = rng.choice(("parallel={tp: 8", "parallel.pp=[1", "parallel.tp='2", "seed=@x", "cluster={preset: dgx-h100",
                       "parallel={tp: 2, tp: 4}", "model=*nope"))
    cmd = rng.choice(("run", "compare"))
    return (("draw.yaml", _SMALL_YAML),), (cmd, _SCENARIO, "--set", item), ("--set",), f"{cmd} --set {item}"


def _bad_model_config(rng: random.Random):
    name, content = rng.choice((("model.json", _binary(rng)), ("model.bin", _binary(rng)),
                                ("notes.txt", b"a model with two layers\n"), ("model.yaml", b"- a list\n"),
                                ("model.yml", b"")))
    return ((("draw.yaml", _SMALL_YAML), (name, content)), ("run", _SCENARIO, "--model-config", "{dir}/" + name),
            ("--model-config",), f"--model-config {name}")


def _bad_output(rng: random.Random):
    cmd, flag, path, note = rng.choice((
        ("run", "--out", "{dir}/taken", "an existing file as the output folder"),
        ("run", "--gantt", "{dir}/missing/g.png", "a chart into a missing folder"),
        ("run", "--report", "{dir}/missing/r.html", "a report into a missing folder"),
        ("run", "--trace", "/dev/null/t.json", "a trace under /dev/null"),
        ("run", "--report", "{dir}", "a folder as the report file"),
        ("compare", "--out", "{dir}/taken", "an existing file as compare's output folder"),
        ("sweep", "--out", "/dev/null/s.csv", "a sweep table under /dev/null"),
        ("search", "--plot", "{dir}/taken/p.png", "a plot under a file")))
    argv = (cmd, _SCENARIO, _SCENARIO) if cmd == "compare" else (cmd, _SCENARIO)
    return (("draw.yaml", _SMALL_YAML), ("taken", b"x")), argv + (flag, path), (flag,), note


BAD_KINDS = (_bad_scenario_file, _duplicate_key, _zero_batch, _bad_set, _bad_model_config, _bad_output)


def make_bad_draw(seed: int, index: int) -> Draw:
    """Bad-input draw ``index`` of ``seed``: the kinds in turn, each drawn from its own rng."""
    rng = random.Random(f"clustersim-fuzz-bad/{seed}/{index}")
    files, argv, fields, note = BAD_KINDS[index % len(BAD_KINDS)](rng)
    shown = "\n".join(f"# {n}: " + ("a folder" if c is None else repr(c[:200])) for n, c in files)
    return Draw(seed, index, BAD_INPUT, f"clustersim {' '.join(argv)}\n{shown}\n", fields, note=note,
                files=files, argv=argv)


# -- running one draw (in a worker) -------------------------------------------------------------
def execute_bad(files: tuple, argv: tuple, workdir: str) -> dict:
    """Run a bad-input draw's command in a fresh folder holding its files; as :func:`execute`,
    plus ``simulated``: whether a simulation finished (it must not: the refusal comes first)."""
    import shutil

    import simulator.engine as engine
    from simulator.cli import main

    folder = tempfile.mkdtemp(dir=workdir)
    for name, content in files:
        if content is None:
            os.mkdir(os.path.join(folder, name))
        else:
            Path(folder, name).write_bytes(content)
    real_run, reached = engine.run, []

    def keep(*a, **k):
        res = real_run(*a, **k)
        reached.append(True)          # a simulation finished: the refusal came after the work
        return res

    out, err, tb = io.StringIO(), io.StringIO(), None
    engine.run = keep
    t0 = time.perf_counter()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            rc = main([a.replace("{dir}", folder) for a in argv])
    except SystemExit as e:         # argparse
        rc = e.code if isinstance(e.code, int) else 2
    except BaseException:           # noqa: BLE001 (a crash is the finding)
        rc, tb = None, traceback.format_exc()
    finally:
        engine.run = real_run
        shutil.rmtree(folder, ignore_errors=True)
    return {"rc": rc, "stdout": out.getvalue()[-4000:], "stderr": err.getvalue()[-4000:],
            "wall_s": time.perf_counter() - t0, "traceback": tb, "invariant": None, "simulated": bool(reached)}


def execute(text: str, unfold: bool, workdir: str, files: tuple = (), argv: tuple = ()) -> dict:
    """Run ``text`` through ``clustersim run FILE --json --quiet`` (a bad-input draw: its own
    ``argv`` on its ``files``, :func:`execute_bad`); returns the exit status, stdout, stderr,
    wall time, and any traceback or broken invariant."""
    if argv:
        return execute_bad(files, argv, workdir)
    import simulator.engine as engine
    from simulator.cli import main
    from simulator.engine.invariants import InvariantError, check_invariants, check_same_run, rounding_spread
    from simulator.explore.estimate import check_estimate

    path = Path(workdir) / "draw.yaml"
    path.write_text(text)
    kept: dict = {}
    real_run = engine.run

    def keep(*a, **k):
        res = real_run(*a, **k)
        kept["res"] = res
        return res

    out, err = io.StringIO(), io.StringIO()
    tb = None
    engine.run = keep               # the CLI imports run from simulator.engine when it runs
    t0 = time.perf_counter()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            rc = main(["run", str(path), "--json", "--quiet"])
    except SystemExit as e:         # argparse
        rc = e.code if isinstance(e.code, int) else 2
    except BaseException:           # noqa: BLE001 (a crash is the finding)
        rc, tb = None, traceback.format_exc()
    finally:
        engine.run = real_run
    wall = time.perf_counter() - t0
    outcome = {"rc": rc, "stdout": out.getvalue()[-4000:], "stderr": err.getvalue()[-4000:], "wall_s": wall,
               "traceback": tb, "invariant": None}
    res = kept.get("res")
    if rc == 0 and res is not None:
        try:
            check_invariants(res)
            check_estimate(res)
            json_numbers = json.loads(out.getvalue())
            bad = [k for k, v in _flat(json_numbers) if isinstance(v, float) and not math.isfinite(v)]
            if bad:
                raise AssertionError(f"--json prints non-finite metrics: {bad[:5]}")
            if unfold:
                ref = real_run(res.scenario, fold=False)
                check_invariants(ref)
                try:
                    check_same_run(res, ref)
                except InvariantError:
                    # folded and unfolded differ in the last bits; most runs forget it, but a
                    # run whose collectives meet in near ties takes one order or the other:
                    # hold folding to the run's own rounding spread (docs/reliability.md)
                    spread = rounding_spread(res.scenario, ref)
                    check_same_run(res, ref, spread_s=spread)
                    outcome["rounding_spread_s"] = spread
        except AssertionError as e:
            outcome["invariant"] = str(e)
        except BaseException:       # noqa: BLE001
            outcome["traceback"] = traceback.format_exc()
        outcome["cells"] = res.folding.num_cells
    return outcome


def _flat(x, path=""):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _flat(v, f"{path}.{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _flat(v, f"{path}[{i}]")
    else:
        yield path, x


def classify(d: Draw, o: dict) -> tuple[str, str]:
    """(outcome, reason): ran | stopped | refused | known | failed (timeouts are decided by
    the pool)."""
    outcome, reason = _classify(d, o)
    if outcome == "failed" and d.family == VALID:
        sc = yaml.safe_load(d.text)
        for name, (shape, texts) in KNOWN_ISSUES.items():
            if shape(sc) and any(t in reason for t in texts):
                return "known", f"{name}: {reason}"
    return outcome, reason


def _classify(d: Draw, o: dict) -> tuple[str, str]:
    rc, err = o["rc"], o["stderr"].strip()
    if o.get("traceback"):
        return "failed", "traceback: " + o["traceback"].strip().splitlines()[-1]
    if o.get("invariant"):
        return "failed", o["invariant"]
    if o.get("simulated"):
        return "failed", f"bad input ({d.note}) was simulated before it was refused"
    lines = err.splitlines()
    if d.family == VALID:
        if rc == 0:
            return "ran", ""
        if rc == 1 and d.may_stop and lines and lines[-1].startswith("clustersim: job stopped"):
            return "stopped", ""
        return "failed", f"a valid draw exited {rc}: {lines[-1] if lines else '(no message)'}"
    # invalid and oversized draws must be refused in one line naming the field
    if rc != 2:
        return "failed", f"an invalid draw ({d.note}) exited {rc}" + (f": {lines[-1]}" if lines else "")
    if len(lines) != 1 or not lines[0].startswith("clustersim: error: "):
        return "failed", f"a refusal of {len(lines)} lines: {err[:300]!r}"
    msg = lines[0][len("clustersim: error: "):]
    if not any(f in msg for f in d.fields):
        return "failed", f"the refusal does not name {' or '.join(d.fields)} ({d.note}): {msg}"
    if d.family == OVERSIZED and o["wall_s"] > REFUSE_WITHIN_S:
        return "failed", f"refused after {o['wall_s']:.2f} s (limit {REFUSE_WITHIN_S} s): {msg}"
    return "refused", ""


# -- the worker pool ---------------------------------------------------------------------------
def _worker(conn, workdir: str) -> None:
    """A worker: runs the draws it is sent until it gets None."""
    try:
        import resource
        # a runaway draw fails with MemoryError instead of taking the machine down
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
    except (ImportError, ValueError, OSError):
        pass
    os.environ.setdefault("MPLBACKEND", "Agg")
    while True:
        job = conn.recv()
        if job is None:
            return
        conn.send(execute(*job[:2], workdir, *job[2:]))


class Pool:
    """``workers`` reusable processes; a draw that outlives ``timeout_s`` has its worker
    killed and replaced (a hung simulation cannot be interrupted from inside)."""

    def __init__(self, workers: int, timeout_s: float, workdir: str):
        self.ctx = mp.get_context("spawn")
        self.timeout_s = timeout_s
        self.workdir = workdir
        self.slots = [self._start(i) for i in range(workers)]

    def _start(self, i: int) -> dict:
        parent, child = self.ctx.Pipe()
        wd = Path(self.workdir) / f"w{i}"
        wd.mkdir(parents=True, exist_ok=True)
        p = self.ctx.Process(target=_worker, args=(child, str(wd)), daemon=True)
        p.start()
        child.close()
        return {"i": i, "proc": p, "conn": parent, "job": None, "t0": 0.0}

    def run(self, draws):
        """Yield ``(draw, outcome dict or None on timeout)`` as draws finish."""
        it = iter(draws)
        pending = True
        while True:
            for s in self.slots:
                if s["job"] is None and pending:
                    d = next(it, None)
                    if d is None:
                        pending = False
                        break
                    s["job"], s["t0"] = d, time.monotonic()
                    s["conn"].send((d.text, d.unfold, d.files, d.argv))
            busy = [s for s in self.slots if s["job"] is not None]
            if not busy:
                return
            now = time.monotonic()
            left = min(s["t0"] + self.timeout_s - now for s in busy)
            ready = wait([s["conn"] for s in busy], timeout=max(0.0, left))
            for s in busy:
                if s["conn"] in ready:
                    try:
                        o = s["conn"].recv()
                    except (EOFError, OSError):        # the worker died (a segfault, the OOM killer)
                        o = {"rc": None, "stdout": "", "stderr": "", "wall_s": time.monotonic() - s["t0"],
                             "traceback": f"worker died (exit code {s['proc'].exitcode})", "invariant": None}
                        self._replace(s)
                    d, s["job"] = s["job"], None
                    yield d, o
                elif time.monotonic() - s["t0"] > self.timeout_s:
                    d, s["job"] = s["job"], None
                    self._replace(s)
                    yield d, None

    def _replace(self, s: dict) -> None:
        s["proc"].kill()
        s["proc"].join(5)
        s["conn"].close()
        s.update(self._start(s["i"]))

    def close(self) -> None:
        for s in self.slots:
            try:
                s["conn"].send(None)
            except (BrokenPipeError, OSError):
                pass
        for s in self.slots:
            s["proc"].join(5)
            if s["proc"].is_alive():
                s["proc"].kill()


# -- the driver ----------------------------------------------------------------------------------
@dataclass
class Tally:
    counts: dict = field(default_factory=lambda: {k: 0 for k in ("ran", "stopped", "refused", "timeout", "known",
                                                                   "failed")})
    by_family: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)
    timeouts: list = field(default_factory=list)
    known: list = field(default_factory=list)
    walls: list = field(default_factory=list)
    rounding: list = field(default_factory=list)
    """Draws that ran but whose folded and unfolded runs differed by more than 1e-9: held to
    their own rounding spread (simulator.engine.invariants.rounding_spread) instead."""

    def add(self, d: Draw, outcome: str, reason: str, wall: float) -> None:
        self.counts[outcome] += 1
        fam = self.by_family.setdefault(d.family, {})
        fam[outcome] = fam.get(outcome, 0) + 1
        self.walls.append(wall)
        if outcome == "failed":
            self.failures.append({"draw": d.ref, "family": d.family, "reason": reason,
                                  "note": d.note, "scenario": d.text})
        elif outcome == "timeout":
            self.timeouts.append({"draw": d.ref, "scenario": d.text})
        elif outcome == "known":
            self.known.append({"draw": d.ref, "reason": reason})


def fuzz(seed: int, draws: int, workers: int = 1, timeout_s: float = DEFAULT_TIMEOUT_S, start: int = 0,
         log=None, quiet: bool = False, bad_inputs: int = 0) -> Tally:
    """Run draws ``start .. start + draws - 1`` of ``seed``, then bad-input draws
    ``0 .. bad_inputs - 1`` (:func:`make_bad_draw`); returns the tally."""
    tally = Tally()
    with tempfile.TemporaryDirectory(prefix="clustersim-fuzz-") as tmp:
        pool = Pool(workers, timeout_s, tmp)
        t0 = time.monotonic()
        try:
            gen = itertools.chain((make_draw(seed, i) for i in range(start, start + draws)),
                                  (make_bad_draw(seed, i) for i in range(bad_inputs)))
            total = draws + bad_inputs
            for n, (d, o) in enumerate(pool.run(gen), 1):
                if o is None:
                    outcome, reason, wall = "timeout", f"over the {timeout_s:g} s limit", timeout_s
                else:
                    (outcome, reason), wall = classify(d, o), o["wall_s"]
                tally.add(d, outcome, reason, wall)
                if o is not None and o.get("rounding_spread_s") and outcome == "ran":
                    tally.rounding.append({"draw": f"{d.seed}:{d.index}", "spread_s": o["rounding_spread_s"]})
                if log is not None:
                    log.write(json.dumps({"draw": d.index if d.family != BAD_INPUT else d.ref.split(":")[1],
                                          "family": d.family, "outcome": outcome,
                                          "wall_s": round(wall, 4), "reason": reason}) + "\n")
                    log.flush()
                if outcome == "failed" and not quiet:
                    print(f"\nFAILED draw {d.ref} ({d.family}{', ' + d.note if d.note else ''}): {reason}\n"
                          f"--- scenario (replay: python experiments/fuzz.py --replay {d.ref})\n{d.text}---",
                          flush=True)
                if not quiet and (n % 100 == 0 or n == total):
                    el = time.monotonic() - t0
                    print(f"{n}/{total} draws in {el:.0f} s: " + ", ".join(f"{k} {v}" for k, v in tally.counts.items()),
                          flush=True)
        finally:
            pool.close()
    return tally


def replay(seed: int, index: "int | str") -> int:
    """Rebuild draw ``index`` of ``seed`` (``"bI"``: bad-input draw I), print it and run it here."""
    bad = isinstance(index, str) and index.startswith("b")
    d = make_bad_draw(seed, int(index[1:])) if bad else make_draw(seed, int(index))
    print(f"draw {d.ref}: {d.family}" + (f" ({d.note})" if d.note else "")
          + (f", must name {' or '.join(d.fields)}" if d.fields else "") + "\n---\n" + d.text + "---")
    with tempfile.TemporaryDirectory() as tmp:
        o = execute(d.text, d.unfold, tmp, d.files, d.argv)
    outcome, reason = classify(d, o)
    print(f"exit {o['rc']} in {o['wall_s']:.2f} s: {outcome}" + (f": {reason}" if reason else ""))
    if o["stderr"].strip():
        print("stderr:", o["stderr"].strip()[-2000:])
    if o.get("traceback"):
        print(o["traceback"])
    return 0 if outcome != "failed" else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--draws", type=int, default=100)
    ap.add_argument("--start", type=int, default=0, help="first draw index (default 0)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per draw (default 20)")
    ap.add_argument("--bad-inputs", type=int, default=len(BAD_KINDS), metavar="K",
                    help=f"then K bad-input draws: files and arguments that are no scenario (default "
                         f"{len(BAD_KINDS)}, each kind once; they do not change the other draws)")
    ap.add_argument("--replay", metavar="SEED:INDEX", help="rebuild one draw (SEED:bINDEX: a bad-input draw), "
                                                           "print it and run it here")
    ap.add_argument("--out", metavar="JSON", help="summary path (default results/fuzz/seed<S>-<N>.json)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    if args.replay:
        s, _, i = args.replay.partition(":")
        return replay(int(s), i)
    out = Path(args.out) if args.out else ROOT / "results" / "fuzz" / f"seed{args.seed}-{args.draws}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(out.with_suffix(".jsonl"), "w") as log:
        tally = fuzz(args.seed, args.draws, args.workers, args.timeout, args.start, log, args.quiet,
                     bad_inputs=args.bad_inputs)
    walls = sorted(tally.walls)
    summary = {"seed": args.seed, "start": args.start, "draws": args.draws, "bad_inputs": args.bad_inputs,
               "workers": args.workers,
               "timeout_s": args.timeout, "wall_s": round(time.monotonic() - t0, 1), "counts": tally.counts,
               "by_family": tally.by_family,
               "draw_wall_s": {"median": walls[len(walls) // 2] if walls else None,
                               "p99": walls[int(len(walls) * 0.99)] if walls else None,
                               "max": walls[-1] if walls else None},
               "failures": tally.failures, "timeouts": tally.timeouts, "known": tally.known,
               "rounding_sensitive": tally.rounding}
    out.write_text(json.dumps(summary, indent=1))
    print(f"seed {args.seed}, {args.draws} draws: " + ", ".join(f"{k} {v}" for k, v in tally.counts.items())
          + f" (timeout limit {args.timeout:g} s); {len(tally.rounding)} ran held to their rounding spread; "
          f"summary {out}")
    return 1 if tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())
