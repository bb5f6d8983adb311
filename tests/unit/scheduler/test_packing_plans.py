"""The scheduler's plan validation with packing (issue 17): a launch onto a held GPU is kept only
with ``SchedulerConfig.packing`` on, and then only while the GPU holds fewer than
``MAX_JOBS_PER_GPU`` jobs; with packing off the same plan is dropped (``not free``) as before."""

from __future__ import annotations

import uuid

import pytest

from schemas.job import JobSpec
from schemas.nodes import GpuInventory, NodeRegister
from schemas.rounds import NodeGpus, PlacementPlan
from services.scheduler.book import Change, JobBook
from services.scheduler.config import SchedulerConfig
from services.scheduler.inventory import Inventory
from services.scheduler.leases import Lease
from services.scheduler.packing import MAX_JOBS_PER_GPU, GpuLoad
from services.scheduler.rounds import validate_plan


def commit(change: Change | None) -> None:
    assert change is not None
    change.commit()


def queued(book: JobBook, job_id: str) -> None:
    commit(book.arrived(job_id, JobSpec(name=job_id, command=["x"], grace_period_s=10), submit_time=90.0))
    commit(book.accepted(job_id, 100.0))


def running(book: JobBook, job_id: str, gpu: int) -> None:
    queued(book, job_id)
    commit(book.grant(job_id, Lease(f"L{job_id}", job_id, (("n0", (gpu,)),), epoch=7, granted_at=200.0), 200.0))


def inventory(gpus: int) -> Inventory:
    inv = Inventory(lease_ttl_s=30)
    inv.register(NodeRegister(
        node_id="n0", incarnation=uuid.uuid4(), hostname="h", cpus=8, memory_gb=64,
        gpus=[GpuInventory(index=i, uuid=f"G-n0-{i}", name="G", memory_mib=1024) for i in range(gpus)],
    ), now=0.0)  # fmt: skip
    return inv


def on(gpu: int) -> list[NodeGpus]:
    return [NodeGpus(node_id="n0", gpus=[gpu])]


@pytest.fixture
def book() -> JobBook:
    book = JobBook()
    running(book, "r", 0)
    for job_id in ("w", "w2", "w3"):
        queued(book, job_id)
    return book


def test_packing_is_off_by_default() -> None:
    assert SchedulerConfig().packing is False


def test_without_packing_a_held_gpu_is_not_free(book: JobBook) -> None:
    plan = PlacementPlan(round=1, state_version=1, epoch=7, launch={"w": on(0)})
    valid = validate_plan(plan, book, inventory(2), {})
    assert list(valid.launch) == []
    assert any("GPU 0 of n0 is not free" in d for d in valid.dropped)


def test_with_packing_a_held_gpu_takes_one_more_job(book: JobBook) -> None:
    plan = PlacementPlan(round=1, state_version=1, epoch=7, launch={"w": on(0)})
    valid = validate_plan(plan, book, inventory(2), {}, packing=True)
    assert valid.launch == {"w": (("n0", (0,)),)}
    assert valid.dropped == []


def test_with_packing_a_gpu_takes_at_most_two_jobs(book: JobBook) -> None:
    # r holds GPU 0: w may join it, w2 would be the third job there; w3 and ... on GPU 1 pair up
    assert MAX_JOBS_PER_GPU == 2
    plan = PlacementPlan(round=1, state_version=1, epoch=7, launch={"w": on(0), "w2": on(0), "w3": on(1)})
    valid = validate_plan(plan, book, inventory(2), {}, packing=True)
    assert list(valid.launch) == ["w", "w3"]
    assert valid.dropped == ["launch w2: GPU 0 of n0 holds 2 jobs already"]


def test_with_packing_a_suspended_lease_frees_its_place(book: JobBook) -> None:
    running(book, "r2", 0)  # GPU 0 holds r and r2 (a packed pair)
    plan = PlacementPlan(round=1, state_version=1, epoch=7, launch={"w": on(0)}, suspend=["r2"])
    valid = validate_plan(plan, book, inventory(2), {}, packing=True)
    assert list(valid.launch) == ["w"]
    assert valid.suspend == ["r2"]


def test_gpu_load_counts_leases_per_gpu(book: JobBook) -> None:
    load = GpuLoad(book)
    assert load.on("n0")[0] == 1
    assert not load.full("n0", (0,))
    load.claim("n0", (0,))
    assert load.full("n0", (0, 1))
    assert not load.full("n0", (1,))
    assert GpuLoad(book, skip={"Lr"}).on("n0")[0] == 0
