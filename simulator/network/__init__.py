"""The flow network: flows with routes share link capacity max-min fairly on a simpy clock
(:mod:`.flows`), solved by progressive filling (:mod:`.maxmin`)."""

from .flows import FlowNetwork, NetworkSnapshot
from .maxmin import max_min_rates

__all__ = ["FlowNetwork", "NetworkSnapshot", "max_min_rates"]
