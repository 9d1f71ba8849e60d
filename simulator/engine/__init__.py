"""The engine: one simpy actor per rank cell runs a step's program over the flow network
(:mod:`.simulate`), after symmetry folding (:mod:`.fold`) and with what-ifs applied
(:mod:`.perturb`); :mod:`.metrics` turns the timeline into step time, MFU and breakdown."""

from .fold import Folding, fold
from .metrics import breakdown, summarize
from .perturb import JobStopped, Perturbation, expected_max_lognormal
from .simulate import COMM_SLOWDOWN, TIMELINE_COLUMNS, DeadlockError, Result, SimulationError, run

__all__ = ["run", "Result", "DeadlockError", "SimulationError", "JobStopped", "TIMELINE_COLUMNS", "COMM_SLOWDOWN",
           "Folding", "fold", "Perturbation", "expected_max_lognormal", "summarize", "breakdown"]
