"""Pure scheduling core: state views, policy protocols, the registry and one round. No I/O."""

from services.core.decisions import Admission, Placement, Plan, Ranking
from services.core.protocols import AdmissionPolicy, PlacementPolicy, SchedulingPolicy, Trigger, VictimPolicy
from services.core.registry import ADMISSION, PLACEMENT, SCHEDULING, VICTIM, Registry, UnknownPolicyError
from services.core.round import RoundResult, diff_plan, run_round
from services.core.state import ClusterState, Gpu, JobState, JobStatus, Node

__all__ = [
    "ADMISSION",
    "PLACEMENT",
    "SCHEDULING",
    "VICTIM",
    "Admission",
    "AdmissionPolicy",
    "ClusterState",
    "Gpu",
    "JobState",
    "JobStatus",
    "Node",
    "Placement",
    "PlacementPolicy",
    "Plan",
    "Ranking",
    "Registry",
    "RoundResult",
    "SchedulingPolicy",
    "Trigger",
    "UnknownPolicyError",
    "VictimPolicy",
    "diff_plan",
    "run_round",
]
