"""Collective communication on the flow network: NCCL's algorithms, protocols and cost model."""

from .calibration import CALIBRATIONS, IDEAL, Calibration, get_calibration
from .engine import KINDS, CollectiveEngine, CollectiveError, CollectiveRecord, effective_capacity
from .nccl import ALGORITHMS, PROTOCOLS


__all__ = ["CollectiveEngine", "CollectiveError", "CollectiveRecord", "Calibration", "CALIBRATIONS", "IDEAL",
           "get_calibration", "effective_capacity", "KINDS", "ALGORITHMS", "PROTOCOLS"]
