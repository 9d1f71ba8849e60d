"""Shared fixtures: small clusters built from presets."""

import pytest

from topologies import build_cluster


@pytest.fixture
def tiny_cluster():
    """2 hosts x 4 GPUs, 4 NICs per host, rail-optimised, H100 rates."""
    return build_cluster({"gpu": "H100-SXM", "num_nodes": 2, "gpus_per_host": 4, "nvlink_domain_size": 4,
                          "nics_per_host": 4, "nic": "ndr", "hosts_per_leaf": 2, "name": "tiny"})


@pytest.fixture
def dgx2():
    """Two DGX H100 hosts."""
    return build_cluster("dgx-h100", num_nodes=2)
