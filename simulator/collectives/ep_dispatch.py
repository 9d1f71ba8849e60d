"""The flex MoE token dispatcher (DeepEP, HybridEP): its all-to-all bandwidth and its SMs.

Megatron-Core's ``--moe-token-dispatcher-type flex`` replaces NCCL's all-to-all with DeepEP
or HybridEP kernels (``--moe-flex-dispatcher-backend``).  Two things change in the model:

* **Bandwidth.** The flex kernels copy tokens with the SMs they hold and reach close to the
  wire rate, where NCCL's all-to-all runs at the calibration's tier efficiency.  The model
  moves the flex all-to-all's bytes at :data:`FLEX_EFFICIENCY` of each tier's link
  capacity instead: it scales the per-peer bytes by ``NCCL efficiency / flex efficiency``
  on the network the collectives share (so contention with other traffic stays).  The
  efficiencies are DeepEP's measured bottleneck bandwidths over the hardware maximum it
  names (DeepEP README, V1 ``docs/legacy.md``, "Normal kernels", H800: intranode EP 8
  dispatch 153 GB/s of about 160 GB/s NVLink; internode EP 16 dispatch 43 GB/s of about
  50 GB/s per CX7 400 Gb/s NIC -- the EP 32 and 64 rows are "logical" bandwidths that
  count NVLink-forwarded traffic, so they are not used).  Assumption: HybridEP moves bytes
  at the same efficiency (its README's figures are algorithm bandwidths that cannot be
  turned into a wire fraction without fitting); the two differ in the SMs they hold.
  Latency: NCCL's all-to-all latency model is kept (an assumption; DeepEP publishes
  latencies only for its low-latency inference kernels).
* **SMs.** The kernels hold ``num_sms`` SMs while they run, so compute that runs at the
  same time (only where the all-to-all overlaps compute: DualPipe's F&B pairs, the MoE
  overlap ``overlap.moe_ep_comm``) runs on the rest: its time is divided by ``1 -
  num_sms / SMs`` (SM share only; no memory-bandwidth term).  Defaults: DeepEP 20 SMs
  (Megatron-Core's historical ``moe_deepep_num_sms`` default, transformer_config.py);
  HybridEP 24 SMs on one node and 8 across nodes (DeepEP hybrid-ep branch,
  ``csrc/hybrid_ep/config.cuh``: ``num_sms_dispatch_api.value_or(num_of_nodes == 1 ? 24 :
  8)``).  ``model.moe.flex_dispatcher_num_sms`` overrides both.  A "node" of these
  kernels is an NVLink domain (DeepEP's intranode kernels and HybridEP's intra-domain path
  run over NVLink; RDMA only between domains), so an EP group inside one NVL72 domain runs
  as one node, on the NVLink tier.
* **Tokens sent once per destination, not once per expert.** Megatron's ``alltoall``
  dispatcher permutes the tokens by expert and sends every (token, expert) copy.  The flex
  kernels send a token once to each rank that holds any of its experts (DeepEP's
  ``num_tokens_per_rank`` layout), and across domains once per destination domain over
  RDMA, forwarded to the ranks inside it over NVLink (DeepEP's internode normal kernels;
  HybridEP's hierarchical dispatch); the combine reduces a token's expert outputs inside a
  domain before the one RDMA send back.  :func:`dedup_factor` is the expected distinct-
  token count over the copy count for uniform top-k routing, applied to the copies the
  routing puts on each pair.  Assumptions: routing uniform at this level (skew and
  DeepSeek-V3's node-limited routing both concentrate experts and would dedup more: the
  model is conservative); the NVLink forwarding inside the destination domain is not
  charged.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["FLEX_EFFICIENCY", "SM_COUNT", "dedup_factor", "flex_bytes_scale", "flex_num_sms", "flex_compute_slowdown",
           "flex_pair_scale"]

#: Achieved fraction of the link capacity of the flex dispatcher's all-to-all, per tier
#: (DeepEP V1 README, H800 normal kernels: 153 / 160 NVLink, 43 / 50 RDMA; see above).
FLEX_EFFICIENCY = {"nvlink": 153.0 / 160.0, "ib": 43.0 / 50.0, "xrack": 43.0 / 50.0, "pcie": 1.0}

#: Streaming multiprocessors per GPU by generation (H100 SXM 132, A100 108, B200 148:
#: NVIDIA's architecture whitepapers / product pages).
SM_COUNT = {"ampere": 108, "hopper": 132, "blackwell": 148}

_DEFAULT_SMS = {"deepep": (20, 20), "hybridep": (24, 8)}      # (one node, several nodes)


def flex_num_sms(moe, multi_node: bool) -> int:
    """SMs the flex dispatcher's kernels hold."""
    if moe.flex_dispatcher_num_sms is not None:
        return int(moe.flex_dispatcher_num_sms)
    one, many = _DEFAULT_SMS[moe.flex_dispatcher_backend]
    return many if multi_node else one


