"""``query.admission``'s answer (``services/scheduler/queries.answer_admission``): the unfinished jobs
of the book in submission order (held and admitted, each with its spec), paged by ``after_seq``, and
the live nodes on the first page; and admission's ledger loaded from it (``Ledger.recover``)."""

from __future__ import annotations

import pytest

from schemas.control import AdmissionQuery
from schemas.job import JobSpec
from services.admission.ledger import Ledger
from services.core.state import JobStatus
from services.runtime.store import JobRecord
from services.scheduler import queries
from services.scheduler.book import JobBook, JobEntry
from services.scheduler.inventory import Inventory
from services.scheduler.queries import ADMISSION_REPLY_BYTES, answer_admission
from tests.helpers import fake_node


def record(job_id: str, seq: int, status: JobStatus, *, user: str = "alice", gpus: int = 1) -> JobRecord:
    spec = JobSpec(name=job_id, command=["python", "train.py"], gpus=gpus, user=user)
    admitted = 50.0 + seq if status is not JobStatus.HELD else None
    return JobRecord(job_id=job_id, spec=spec, submit_time=float(seq), status=status, seq=seq, admit_time=admitted)


def book_of(*records: JobRecord) -> JobBook:
    book = JobBook()
    book.load([r for r in records if not r.status.is_final], [])
    for r in records:  # a finished job stays in the book while its lease is being revoked
        if r.status.is_final:
            book.jobs[r.job_id] = JobEntry(r.to_state(), r.version)
    return book


def inventory() -> Inventory:
    nodes = Inventory(lease_ttl_s=30)
    nodes.register(fake_node("n1", 4), now=0.0)
    nodes.register(fake_node("n0", 2), now=0.0)
    nodes.register(fake_node("dead", 8), now=-100.0)
    nodes.sweep(now=0.0)
    return nodes


BOOK = book_of(
    record("h-late", 9, JobStatus.HELD),
    record("q", 2, JobStatus.QUEUED, gpus=2),
    record("h-early", 4, JobStatus.HELD, user="bob"),
    record("done", 3, JobStatus.COMPLETED),
    record("r", 1, JobStatus.QUEUED),
)


def test_unfinished_jobs_in_submission_order_with_specs_and_the_live_nodes() -> None:
    reply = answer_admission(AdmissionQuery(through_seq=10), BOOK, inventory(), epoch=7)
    assert [(j.job_id, j.status, j.seq) for j in reply.jobs] == [
        ("r", "queued", 1), ("q", "queued", 2), ("h-early", "held", 4), ("h-late", "held", 9),
    ]  # fmt: skip
    assert reply.jobs[1].spec.gpus == 2
    assert reply.jobs[2].spec.user == "bob"
    assert reply.jobs[0].admit_time == 51.0
    assert reply.jobs[2].admit_time is None
    assert not reply.truncated
    assert reply.epoch == 7
    assert [(n.node_id, n.gpus) for n in reply.nodes] == [("n0", [0, 1]), ("n1", [0, 1, 2, 3])]  # live only


def test_pages_by_submission_sequence_and_sends_the_nodes_once() -> None:
    first = answer_admission(AdmissionQuery(limit=3), BOOK, inventory(), epoch=1)
    assert [j.job_id for j in first.jobs] == ["r", "q", "h-early"]
    assert first.truncated
    assert len(first.nodes) == 2
    second = answer_admission(AdmissionQuery(limit=3, after_seq=first.jobs[-1].seq), BOOK, inventory(), epoch=1)
    assert [j.job_id for j in second.jobs] == ["h-late"]
    assert not second.truncated
    assert second.nodes == []


def test_a_page_stops_at_its_byte_budget_but_holds_at_least_one_job(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ADMISSION_REPLY_BYTES <= 1024 * 1024 // 2  # half of NATS's default max_payload
    monkeypatch.setattr(queries, "ADMISSION_REPLY_BYTES", 100_000)
    spec = JobSpec(name="big", command=["python", *["x" * 4000] * 15])  # 60 KB: two fill a page
    records = [JobRecord(job_id=f"b{i}", spec=spec, submit_time=0.0, status=JobStatus.HELD, seq=i) for i in range(5)]
    reply = answer_admission(AdmissionQuery(), book_of(*records), inventory(), epoch=1)
    assert [j.job_id for j in reply.jobs] == ["b0", "b1"]
    assert reply.truncated


def test_the_ledger_recovers_admitted_demand_and_offers_held_jobs_in_order() -> None:
    reply = answer_admission(AdmissionQuery(), BOOK, inventory(), epoch=1)
    ledger = Ledger()
    ledger.recover(reply.jobs)
    assert list(ledger.admitted) == ["r", "q"]
    assert ledger.admitted_gpus == 3
    assert ledger.admitted["q"].status is JobStatus.QUEUED
    assert ledger.admitted["q"].admit_time == 52.0
    # Held in the store, with or without a job.held verdict: pending, judged again in this order.
    assert list(ledger.pending) == ["h-early", "h-late"]
    assert not ledger.held
    assert ledger.knows("r")
    assert ledger.knows("h-late")
    assert not ledger.knows("done")
    assert ledger.on_accepted("h-early", now=60.0)
    assert list(ledger.admitted) == ["r", "q", "h-early"]
