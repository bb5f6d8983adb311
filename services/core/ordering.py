"""Incrementally maintained rankings for sort-keyed scheduling policies (``SortKeyPolicy``).

A policy such as FIFO or LAS ranks jobs by a key that, for a waiting job, changes only when the job's
own state changes. Re-sorting 10^5 waiting jobs every round is the dominant cost of a naive
scheduler loop, so the owner of the state keeps a ``KeyedOrder`` instead:

* waiting jobs live in a binary heap (O(log n) per arrival, start or suspension); a round reads it
  in sorted order *without popping it* (a frontier walk over heap indices: O(k log k) for the first
  k jobs), so a placement that stops after a few jobs pays for those few. While the queue is short
  (``SORTED_LIMIT``) the same list is kept fully sorted instead (a sorted list is a heap, so the
  switch to heap mode costs nothing): an insertion is a bisection plus a short memmove, a round reads
  it front to back, and the started jobs at its front leave in one slice deletion, which is several
  times cheaper per job than the frontier walk and the heap pops (the usual LAS simulation holds a
  few hundred waiting jobs);
* running jobs: keys of running jobs may change with time (LAS: attained service grows). If the
  policy splits its key around attained service (``key_parts``) and the owner says how service
  grows (``service_line``: service = a + gpus x now once productive), running jobs are kept in
  groups of equal (key head, GPU count) sorted by ``a``, an order that time does not change; the
  lowest-ranked running jobs (preemption victims) are then found in O(groups) per victim without
  touching the others. Otherwise running jobs are re-keyed and sorted when first needed in a round.

The lazy ``Ranking`` it returns carries ``running``/``waiting`` views and a ``key`` function, which
``services.core.placing.place_in_order`` uses to walk waiting jobs upwards and victims downwards.
The order is ``sorted(jobs, key=policy.sort_key)``; tests compare both.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, overload

from services.core.decisions import Ranking
from services.core.protocols import SortKeyPolicy, is_preemptive
from services.core.state import JobState

Key = tuple[Any, ...]
SORTED_LIMIT = 1024
"""Waiting entries (alive or stale) up to which ``KeyedOrder`` keeps them in a sorted list rather than a
heap; it goes back to the sorted list when the heap shrinks below a quarter of this."""
ServiceLine = Callable[[JobState], tuple[float, float]]
"""``service_line(job) -> (a, productive_from)``: for ``now >= productive_from`` the running job's
attained service is ``a + len(job.gpus) * now`` (owners that know how service evolves)."""


class KeyedOrder:
    """The ranking of a ``SortKeyPolicy``, maintained as jobs arrive, start, stop and finish.

    The owner calls ``push`` when a job becomes waiting (admitted or suspended), ``mark_running``
    when it starts, ``discard`` when it leaves (finished, cancelled), then ``ranking`` once per round.
    """

    __slots__ = (
        "_expiry",
        "_expiry_fifo",
        "_fifo_last",
        "_groups",
        "_heap",
        "_line",
        "_parts",
        "_pending",
        "_policy",
        "_preempt",
        "_running",
        "_sorted",
        "_stale",
        "_waiting",
        "_where",
    )

    def __init__(self, policy: SortKeyPolicy, *, service_line: ServiceLine | None = None) -> None:
        self._policy = policy
        self._preempt = is_preemptive(policy)
        self._heap: list[list[Any]] = []
        self._waiting: dict[str, list[Any]] = {}
        self._running: dict[str, JobState] = {}
        self._expiry: list[tuple[float, int, str, list[Any]]] = []
        self._expiry_fifo: deque[tuple[float, str, list[Any]]] = deque()
        """Expiries pushed in non-decreasing time (LAS: ``queued_since + limit``, with
        ``queued_since == now``), which is the usual case: a queue, O(1) per job, instead of a heap
        of every waiting spell's expiry (tens of thousands, mostly stale)."""
        self._fifo_last = -math.inf
        self._stale = 0
        self._sorted = True
        """Whether ``_heap`` is in sorted-list mode (see the module docstring)."""
        parts = getattr(policy, "key_parts", None)
        grouped = service_line is not None and callable(parts)
        self._parts: Callable[[JobState], tuple[Key, Key]] | None = parts if grouped else None
        self._line = service_line if grouped else None
        self._groups: dict[tuple[Key, int], list[tuple[float, Key, str]]] = {}
        self._where: dict[str, tuple[tuple[Key, int], tuple[float, Key, str]]] = {}
        self._pending: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._waiting) + len(self._running)

    @property
    def waiting_count(self) -> int:
        return len(self._waiting)

    @property
    def running_count(self) -> int:
        return len(self._running)

    def push(self, job: JobState, now: float) -> None:
        """``job`` is (again) waiting: (re)compute its key."""
        job_id = job.job_id
        if job_id in self._running:
            self._unrun(job_id)
        waiting = self._waiting
        entry = waiting.pop(job_id, None)
        if entry is not None:
            entry[2] = False
            self._stale += 1
        policy = self._policy
        # [key, job_id, alive]: lists compare in C, element by element, and keys are total, so
        # job_id and alive never take part in a comparison; alive is cleared instead of removing
        # the entry from the heap.
        entry = [policy.sort_key(job, now), job_id, True]
        waiting[job_id] = entry
        heap = self._heap
        if self._sorted:
            insort(heap, entry)
            if len(heap) > SORTED_LIMIT:
                self._sorted = False  # a sorted list is already a heap
        else:
            heapq.heappush(heap, entry)
        until = policy.key_stable_until(job, now)
        if until != math.inf:
            if until >= self._fifo_last:
                self._fifo_last = until
                self._expiry_fifo.append((until, job_id, entry))
            else:
                heapq.heappush(self._expiry, (until, job.seq, job_id, entry))

    def mark_running(self, job: JobState) -> None:
        """``job`` now holds GPUs (call after its GPUs and progress line are set)."""
        job_id = job.job_id
        entry = self._waiting.pop(job_id, None)
        if entry is not None:
            entry[2] = False
            self._stale += 1
        running = self._running
        if job_id in running:
            self._unrun(job_id)
        running[job_id] = job
        parts = self._parts
        line = self._line
        if parts is not None and line is not None:
            head, tail = parts(job)
            a, productive_from = line(job)
            group = (head, len(job.gpus))
            item = (a, tail, job_id)
            groups = self._groups
            members = groups.get(group)
            if members is None:
                groups[group] = [item]
            else:
                insort(members, item)
            self._where[job_id] = (group, item)
            self._pending[job_id] = productive_from

    def discard(self, job_id: str) -> None:
        """``job_id`` left the system (finished, failed, cancelled)."""
        self._unrun(job_id)
        self._kill(job_id)

    def _unrun(self, job_id: str) -> None:
        if self._running.pop(job_id, None) is None:
            return
        where = self._where.pop(job_id, None)
        if where is not None:
            group, item = where
            members = self._groups[group]
            if members[-1] is item:  # a preemption victim: the group's lowest-ranked job
                members.pop()
            else:
                del members[bisect_left(members, item)]
            if not members:
                del self._groups[group]
            self._pending.pop(job_id, None)

    def _kill(self, job_id: str) -> None:
        entry = self._waiting.pop(job_id, None)
        if entry is not None:
            entry[2] = False
            self._stale += 1

    def _tidy(self, jobs: Mapping[str, JobState], now: float) -> None:
        # Due expiries re-key their jobs; the order in which they are processed does not matter
        # (each new key depends on its own job and ``now`` only).
        fifo = self._expiry_fifo
        while fifo and fifo[0][0] <= now:
            _, job_id, entry = fifo.popleft()
            if entry[2] and self._waiting.get(job_id) is entry:
                self.push(jobs[job_id], now)
        expiry = self._expiry
        while expiry and expiry[0][0] <= now:
            _, _, job_id, entry = heapq.heappop(expiry)
            if entry[2] and self._waiting.get(job_id) is entry:
                self.push(jobs[job_id], now)
        heap = self._heap
        if self._sorted:
            dead = 0  # the started jobs, at the front: one slice deletion
            for entry in heap:
                if entry[2]:
                    break
                dead += 1
            if dead:
                del heap[:dead]
                self._stale -= dead
        else:
            while heap and not heap[0][2]:
                heapq.heappop(heap)
                self._stale -= 1
        if self._stale > 64 and self._stale > len(self._waiting):
            self._heap = [e for e in heap if e[2]]  # (filtering keeps a sorted list sorted)
            if not self._sorted:
                heapq.heapify(self._heap)
            self._stale = 0
        if not self._sorted and len(self._heap) < SORTED_LIMIT // 4:
            self._heap.sort()
            self._sorted = True
        if self._pending:
            for job_id in [j for j, t in self._pending.items() if t <= now]:
                del self._pending[job_id]

    def ranking(self, jobs: Mapping[str, JobState], now: float) -> Ranking:
        """This round's ranking as lazy views (valid until the next mutation of this object)."""
        self._tidy(jobs, now)
        running = _RunningView(self, now)
        waiting = _WaitingView(self._heap, len(self._waiting), is_sorted=self._sorted)
        order = _MergedView(running, waiting)
        waiting_keys = self._waiting

        def key(job_id: str) -> Key:
            entry = waiting_keys.get(job_id)
            if entry is not None:
                key: Key = entry[0]
                return key
            return running.key(job_id)

        return Ranking(order=order, preempt=self._preempt, running=running, waiting=waiting, key=key)


