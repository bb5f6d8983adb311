"""The submission SDK: submit jobs, list them, cancel them, over NATS.

    async with await Client.connect("nats://127.0.0.1:4222") as client:
        verdict = await client.submit(JobSpec(name="mnist", command=["python", "train.py"], gpus=2))

A submission is a ``JobArrived`` event on the durable ``job.arrived`` subject; the job id is chosen
here, so a retried submission is recognised, and ``submit`` waits (optionally) for admission's
verdict on ``job.accepted`` / ``job.held`` / ``job.rejected``.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from nats.aio.subscription import Subscription
from nats.errors import NoServersError

from schemas.control import JobsQuery, JobsReply
from schemas.job import JobSpec
from schemas.jobs import JobAccepted, JobArrived, JobCancel, JobHeld, JobRejected
from schemas.subjects import JOB_ARRIVED, JOB_CANCEL, QUERY_JOBS
from services.runtime.auth.creds import Credentials
from services.runtime.bus import Bus, BusOptions, NoResponderError

__all__ = ["CONNECT_ATTEMPTS", "Client", "NoVerdictError", "Verdict"]

CONNECT_ATTEMPTS = 3
"""Tries per server before ``Client.connect`` gives up (and, once connected, per reconnection)."""
_LEADER_POLL_S = 0.2
"""How often ``Client.jobs`` asks again while no scheduler leads."""


class NoVerdictError(TimeoutError):
    """Admission did not answer in time (is the admission service running?)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    job_id: str
    outcome: str
    """accepted, held or rejected"""
    reason: str | None = None


def new_job_id(spec: JobSpec) -> str:
    """``<name prefix>-<12 hex>``: readable in listings, unique, and a valid subject token."""
    prefix = "".join(c if c.isalnum() or c in "-_" else "-" for c in spec.name)[:40].strip("-_") or "job"
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def default_identity() -> str:
    """Who this process acts as without credentials: ``$ROUNDHOUSE_USER``, else the login name.

    Without credentials nothing vouches for it; with them (``--creds``) the broker does, and the
    credentials' identity is used instead."""
    return os.environ.get("ROUNDHOUSE_USER") or getpass.getuser()


