"""Store write throughput: single-row commits vs the batched writer, in one run.

Modes, each inserting new jobs (uuid4-hex ids, realistic specs) into a fresh store:

* single-row commits: one caller awaiting ``add_jobs([job])`` in a loop with lingering off, so every
  job is its own transaction (what a naive repository does): the baseline;
* batched, N in flight: an open-loop producer keeping up to N single-job requests queued
  (``submit_nowait``), waiting on the oldest when full, as a consumer bounded by max_ack_pending does;
* batched, N callers: N tasks, each awaiting its own single-job ``add_jobs`` before the next (closed
  loop: a batch holds at most N requests);
* apply_event, N in flight: like the open loop, but each job is applied as an event
  (``apply_event_nowait``: claim the event id for idempotency, then insert), the consumer's path.

Rows per second, transactions and the ratio to the baseline are printed for SQLite (a temporary
data directory) and, when one is reachable, PostgreSQL (a throw-away schema, dropped afterwards).

    python -m benchmarks.store [--rows 40000] [--postgres URL | --no-postgres]

Target (issue 2): batched >= 30,000 rows/s on SQLite on the project's development machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import create_async_engine

from schemas.job import JobClass, JobSpec
from services.runtime.store import InsertJobs, JobRecord, Store, StoreConfig, resolve_target

DEFAULT_POSTGRES = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
TARGET_SQLITE_ROWS_PER_S = 30_000.0


@dataclass(frozen=True, slots=True)
class Measurement:
    backend: str
    mode: str
    rows: int
    seconds: float
    cpu_seconds: float
    """CPU time of this process (event loop and driver threads) while measuring: steadier than wall
    time on a shared machine. PostgreSQL's own CPU time is not included."""
    transactions: int

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("inf")


def make_specs(count: int) -> list[JobSpec]:
    """Distinct, realistic specs, built once per run (spec validation is not the store's cost)."""
    users = [f"user{i}" for i in range(16)]
    return [
        JobSpec(
            name=f"train-{i}",
            user=users[i % len(users)],
            command=["python", "train.py", "--lr", "0.1", f"--seed={i}"],
            gpus=1 << (i % 4),
            job_class=JobClass.TE if i % 3 == 0 else JobClass.BE,
            model="resnet50",
        )
        for i in range(count)
    ]


def make_jobs(specs: Sequence[JobSpec], count: int) -> list[JobRecord]:
    """``count`` new jobs with random uuid4-hex ids, as submitters choose them (so inserts land all
    over the primary-key index, the expensive case)."""
    return [
        JobRecord(job_id=uuid.uuid4().hex, spec=specs[i % len(specs)], submit_time=float(i), seq=i)
        for i in range(count)
    ]


async def _timed(store: Store, backend: str, mode: str, count: int, body: Callable[[], Awaitable[None]]) -> Measurement:
    before = store.stats.transactions
    start, cpu_start = time.perf_counter(), time.process_time()
    await body()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return Measurement(backend, mode, count, elapsed, cpu, store.stats.transactions - before)


async def measure_single(target: str, backend: str, jobs: Sequence[JobRecord], schema: str | None) -> Measurement:
    store = await Store.open(target, config=StoreConfig(linger_s=0.0), schema=schema)
    try:

        async def body() -> None:
            for job in jobs:
                await store.add_jobs([job])

        return await _timed(store, backend, "single-row commits", len(jobs), body)
    finally:
        await store.close()


async def measure_pipelined(
    target: str,
    backend: str,
    jobs: Sequence[JobRecord],
    schema: str | None,
    window: int,
    *,
    as_events: bool = False,
) -> Measurement:
    """Open loop with flow control: keep up to ``window`` single-job requests in flight (like a
    JetStream consumer bounded by max_ack_pending), waiting on the oldest when full. The writer
    commits in queue order, so the oldest future is the next to resolve. With ``as_events`` each
    job is applied as an event (``apply_event_nowait``: claim the event id, then insert)."""
    event_ids = [uuid.uuid4().hex for _ in jobs] if as_events else []
    store = await Store.open(target, schema=schema)
    try:

        def request(index: int, job: JobRecord) -> asyncio.Future[bool]:
            if as_events:
                return store.apply_event_nowait(event_ids[index], "bench", [InsertJobs((job,))])
            return store.submit_nowait([InsertJobs((job,))])

        async def body() -> None:
            in_flight: deque[asyncio.Future[bool]] = deque()
            for index, job in enumerate(jobs):
                if len(in_flight) >= window and not await in_flight.popleft():
                    raise RuntimeError("a benchmark insert was not applied")
                in_flight.append(request(index, job))
            for future in in_flight:
                if not await future:
                    raise RuntimeError("a benchmark insert was not applied")

        mode = f"{'apply_event' if as_events else 'batched'}, {window} in flight"
        return await _timed(store, backend, mode, len(jobs), body)
    finally:
        await store.close()