class _LazySequence(Sequence[str]):
    """A Sequence whose items come from ``_pairs``; random access materializes it once."""

    _cache: list[str] | None = None

    def _pairs(self) -> Iterator[tuple[Key, str]]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[str]:
        if self._cache is not None:
            return iter(self._cache)
        return (job_id for _, job_id in self._pairs())

    def _materialize(self) -> list[str]:
        if self._cache is None:
            self._cache = [job_id for _, job_id in self._pairs()]
        return self._cache

    def keyed_items(self) -> Iterator[tuple[Key, str]]:
        """``(sort key, job id)`` in order, lazily (placement reads keys without a ``key()`` call)."""
        return self._pairs()

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...
    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        return self._materialize()[index]

    def __contains__(self, value: object) -> bool:
        return value in self._materialize()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._materialize()!r})"


class _RunningView(_LazySequence):
    """Running jobs in rank order; ``reversed()`` yields the lowest-ranked first, lazily."""

    def __init__(self, order: KeyedOrder, now: float) -> None:
        self._order = order
        self._now = now
        self._keys: dict[str, Key] = {}
        self._sorted: list[tuple[Key, str]] | None = None

    def key(self, job_id: str) -> Key:
        key = self._keys.get(job_id)
        if key is None:
            key = self._order._policy.sort_key(self._order._running[job_id], self._now)
            self._keys[job_id] = key
        return key

    def sorted_pairs(self) -> list[tuple[Key, str]]:
        if self._sorted is None:
            self._sorted = sorted((self.key(job_id), job_id) for job_id in self._order._running)
        return self._sorted

    def _pairs(self) -> Iterator[tuple[Key, str]]:
        return iter(self.sorted_pairs())

    def __len__(self) -> int:
        return len(self._order._running)

    def __reversed__(self) -> Iterator[str]:
        order = self._order
        if order._parts is None or self._sorted is not None:
            return (job_id for _, job_id in reversed(self.sorted_pairs()))
        return self._lowest_first()

    def keyed_reversed(self) -> Iterator[tuple[Key, str]]:
        """``(sort key, job id)``, lowest-ranked first, lazily."""
        order = self._order
        if order._parts is None or self._sorted is not None:
            return reversed(self.sorted_pairs())
        groups = order._groups
        if len(groups) == 1 and not order._pending:
            return self._one_group()
        key = self.key
        return ((key(job_id), job_id) for job_id in self._lowest_first())

    def _one_group(self) -> Iterator[tuple[Key, str]]:
        """``keyed_reversed`` when every running job is in one group and productive: its order.

        The keys come from the group itself: ``key_parts`` promises ``sort_key == (*head, service,
        *tail)`` and ``service_line`` that a productive job's service is ``a + gpus x now``, so this
        is the very tuple ``sort_key`` returns, without asking the policy for every victim."""
        now = self._now
        keys = self._keys
        for (head, gpus), members in self._order._groups.items():
            for a, tail, job_id in reversed(members):
                key = keys.get(job_id)
                if key is None:
                    key = keys[job_id] = (*head, a + gpus * now, *tail)
                yield key, job_id

    def _lowest_first(self) -> Iterator[str]:
        """Merge the groups from their tops (largest ``a``) and the not-yet-productive jobs."""
        order = self._order
        groups = order._groups
        if len(groups) == 1 and not order._pending:  # one group (e.g. all one-GPU jobs): its order
            for members in groups.values():
                for item in reversed(members):
                    yield item[2]
            return
        key = self.key
        candidates: list[tuple[Key, int, str]] = []  # max-heap through negation of the index
        pointers: dict[int, tuple[list[tuple[float, Key, str]], int]] = {}
        for n, members in enumerate(order._groups.values()):
            index = len(members) - 1
            while index >= 0 and members[index][2] in order._pending:
                index -= 1
            if index >= 0:
                pointers[n] = (members, index)
                candidates.append((key(members[index][2]), n, members[index][2]))
        pending = sorted(((key(j), j) for j in order._pending), reverse=True)
        position = 0
        while candidates or position < len(pending):
            best = max(candidates) if candidates else None
            if position < len(pending) and (best is None or pending[position][0] > best[0]):
                yield pending[position][1]
                position += 1
                continue
            assert best is not None
            candidates.remove(best)
            _, n, job_id = best
            yield job_id
            members, index = pointers[n]
            index -= 1
            while index >= 0 and members[index][2] in order._pending:
                index -= 1
            if index >= 0:
                pointers[n] = (members, index)
                candidates.append((key(members[index][2]), n, members[index][2]))


