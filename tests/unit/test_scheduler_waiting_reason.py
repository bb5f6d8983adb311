"""Why a queued job waits, as ``roundhouse jobs`` shows it (``services.scheduler.queries``)."""

from __future__ import annotations

import pytest

from services.core.state import ClusterState
from services.scheduler.queries import WaitingContext, waiting_reason


def _cluster(nodes: int, gpus: int, held: dict[str, tuple[int, ...]]) -> ClusterState:
    cluster = ClusterState.uniform(nodes, gpus)
    for job_id, ids in held.items():
        cluster.assign(job_id, ids)
    return cluster


@pytest.mark.parametrize(
    ("gpus", "held", "expected"),
    [
        pytest.param(1, {"a": (0, 1, 2, 3, 4, 5, 6, 7)}, "needs 1 GPU, 0 of 8 free", id="full"),
        pytest.param(2, {"a": (0, 1, 2, 3, 4, 5)}, "needs 2 GPUs, 2 of 8 free", id="enough-on-one-node"),
        # 4 free in all but 2 per node: the consolidation wait, said outright.
        pytest.param(4, {"a": (0, 1), "b": (4, 5)}, "needs 4 GPUs, 4 of 8 free (at most 2 on one node)",
                     id="fragmented"),
        pytest.param(16, {}, "needs 16 GPUs; the live nodes have 8", id="larger-than-the-cluster"),
    ],
)
def test_the_reason_states_the_gpus_needed_against_those_free(
    gpus: int, held: dict[str, tuple[int, ...]], expected: str
) -> None:
    context = WaitingContext(_cluster(2, 4, held))
    assert waiting_reason(gpus, "job", context).removesuffix("; no round yet") == expected


def test_the_reason_gives_the_place_in_the_last_rounds_ranking() -> None:
    cluster = _cluster(2, 4, {"r1": (0, 1, 2, 3), "r2": (4, 5, 6, 7)})
    # Running jobs in the ranking are not places in the queue.
    ranked = ["r1", "w1", "r2", "w2", "w3"]
    context = WaitingContext.after_round(cluster, ranked, lambda j: j.startswith("w"), 12)
    assert waiting_reason(1, "w2", context) == "needs 1 GPU, 0 of 8 free; #2 of 3 waiting in round 12"
    assert waiting_reason(1, "new", context) == "needs 1 GPU, 0 of 8 free; arrived after round 12"
    first = WaitingContext.after_round(cluster, [], lambda j: True, None)
    assert waiting_reason(1, "w1", first) == "needs 1 GPU, 0 of 8 free; no round yet"
