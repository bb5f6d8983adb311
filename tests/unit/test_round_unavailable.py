"""A draining node's free GPUs travel in a round under their own key, which no job id can take.

Found by the attack tests (issue 13): the marker job that holds them was not a valid job id, so
placement dropped every round as malformed while any node drained, and nothing was placed anywhere.
"""

from __future__ import annotations

import pytest

from schemas.codec import MalformedMessageError, decode, encode
from schemas.examples import example
from schemas.rounds import UNAVAILABLE_GPUS, NodeGpus, ScheduleRound
from schemas.subjects import subject_for
from services.core.state import UNAVAILABLE


def _round_holding(key: str) -> ScheduleRound:
    base = example(ScheduleRound)
    snapshot = base.snapshot.model_copy(update={"held": {key: [NodeGpus(node_id="node-01", gpus=[2, 3])]}})
    return base.model_copy(update={"snapshot": snapshot})


def test_the_unavailable_marker_travels_in_a_round() -> None:
    assert UNAVAILABLE == UNAVAILABLE_GPUS
    message = _round_holding(UNAVAILABLE)
    decoded = decode(subject_for(message), encode(message))
    assert isinstance(decoded, ScheduleRound)
    assert decoded.snapshot is not None
    assert decoded.snapshot.held[UNAVAILABLE][0].gpus == [2, 3]


@pytest.mark.parametrize("key", ["(other)", "a b", ""])
def test_any_other_key_that_is_not_a_job_id_is_still_refused(key: str) -> None:
    message = _round_holding(key)
    with pytest.raises(MalformedMessageError, match="held"):
        decode(subject_for(message), encode(message))
