"""Tiresias placement: consolidate skewed models (VGG, AlexNet), spread the rest into holes."""

from __future__ import annotations

import pytest

from services.core import PLACEMENT
from services.core.decisions import Ranking
from services.core.round import diff_plan
from services.core.state import JobState
from services.placement.policies.tiresias_skew import TiresiasSkewPlacement
from tests.unit.policies.builders import allocation, assert_unchanged, cluster, frozen, job, jobs_of

# Every case: 2 nodes x 4 GPUs (node-0: GPUs 0-3, node-1: GPUs 4-7); ranking = the order listed.
CASES: list[tuple[str, dict[str, object], list[JobState], dict[str, tuple[int, ...]]]] = [
    (
        "sensitive job goes to the best-fitting node (3 free beats 4 free)",
        {},
        [job("small", on=(0,)), job("vgg", gpus=2, model="vgg16")],
        {"small": (0,), "vgg": (1, 2)},
    ),
    (
        "non-sensitive job fills the smallest holes first, across nodes",
        {},
        [job("three", gpus=3, on=(0, 1, 2)), job("resnet", gpus=2, model="resnet50")],
        {"three": (0, 1, 2), "resnet": (3, 4)},
    ),
    (
        "sensitive job waits when no single node has room; backfill lets a spread job use the GPUs",
        {},
        [
            job("r1", gpus=2, on=(0, 1)),
            job("r2", gpus=2, on=(4, 5)),
            job("vgg", gpus=4, model="VGG-19"),
            job("resnet", gpus=3, model="resnet50"),
        ],
        {"r1": (0, 1), "r2": (4, 5), "resnet": (2, 3, 6)},
    ),
    (
        "without backfill the blocked sensitive job ends the round",
        {"backfill": False},
        [
            job("r1", gpus=2, on=(0, 1)),
            job("r2", gpus=2, on=(4, 5)),
            job("vgg", gpus=4, model="VGG-19"),
            job("resnet", gpus=3, model="resnet50"),
        ],
        {"r1": (0, 1), "r2": (4, 5)},
    ),
    (
        "a higher-ranked sensitive job preempts the lowest-ranked running job",
        {},
        [
            job("alexnet", gpus=4, model="AlexNet"),
            job("mid", gpus=2, on=(0, 1)),
            job("low", gpus=4, on=(4, 5, 6, 7)),
        ],
        {"alexnet": (4, 5, 6, 7), "mid": (0, 1)},
    ),
    (
        "running jobs keep their GPUs even when spread badly",
        {},
        [job("a", gpus=2, on=(3, 4)), job("b", gpus=1, on=(7,)), job("c", gpus=4, model="vgg11")],
        {"a": (3, 4), "b": (7,)},
    ),
    (
        "custom sensitive set",
        {"consolidate_models": ["transformer"]},
        [job("three", gpus=3, on=(0, 1, 2)), job("t", gpus=2, model="Transformer-big")],
        {"three": (0, 1, 2), "t": (4, 5)},
    ),
]


@pytest.mark.parametrize(("options", "items", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_place(
    options: dict[str, object], items: list[JobState], expected: dict[str, tuple[int, ...]]
) -> None:
    policy = PLACEMENT.create("tiresias-skew", **options)
    jobs = jobs_of(*items)
    state = cluster(2, 4, running=[j for j in items if j.gpus])
    ranking = Ranking(order=tuple(jobs))
    before = frozen(jobs, state)

    placement = policy.place(ranking, jobs, state, 0.0)

    assert allocation(placement) == expected
    assert_unchanged(before, jobs, state)
    plan = diff_plan(placement, ranking, jobs)
    assert set(plan.suspend) == {j for j, s in jobs.items() if s.is_running and j not in expected}


@pytest.mark.parametrize(
    ("model", "sensitive"),
    [
        ("VGG-16", True),
        ("vgg_19", True),
        ("alexnet", True),
        ("AlexNet v2", True),
        ("resnet50", False),
        (None, False),
    ],
)
def test_sensitive_models(model: str | None, sensitive: bool) -> None:
    assert TiresiasSkewPlacement().is_sensitive(job(model=model)) is sensitive


def test_rejects_empty_model_name() -> None:
    with pytest.raises(ValueError, match="empty"):
        TiresiasSkewPlacement(consolidate_models=["vgg", "--"])
