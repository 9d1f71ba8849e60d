"""Collective communication on the flow network: NCCL's algorithms, protocols and cost model."""

from .algorithms import ALGORITHMS, PROTOCOLS, CollectiveAlgorithm, Protocol
from .calibration import CALIBRATIONS, IDEAL, Calibration, get_calibration
from .engine import KINDS, CollectiveEngine, CollectiveError, CollectiveRecord, effective_capacity


__all__ = ["CollectiveEngine", "CollectiveError", "CollectiveRecord", "Calibration", "CALIBRATIONS", "IDEAL",
           "get_calibration", "effective_capacity", "KINDS", "ALGORITHMS", "PROTOCOLS", "CollectiveAlgorithm",
           "Protocol"]
