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
