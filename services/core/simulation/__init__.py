"""The discrete-event simulator's core: pure, on a virtual clock, no I/O.

It runs the very policy objects the services run (``services.core.protocols``) on simulated jobs,
so it sits below the services: a policy can simulate forward from a live snapshot (Blox §5.2's
synthesizer, ``services.scheduler.policies.synthesis``) without importing ``roundhouse``. What users
touch around it (workload generators, trace readers, reports, the CLI, sweeps) is ``roundhouse.sim``.

* :class:`Simulator` (``engine``): one workload on one cluster with one set of policies; its jobs'
  transitions are ``services.core.lifecycle``'s, as the scheduler's. ``Simulator.start_from`` starts
  it from a state; ``forward`` simulates from a live snapshot (Blox §5.2).
* :class:`TraceJob` (``workload``): what a workload replays; :class:`SimJobState` (``jobs``): a
  ``JobState`` whose progress follows the simulated clock; ``loss``: modelled loss curves;
  ``invariants``: the checks of a debug run.
"""

from services.core.simulation.engine import Outcome, Progress, SimConfig, SimulationError, Simulator
from services.core.simulation.jobs import SimClock, SimJobState
from services.core.simulation.workload import TraceJob, WorkloadError, checked_in_order

__all__ = [
    "Outcome",
    "Progress",
    "SimClock",
    "SimConfig",
    "SimJobState",
    "SimulationError",
    "Simulator",
    "TraceJob",
    "WorkloadError",
    "checked_in_order",
]
