"""The clustersim engine: flow network, collectives, (later) actors, timeline and metrics."""

from topologies import ConfigError

from .collectives import CollectiveEngine, Calibration, get_calibration
from .network import FlowNetwork

__all__ = ["ConfigError", "FlowNetwork", "CollectiveEngine", "Calibration", "get_calibration"]