async def measure_callers(
    target: str, backend: str, jobs: Sequence[JobRecord], schema: str | None, callers: int
) -> Measurement:
    store = await Store.open(target, schema=schema)
    try:

        async def caller(share: Sequence[JobRecord]) -> None:
            for job in share:
                await store.add_jobs([job])

        async def body() -> None:
            await asyncio.gather(*(caller(jobs[i::callers]) for i in range(callers)))

        return await _timed(store, backend, f"batched, {callers} callers", len(jobs), body)
    finally:
        await store.close()


@contextlib.contextmanager
def frozen_inputs() -> Iterator[None]:
    """Move the pre-built input jobs out of the garbage collector's reach while measuring.

    The harness builds every job up front (so that spec validation is not timed); without this,
    each collection during the run would also traverse those hundreds of thousands of input
    objects, a cost of the harness, not of the store. The store's own allocations are collected
    as usual.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


async def run_backend(
    target: str, backend: str, args: argparse.Namespace, schema: str | None = None
) -> list[Measurement]:
    results: list[Measurement] = []
    specs: list[JobSpec] = args.specs
    jobs = make_jobs(specs, args.single_rows)
    with frozen_inputs():
        results.append(await measure_single(target, backend, jobs, schema))
    jobs = make_jobs(specs, args.rows)
    with frozen_inputs():
        results.append(await measure_pipelined(target, backend, jobs, schema, args.window))
    jobs = make_jobs(specs, args.rows)
    with frozen_inputs():
        results.append(await measure_callers(target, backend, jobs, schema, args.callers))
    jobs = make_jobs(specs, args.rows)
    with frozen_inputs():
        results.append(await measure_pipelined(target, backend, jobs, schema, args.window, as_events=True))
    return results


async def _postgres_reachable(url: str) -> str | None:
    """None when ``url`` accepts connections, else the reason it does not."""
    engine = create_async_engine(resolve_target(url), connect_args={"timeout": 2})
    try:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
    except (OSError, TimeoutError, SQLAlchemyError) as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        await engine.dispose()
    return None


async def _drop_schema(url: str, schema: str) -> None:
    engine = create_async_engine(resolve_target(url))
    try:
        async with engine.begin() as conn:
            await conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    finally:
        await engine.dispose()


def report(results: Sequence[Measurement]) -> str:
    lines = [
        f"{'backend':<11}{'mode':<31}{'rows':>8}{'seconds':>9}{'cpu s':>7}{'txns':>7}{'rows/s':>11}"
        f"{'vs single':>11}{'rows/cpu-s':>12}"
    ]
    baseline: dict[str, float] = {}
    for m in results:
        if m.mode == "single-row commits":
            baseline[m.backend] = m.rows_per_s
        ratio = m.rows_per_s / baseline[m.backend] if m.backend in baseline else float("nan")
        lines.append(
            f"{m.backend:<11}{m.mode:<31}{m.rows:>8}{m.seconds:>9.2f}{m.cpu_seconds:>7.2f}{m.transactions:>7}"
            f"{m.rows_per_s:>11,.0f}{ratio:>10.1f}x{m.rows / m.cpu_seconds if m.cpu_seconds else 0:>12,.0f}"
        )
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> list[Measurement]:
    results: list[Measurement] = []
    with tempfile.TemporaryDirectory(prefix="rh-store-bench-") as data_dir:
        results += await run_backend(data_dir, "sqlite", args)
    if not args.no_postgres:
        reason = await _postgres_reachable(args.postgres)
        if reason is not None:
            print(f"postgres: skipped, {args.postgres} is not reachable ({reason})")
        else:
            schema = f"rh_bench_{uuid.uuid4().hex[:10]}"
            try:
                results += await run_backend(args.postgres, "postgresql", args, schema)
            finally:
                await _drop_schema(args.postgres, schema)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=40_000, help="jobs per batched measurement")
    parser.add_argument("--single-rows", type=int, default=1_000, help="jobs for the single-row baseline")
    parser.add_argument("--window", type=int, default=10_000, help="requests in flight, open-loop producer")
    parser.add_argument("--callers", type=int, default=1_000, help="concurrent awaiting callers (closed loop)")
    parser.add_argument("--postgres", default=DEFAULT_POSTGRES, help="PostgreSQL URL to measure too")
    parser.add_argument("--no-postgres", action="store_true", help="measure SQLite only")
    args = parser.parse_args(argv)
    args.specs = make_specs(args.rows)
    results = asyncio.run(run(args))
    print(report(results))
    target_mode = f"batched, {args.window} in flight"
    measured = next(m.rows_per_s for m in results if m.backend == "sqlite" and m.mode == target_mode)
    verdict = "meets" if measured >= TARGET_SQLITE_ROWS_PER_S else "MISSES"
    print(
        f"sqlite {target_mode}: {measured:,.0f} rows/s {verdict} the target of {TARGET_SQLITE_ROWS_PER_S:,.0f} rows/s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