class _WaitingView(_LazySequence):
    """Waiting jobs in key order, read from the heap (or sorted list) without popping it."""

    def __init__(self, heap: list[list[Any]], count: int, *, is_sorted: bool = False) -> None:
        self._heap = heap
        self._count = count
        self._is_sorted = is_sorted

    def _pairs(self) -> Iterator[tuple[Key, str]]:
        if self._is_sorted:
            return ((entry[0], entry[1]) for entry in self._heap if entry[2])
        return self._heap_pairs()

    def _heap_pairs(self) -> Iterator[tuple[Key, str]]:
        # The frontier holds (key, heap index): keys are total, so comparing them is enough (cheaper
        # than comparing the heap's [key, id, alive] lists); the root needs no frontier at all.
        heap = self._heap
        n = len(heap)
        if not n:
            return
        entry = heap[0]
        if entry[2]:
            yield entry[0], entry[1]
        if n == 1:
            return
        frontier: list[tuple[Key, int]] = [(heap[1][0], 1)]
        if n > 2:
            heapq.heappush(frontier, (heap[2][0], 2))
        push = heapq.heappush
        pop = heapq.heappop
        while frontier:
            key, i = pop(frontier)
            entry = heap[i]
            if entry[2]:
                yield key, entry[1]
            left = 2 * i + 1
            if left < n:
                push(frontier, (heap[left][0], left))
                if left + 1 < n:
                    push(frontier, (heap[left + 1][0], left + 1))

    def __len__(self) -> int:
        return self._count


class _MergedView(_LazySequence):
    """The full order: running and waiting jobs merged by key."""

    def __init__(self, running: _RunningView, waiting: _WaitingView) -> None:
        self._running = running
        self._waiting = waiting

    def _pairs(self) -> Iterator[tuple[Key, str]]:
        if not len(self._running):
            return self._waiting._pairs()
        return heapq.merge(self._running.sorted_pairs(), self._waiting._pairs())

    def __len__(self) -> int:
        return len(self._running) + len(self._waiting)
