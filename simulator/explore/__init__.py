"""Exploring layouts: the analytic step-time estimator (:mod:`.estimate`), configuration
search (:mod:`.search`) and resumable sweeps, locally or on Dask (:mod:`.sweep`)."""

from .estimate import Estimator, estimate
from .search import SearchSpec, candidates, search
from .sweep import Store, expand, load_sweep, make_executor, run_points, simulate_point

__all__ = ["Estimator", "estimate", "SearchSpec", "candidates", "search", "Store", "expand", "load_sweep",
           "make_executor", "run_points", "simulate_point"]
