"""Batch routing (Router.routes) gives exactly the routes of Router.route."""

import numpy as np
import pytest

from topologies import build_cluster


@pytest.mark.parametrize("cfg", [{"preset": "dgx-h100", "num_nodes": 64}, "h100-16k", "a100-4nic", "gb200-nvl72",
                                 "dgx-a100", {"preset": "dgx-h100", "num_nodes": 16, "routing": "ecmp_hash"}])
@pytest.mark.parametrize("pxn", [True, False])
def test_batch_routes_equal_scalar_routes(cfg, pxn):
    c = build_cluster(cfg)
    n = c.num_gpus
    rng = np.random.default_rng(7)
    src = rng.integers(0, n, 2000)
    dst = rng.integers(0, n, 2000)
    dst[:100] = src[:100]                                            # to itself
    D = c.nvlink_domain_size
    dst[100:400] = (src[100:400] // D) * D + rng.integers(0, D, 300)   # inside the NVLink domain
    batch = c.router.routes(src, dst, pxn=pxn)
    c.router._cache.clear()
    for a, b, r in zip(src.tolist(), dst.tolist(), batch):
        q = c.router.route(a, b, pxn=pxn)
        assert np.array_equal(q.links, r.links) and np.array_equal(q.coefs, r.coefs), (a, b)
        assert (q.links.dtype, q.coefs.dtype) == (r.links.dtype, r.coefs.dtype), (a, b)


@pytest.mark.parametrize("cfg", [{"preset": "dgx-h100", "num_nodes": 64}, "h100-16k", "gb200-nvl72",
                                 {"preset": "dgx-h100", "num_nodes": 16, "routing": "ecmp_hash"},
                                 {"preset": "dgx-h100", "num_nodes": 64, "hosts_per_leaf": 4, "routing": "adaptive"}])
def test_flat_routes_and_their_latencies_equal_route_by_route(cfg):
    """Router.routes_flat is Router.routes end to end, and Router.path_latencies is
    Router.path_latency of every route to the last bit (plans and pipeline transfers
    take their latencies from it)."""
    c = build_cluster(cfg)
    n = c.num_gpus
    rng = np.random.default_rng(11)
    src = rng.integers(0, n, 3000)
    dst = rng.integers(0, n, 3000)
    dst[:100] = src[:100]
    D = c.nvlink_domain_size
    dst[100:400] = (src[100:400] // D) * D + rng.integers(0, D, 300)
    for s, d in ((src, dst), (src[:5], dst[:5]), (src[:0], dst[:0])):
        links, coefs, lens = c.router.routes_flat(s, d, pxn=True)
        rs = c.router.routes(s, d, pxn=True)
        assert lens.tolist() == [r.links.size for r in rs]
        assert links.tolist() == [x for r in rs for x in r.links.tolist()]
        assert coefs.tobytes() == b"".join(r.coefs.tobytes() for r in rs)
        lat = c.router.path_latencies(links, coefs, lens)
        assert lat.tobytes() == np.array([c.router.path_latency(r) for r in rs], dtype=float).tobytes()