class Client:
    def __init__(self, bus: Bus, *, identity: str | None = None, authenticated: bool = False) -> None:
        self.bus = bus
        self.identity = identity or default_identity()
        """The user (or operator) this client acts as: the last token of its submissions, cancels
        and queries (``job.arrived.<identity>``)."""
        self.authenticated = authenticated
        """True when the broker vouches for :attr:`identity` (credentials were given)."""

    @classmethod
    async def connect(
        cls,
        nats: str,
        *,
        namespace: str = "",
        name: str = "roundhouse-client",
        attempts: int = CONNECT_ATTEMPTS,
        creds: Path | Credentials | None = None,
    ) -> Client:
        """Connect to the Roundhouse at ``nats``; ``ConnectionRefusedError`` (an ``OSError``) when
        no server answers after ``attempts`` tries each. A long-lived program that should ride out a
        broker restart passes ``attempts=-1`` (retry forever, as the services do).

        With ``creds`` (a credentials file, or what one holds) the client is that identity, vouched for by the broker:
        it submits, cancels and asks only as it (:attr:`authenticated`). A secured broker refuses a
        client without credentials (``AuthenticationError``, a ``ConnectionError``)."""
        # A few tries, not forever: a command against a stopped cluster must say so, not hang. A
        # command never provisions the stream (the services do, with the operator's replicas).
        options = BusOptions(namespace=namespace, max_reconnect_attempts=attempts)
        servers = [url.strip() for url in nats.split(",") if url.strip()]
        try:
            bus = await Bus.connect(servers, name=name, options=options, provision=False, creds=creds)
        except NoServersError:
            hint = "is Roundhouse running? `roundhouse up`"
            raise ConnectionRefusedError(f"nothing answers at {nats} ({hint})") from None
        return cls(bus, identity=bus.identity, authenticated=bus.credentials is not None)

    async def close(self) -> None:
        await self.bus.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def submit(
        self, spec: JobSpec, *, job_id: str | None = None, wait: bool = True, timeout_s: float = 10.0
    ) -> Verdict:
        """Publish the job; with ``wait``, return admission's verdict (raise NoVerdictError on time-out)."""
        job_id = job_id or new_job_id(spec)
        spec = self._owned(spec)
        verdicts = await self._watch_verdicts({job_id}) if wait else None
        try:
            await self.bus.publish(JOB_ARRIVED, JobArrived(job_id=job_id, spec=spec))
            if verdicts is None:
                return Verdict(job_id, "submitted")
            queue = verdicts[0]
            try:
                return await asyncio.wait_for(queue.get(), timeout_s)
            except TimeoutError:
                raise NoVerdictError(
                    f"no verdict for {job_id} within {timeout_s:.0f} s; is the admission service running?"
                ) from None
        finally:
            if verdicts is not None:
                for sub in verdicts[1]:
                    await sub.unsubscribe()

    def _owned(self, spec: JobSpec) -> JobSpec:
        """``spec`` submitted as this client's identity: the user is who the broker authenticated."""
        if "user" not in spec.model_fields_set:
            return spec.model_copy(update={"user": self.identity})
        if self.authenticated and spec.user != self.identity:
            raise PermissionError(
                f"permission denied: you are authenticated as {self.identity}; you cannot submit as {spec.user}"
            )
        return spec

    async def _watch_verdicts(self, job_ids: set[str]) -> tuple[asyncio.Queue[Verdict], list[Subscription]]:
        # Subscribing before publishing means no verdict can slip past (lifecycle events published
        # to JetStream are also delivered to plain subscribers).
        queue: asyncio.Queue[Verdict] = asyncio.Queue()

        async def accepted(event: JobAccepted) -> None:
            if event.job_id in job_ids:
                queue.put_nowait(Verdict(event.job_id, "accepted", event.reason))

        async def held(event: JobHeld) -> None:
            if event.job_id in job_ids:
                queue.put_nowait(Verdict(event.job_id, "held", event.reason))

        async def rejected(event: JobRejected) -> None:
            if event.job_id in job_ids:
                queue.put_nowait(Verdict(event.job_id, "rejected", event.reason))

        subs: list[Subscription] = [
            await self.bus.subscribe("job.accepted", JobAccepted, accepted),
            await self.bus.subscribe("job.held", JobHeld, held),
            await self.bus.subscribe("job.rejected", JobRejected, rejected),
        ]
        await self.bus.nc.flush()
        return queue, subs

    async def jobs(self, query: JobsQuery | None = None, *, timeout_s: float = 5.0) -> JobsReply:
        """The scheduler leader's view of jobs (unfinished ones by default).

        Only the leader serves ``query.jobs``, so during an election (a scheduler starting, as just
        after ``roundhouse up``, or taking over) nothing does for a moment: the query is asked again
        until ``timeout_s`` has passed, then ``NoResponderError`` says that no scheduler leads."""
        query = (query or JobsQuery(requester=self.identity)).model_copy(update={"requester": self.identity})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            left = deadline - loop.time()
            try:
                return await self.bus.request(QUERY_JOBS, query, JobsReply, timeout_s=max(left, 0.1))
            except NoResponderError:
                if loop.time() + _LEADER_POLL_S >= deadline:
                    raise
            await asyncio.sleep(_LEADER_POLL_S)

    async def cancel(self, job_id: str, *, reason: str | None = None) -> None:
        """Ask the scheduler to stop ``job_id``, as this client's identity (the job's owner or an operator)."""
        fields: dict[str, object] = {"job_id": job_id, "user": self.identity}
        if reason:
            fields["reason"] = reason
        await self.bus.publish(JOB_CANCEL, JobCancel.model_validate(fields))

