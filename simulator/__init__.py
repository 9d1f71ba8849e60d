"""clustersim: a discrete-event simulator of large-model training clusters.

The public API, for scripts and notebooks::

    >>> from simulator import run
    >>> res = run({"model": "tiny-dense", "cluster": {"preset": "dgx-h100", "num_nodes": 1},
    ...            "parallel": {"tp": 2, "pp": 2, "dp": 2, "global_batch_size": 8, "seq_len": 1024}})
    >>> round(res.metrics["step_time_s"], 6) > 0
    True

The package is built in rooms, each importing only the rooms below it (docs/design.md):

=============  ===========================================================================
room           what it holds
=============  ===========================================================================
scenario       the user's description, loaded and checked (:func:`load_scenario`, what-ifs)
network        flows sharing links max-min fairly on a simpy clock
collectives    NCCL's algorithms, protocols and costs as flows on the network
engine         the step simulated: actors per rank cell, folding, what-ifs applied, metrics
report         Gantt charts, breakdown bars, Perfetto traces
explore        the analytic estimator, configuration search, sweeps
validation     predicted against measured step times of published runs
cli            the ``clustersim`` command
=============  ===========================================================================
"""

from topologies import ConfigError

from .collectives import Calibration, CollectiveEngine, get_calibration
from .engine import DeadlockError, Folding, JobStopped, Result, SimulationError, run
from .explore import SearchSpec, estimate, search
from .network import FlowNetwork
from .report import breakdown_bar, gantt, to_chrome_trace
from .scenario import Scenario, WhatIf, load_scenario

__all__ = ["run", "Result", "load_scenario", "Scenario", "WhatIf", "estimate", "search", "SearchSpec", "gantt",
           "breakdown_bar", "to_chrome_trace", "ConfigError", "SimulationError", "DeadlockError", "JobStopped",
           "Folding", "FlowNetwork", "CollectiveEngine", "Calibration", "get_calibration"]