def flex_compute_slowdown(moe, generation: str, multi_node: bool) -> float:
    """Factor on a compute op's time while a flex all-to-all of its rank runs."""
    sms = SM_COUNT.get(generation, 132)
    held = flex_num_sms(moe, multi_node)
    if held >= sms:
        from topologies import ConfigError     # noqa: PLC0415
        raise ConfigError("model.moe.flex_dispatcher_num_sms", held, f"must be below the GPU's {sms} SMs")
    return sms / (sms - held)


def flex_bytes_scale(tier_efficiency: dict, tier: str) -> float:
    """Factor on the flex all-to-all's bytes so that, on links derated by NCCL's
    ``tier_efficiency``, it moves at :data:`FLEX_EFFICIENCY` of the wire rate."""
    return tier_efficiency.get(tier, 1.0) / FLEX_EFFICIENCY.get(tier, 1.0)


def dedup_factor(num_experts: int, top_k: int, experts_there: int) -> float:
    """Distinct tokens over (token, expert) copies that a place holding ``experts_there`` of
    ``num_experts`` experts receives, when each token picks ``top_k`` distinct experts
    uniformly: ``P(at least one there) / E[copies there]``.

    DeepSeek-V3 on 32 ranks of 4 nodes (256 experts, top 8, 64 per node): a token reaches a
    given node with probability 1 - C(192, 8) / C(256, 8) = 0.903 and puts 2 copies there,
    so RDMA carries 0.452 of the copies.

    >>> round(dedup_factor(256, 8, 64), 3)
    0.452
    """
    if not 0 < experts_there <= num_experts or not 0 < top_k <= num_experts:
        raise ValueError(f"experts_there {experts_there}, top_k {top_k} of {num_experts}")
    none_there = math.comb(num_experts - experts_there, top_k) / math.comb(num_experts, top_k)
    return (1.0 - none_there) / (top_k * experts_there / num_experts)


def flex_pair_scale(tier_efficiency: dict, domain: np.ndarray, num_experts: int, top_k: int,
                    cross_tier: str = "ib") -> np.ndarray:
    """Factor on each (source, destination) entry of a flex all-to-all's copy matrix, for an
    EP group whose members sit in NVLink domains ``domain`` (in EP-coordinate order): the
    wire efficiency of the pair's tier (:func:`flex_bytes_scale`) times the tokens sent once
    per destination rank inside a domain, once per destination domain across
    (:func:`dedup_factor`)."""
    domain = np.asarray(domain)
    n = domain.size
    per_rank = num_experts // n
    same = domain[:, None] == domain[None, :]
    members = {int(d): int((domain == d).sum()) for d in np.unique(domain)}
    across = np.array([dedup_factor(num_experts, top_k, per_rank * members[int(d)]) for d in domain])
    inside = dedup_factor(num_experts, top_k, per_rank)
    return np.where(same, flex_bytes_scale(tier_efficiency, "nvlink") * inside,
                    flex_bytes_scale(tier_efficiency, cross_tier) * across[None, :])
