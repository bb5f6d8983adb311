"""``gandiva``: affinity placement, suspend-resume time-slicing, packing, defragmenting migration and
grow-shrink (Xiao et al., OSDI '18; seed 001, "Scheduling Policy").

Gandiva gives every new job GPUs at once, oversubscribing servers if it must, and time-slices an
oversubscribed server; its introspective mode then packs, migrates and grows jobs. Each round here:

1. **Homes (reactive mode, Algorithm 1).** Every job has a *home*: the GPUs it runs on when it
   runs. Running jobs' homes are the GPUs they hold (a grown job's home is its base allocation);
   other jobs keep the home given earlier. A job without one (in ranking order) gets one, trying
   in turn: (a) a server whose *affinity* (the GPU count of the jobs homed there; 0 when it has
   none) equals the job's GPU count and with enough unhomed GPUs, least loaded (lowest height)
   first; (b) an unaffinitized server with room (it takes the job's affinity); (c) any server with
   room (another affinity: fragmentation that migration cleans up); (d) unhomed GPUs across servers
   (the fragmented allocation of Algorithm 1's last lines); (e) oversubscription: the server of the
   same affinity (else any server large enough) with the lowest *height* ``ceil(M / N)`` (``M``
   GPUs homed, ``N`` GPUs), if that stays within ``max_height``, on its least-shared GPUs. A job
   that gets none waits. Jobs wider than a server use (d), else (e) across servers: whole servers
   of the lowest height first, each within ``max_height`` (before this they used (d) only, so under
   overload a freed GPU always went to a narrower job and wide jobs starved: in a simulated burst
   at twice the capacity 8-GPU jobs waited ~47 h for their first feedback). A *waiting* job whose home shares
   a GPU with another home (it is being time-sliced) is re-homed by (a)-(d), never (e), as soon as
   unhomed GPUs can take it: suspend-resume is "only used when the height of a server exceeds one",
   and a job that cannot run where it is "will be migrated to another server, if feasible". Without
   this a job homed while the cluster was full kept waiting for its shared GPU after others had
   become free (found in the simulator: GPUs idle in most rounds of an overload run).
2. **Migration for defragmentation.** While some non-idle server has at least ``defrag_threshold``
   unhomed GPUs, take the one with the most, and move all its jobs to other servers with fewer
   unhomed GPUs that can take them without oversubscription (best fit); if not all can move,
   leave it and try the next. Targets must have the job's affinity (so defragmenting keeps servers
   homogeneous). Moving a running job is a migration (suspend + launch elsewhere).
2b. **Migration for locality** (``locality=True``; off by default). Gandiva also migrates "to
   improve locality": it picks jobs "that are not co-located and tr[ies] to find a new co-located
   placement" (seed 001, "Migration"). A job homed on more servers than it needs
   (``ceil(gpus / largest server)``; so a job that fits one server and was spread by (d)) is re-homed
   on one server with enough unhomed GPUs (its own GPUs there count as free for it), same affinity
   first, then an empty server, then any, best fit; a running job moves (suspend + launch there).
   Jobs in ranking order; a job wider than a server is not consolidated.
3. **Time-slicing (suspend-resume).** Walking the ranking (pair with ``rr``: Gandiva time-shares
   "round robin in each server"), a job runs on its home if no higher-ranked job claimed any of
   those GPUs, so a server with height > 1 rotates its jobs and a server with height 1 runs all.
4. **Packing.** With ``profiles`` (per model: ``gpu_util`` in [0, 1] and ``gpu_mem_mb``), a job
   whose home GPUs are claimed may still run *on the same GPUs* if every GPU then holds at most two
   jobs whose utilizations sum to at most 1 and whose memory fits the GPU's ``memory_mb`` (paging
   from host memory makes packing ineffective). Lower-utilization jobs are packed first (the
   ranking decides among equals). Packing is kept only while it beats time-slicing: once both
   jobs of a pair have a solo and a packed iteration time, the pair stays packed only if
   ``sum(solo / packed) > 1`` (time-slicing yields at most 1); a pair that fails is never packed
   again. Solo iteration times come from ``profiles`` (``solo_iteration_s``) or are remembered
   from rounds in which the job ran alone.
5. **Grow-shrink.** A running elastic job (``spec.max_gpus``) grows onto GPUs of its own server
   that have had no home and no job for ``grow_after_s`` (Gandiva grows "only after an idle
   period"), up to ``max_gpus``; it keeps extra GPUs only while no other job needs them, so it
   shrinks as soon as a new job is homed there. Growing or shrinking relaunches the job.

Choices where the summary is silent: the order (a)-(e); ``max_height`` (default 4); the threshold
is an absolute number of free GPUs (the paper's "3 out of 4"); a mixed server (jobs of several GPU
counts) has no affinity and matches no job in (a); the ranking's ``preempt`` flag False keeps
running jobs (no time-slicing); ``Ranking.gpu_targets`` is ignored (grow-shrink is decided here).

State: homes, remembered solo iteration times, pairs that failed packing and GPU idle times live
in the policy object between rounds (Gandiva's introspection is history: "refine its scheduling
decision continuously"). Inputs are never mutated and the same calls give the same decisions; a
new object rebuilds homes from running jobs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from services.core.decisions import Placement, Plan, Ranking
from services.core.registry import PLACEMENT
from services.core.state import ClusterState, JobState


class _Profile:
    __slots__ = ("gpu_mem_mb", "gpu_util", "solo_iteration_s")

    def __init__(self, model: str, raw: Mapping[str, Any]) -> None:
        unknown = set(raw) - {"gpu_util", "gpu_mem_mb", "solo_iteration_s"}
        if unknown:
            raise ValueError(
                f"profile {model!r}: unknown keys {sorted(unknown)}; use gpu_util, gpu_mem_mb, solo_iteration_s"
            )
        self.gpu_util = float(raw.get("gpu_util", 1.0))
        self.gpu_mem_mb = float(raw.get("gpu_mem_mb", math.inf))
        solo = raw.get("solo_iteration_s")
        self.solo_iteration_s = None if solo is None else float(solo)
        if not 0 <= self.gpu_util <= 1 or not self.gpu_mem_mb > 0:
            raise ValueError(f"profile {model!r}: gpu_util must be in [0, 1] and gpu_mem_mb > 0")


@PLACEMENT.register("gandiva")
class Gandiva:
    """Affinity homes, oversubscription with time-slicing, packing, defragmentation, grow-shrink."""

    name: ClassVar[str] = "gandiva"

    def __init__(
        self,
        *,
        max_height: int = 4,
        defrag_threshold: int | None = 3,
        profiles: Mapping[str, Mapping[str, Any]] | None = None,
        grow_after_s: float | None = 300.0,
        locality: bool = False,
    ) -> None:
        if max_height < 1:
            raise ValueError(f"max_height must be >= 1 (1 disables oversubscription), got {max_height}")
        if defrag_threshold is not None and defrag_threshold < 1:
            raise ValueError(f"defrag_threshold must be >= 1 free GPUs or None, got {defrag_threshold}")
        if grow_after_s is not None and grow_after_s < 0:
            raise ValueError(f"grow_after_s must be >= 0 or None (no growing), got {grow_after_s}")
        self.max_height = max_height
        self.defrag_threshold = defrag_threshold
        self.profiles = {m: _Profile(m, p) for m, p in (profiles or {}).items()}
        self.grow_after_s = grow_after_s
        self.locality = locality
        self.consolidated = 0
        """Jobs re-homed onto fewer servers by locality migration so far (a count for reports)."""
        self._home: dict[str, tuple[int, ...]] = {}
        self._solo: dict[str, float] = {}
        self._bad_pairs: set[frozenset[str]] = set()
        self._idle_since: dict[int, float] = {}
        self.unpacked = 0
        """Packed pairs found losing to time-slicing so far (introspection; a count for reports)."""

    # --- introspection -----------------------------------------------------------------------
    @property
    def homes(self) -> Mapping[str, tuple[int, ...]]:
        return dict(self._home)

    @property
    def failed_pairs(self) -> set[frozenset[str]]:
        return set(self._bad_pairs)

    def place(self, ranking: Ranking, jobs: Mapping[str, JobState], cluster: ClusterState, now: float) -> Placement:
        terminate = ranking.terminate
        live = {j: job for j, job in jobs.items() if j not in terminate}
        self._observe(live, cluster)
        home = self._refresh_homes(live)
        shares = [0] * cluster.total_gpus
        for homed in home.values():
            for g in homed:
                shares[g] += 1
        unhomed = shares.count(0)
        failed: set[int] = set()  # GPU counts that got no home since homes last changed (same answer)
        for job_id in ranking.order:
            job = live.get(job_id)
            if job is None:
                continue
            old = home.get(job_id)
            if old is None:
                need = job.spec.gpus
                if need in failed:
                    continue  # under overload most waiting jobs fail: one attempt per size, not per job
                gpus = self._allocate(job, home, cluster)
                if gpus is None:
                    failed.add(need)
            elif (
                not job.is_running and unhomed >= len(old) and any(shares[g] > 1 for g in old)
            ):  # time-sliced while GPUs are free: move it there (a resume elsewhere costs no more)
                gpus = self._allocate(job, {j: h for j, h in home.items() if j != job_id}, cluster, oversubscribe=False)
            else:
                continue
            if gpus is None:
                continue
            for g in old or ():
                shares[g] -= 1
                unhomed += shares[g] == 0
            for g in gpus:
                unhomed -= shares[g] == 0
                shares[g] += 1
            home[job_id] = gpus
            failed.clear()
        if self.defrag_threshold is not None:
            self._defragment(home, live, cluster)
        if self.locality:
            self._consolidate(ranking, home, live, cluster)
        self._home = home
        runs = self._time_slice(ranking, live, home, cluster)
        self._grow(runs, live, home, cluster, now)
        launch = {j: g for j, g in runs.items() if tuple(sorted(g)) != tuple(sorted(live[j].gpus))}
        suspend = tuple(j for j, job in live.items() if job.is_running and (j not in runs or j in launch))
        return Placement(allocation=runs, plan=Plan(launch=launch, suspend=suspend, terminate=dict(terminate)))

    # --- 0: what the last round produced -----------------------------------------------------
    def _observe(self, live: Mapping[str, JobState], cluster: ClusterState) -> None:
        """Remember solo iteration times; drop packed pairs that do not beat time-slicing."""
        for gpu_jobs in {tuple(sorted(h)) for h in cluster.gpu_jobs if len(h) == 2}:
            a, b = (live.get(j) for j in gpu_jobs)
            if a is None or b is None:
                continue
            throughput = 0.0
            for job in (a, b):
                solo, packed = self._solo_time(job), job.iteration_time_s
                if solo is None or packed is None or packed <= 0:
                    break
                throughput += solo / packed
            else:
                if throughput <= 1.0 and frozenset(gpu_jobs) not in self._bad_pairs:  # time-slicing is no worse
                    self._bad_pairs.add(frozenset(gpu_jobs))
                    self.unpacked += 1
        for job_id, job in live.items():
            if (
                job.is_running
                and job.iteration_time_s is not None
                and all(cluster.gpu_jobs[g] == (job_id,) for g in job.gpus)
                and len(job.gpus) == job.spec.gpus
            ):
                self._solo[job_id] = job.iteration_time_s
        self._solo = {j: t for j, t in self._solo.items() if j in live}
        self._bad_pairs = {p for p in self._bad_pairs if all(j in live for j in p)}

    def _solo_time(self, job: JobState) -> float | None:
        own = self._solo.get(job.job_id)
        if own is not None:
            return own
        profile = self.profiles.get(job.spec.model or "")
        return profile.solo_iteration_s if profile is not None else None

    # --- 1: homes ----------------------------------------------------------------------------
    def _refresh_homes(self, live: Mapping[str, JobState]) -> dict[str, tuple[int, ...]]:
        home: dict[str, tuple[int, ...]] = {}
        for job_id, job in live.items():
            old = self._home.get(job_id)
            if job.is_running:
                held = tuple(sorted(job.gpus))
                if old is not None and set(old) <= set(held):
                    home[job_id] = old  # a grown job: its home is its base allocation
                else:
                    home[job_id] = held[: job.spec.gpus] if len(held) > job.spec.gpus else held
            elif old is not None:
                home[job_id] = old
        return home

    def _allocate(
        self,
        job: JobState,
        home: Mapping[str, tuple[int, ...]],
        cluster: ClusterState,
        *,
        oversubscribe: bool = True,
    ) -> tuple[int, ...] | None:
        need = job.spec.gpus
        view = _ServerView(home, cluster)
        servers = range(len(cluster.node_ids))
        if need <= cluster.largest_node_gpus:
            fits = [s for s in servers if len(view.free[s]) >= need]
            same = [s for s in fits if view.affinity(s) == need]
            if same:
                best = min(same, key=lambda s: (view.height(s), s))
                return view.take_free(best, need)
            empty = [s for s in fits if view.affinity(s) == 0]
            if empty:
                return view.take_free(empty[0], need)
            if fits:
                best = min(fits, key=lambda s: (len(view.free[s]), s))
                return view.take_free(best, need)
        spread = view.take_spread(need)
        if spread is not None or not oversubscribe:
            return spread
        if need > cluster.largest_node_gpus:
            return view.take_shared_across(need, self.max_height)
        big = [s for s in servers if len(view.gpus[s]) >= need]
        same_aff = [s for s in big if view.affinity(s) == need]
        pool = same_aff or big
        ok = [s for s in pool if view.height_with(s, need) <= self.max_height]
        if not ok:
            return None
        best = min(ok, key=lambda s: (view.height(s), s))
        return view.take_shared(best, need)

    # --- 2: defragmentation ------------------------------------------------------------------
    def _defragment(
        self, home: dict[str, tuple[int, ...]], live: Mapping[str, JobState], cluster: ClusterState
    ) -> None:
        threshold = self.defrag_threshold
        assert threshold is not None
        tried: set[int] = set()
        while True:
            view = _ServerView(home, cluster)
            sources = [
                s
                for s in range(len(cluster.node_ids))
                if s not in tried
                and view.jobs[s]
                and len(view.free[s]) >= threshold
                and len(view.free[s]) < len(view.gpus[s])
            ]
            if not sources:
                return
            source = min(sources, key=lambda s: (-len(view.free[s]), s))
            tried.add(source)
            movers = sorted(view.jobs[source], key=lambda j: (-len(home[j]), j))
            if any(len({cluster.node_position_of_gpu(g) for g in home[j]}) > 1 for j in movers):
                continue  # a job spanning servers is not moved
            trial = dict(home)
            for j in movers:
                del trial[j]
            moved: dict[str, tuple[int, ...]] = {}
            for j in movers:
                tview = _ServerView(trial, cluster)
                need = len(home[j])
                targets = [
                    s
                    for s in range(len(cluster.node_ids))
                    if s != source
                    and len(tview.free[s]) >= need
                    and len(tview.free[s]) < len(view.free[source])
                    and tview.affinity(s) == need
                ]
                if not targets:
                    break
                target = min(targets, key=lambda s: (len(tview.free[s]), s))
                moved[j] = tview.take_free(target, need)
                trial[j] = moved[j]
            else:
                home.update(moved)

    # --- 2b: locality -------------------------------------------------------------------------
    def _consolidate(
        self,
        ranking: Ranking,
        home: dict[str, tuple[int, ...]],
        live: Mapping[str, JobState],
        cluster: ClusterState,
    ) -> None:
        largest = cluster.largest_node_gpus
        for job_id in ranking.order:
            gpus = home.get(job_id)
            if gpus is None or job_id not in live or len(gpus) > largest:
                continue
            if cluster.nodes_spanned(gpus) <= 1:
                continue
            need = len(gpus)
            view = _ServerView({j: h for j, h in home.items() if j != job_id}, cluster)
            fits = [s for s in range(len(cluster.node_ids)) if len(view.free[s]) >= need]
            if not fits:
                continue
            same = [s for s in fits if view.affinity(s) == need]
            empty = [s for s in fits if view.affinity(s) == 0]
            pool = same or empty or fits
            target = min(pool, key=lambda s: (len(view.free[s]), s))
            mine = [g for g in view.free[target] if g in gpus]  # keep the GPUs it already has there
            rest = [g for g in sorted(view.free[target]) if g not in gpus]
            home[job_id] = tuple(sorted((mine + rest)[:need]))
            self.consolidated += 1

    # --- 3 + 4: time-slicing and packing -----------------------------------------------------
    def _time_slice(
        self,
        ranking: Ranking,
        live: Mapping[str, JobState],
        home: Mapping[str, tuple[int, ...]],
        cluster: ClusterState,
    ) -> dict[str, tuple[int, ...]]:
        on_gpu: dict[int, list[str]] = {}
        runs: dict[str, tuple[int, ...]] = {}

        def claim(job_id: str, gpus: tuple[int, ...]) -> None:
            runs[job_id] = gpus
            for g in gpus:
                on_gpu.setdefault(g, []).append(job_id)

        if not ranking.preempt:
            for job_id, job in live.items():
                if job.is_running:
                    claim(job_id, home[job_id])
        blocked: list[str] = []
        for job_id in ranking.order:
            gpus = home.get(job_id)
            if gpus is None or job_id in runs or job_id not in live:
                continue
            if any(g in on_gpu for g in gpus):
                blocked.append(job_id)
            else:
                claim(job_id, gpus)
        if self.profiles:
            for job_id in sorted(blocked, key=lambda j: self._util(live[j])):  # lowest utilization first
                gpus = home[job_id]
                if all(self._packable(job_id, on_gpu.get(g, []), g, live, cluster) for g in gpus):
                    claim(job_id, gpus)
        return runs

    def _util(self, job: JobState) -> float:
        profile = self.profiles.get(job.spec.model or "")
        return profile.gpu_util if profile is not None else 1.0

    def _packable(
        self, job_id: str, others: list[str], gpu: int, live: Mapping[str, JobState], cluster: ClusterState
    ) -> bool:
        if len(others) != 1 or frozenset((job_id, others[0])) in self._bad_pairs:
            return False
        pair = [live[job_id], live[others[0]]]
        profiles = [self.profiles.get(j.spec.model or "") for j in pair]
        if any(p is None for p in profiles):
            return False
        util = sum(p.gpu_util for p in profiles if p is not None)
        memory = sum(p.gpu_mem_mb for p in profiles if p is not None)
        return util <= 1.0 + 1e-9 and memory <= cluster.gpus[gpu].memory_mb

    # --- 5: grow-shrink ----------------------------------------------------------------------
    def _grow(
        self,
        runs: dict[str, tuple[int, ...]],
        live: Mapping[str, JobState],
        home: Mapping[str, tuple[int, ...]],
        cluster: ClusterState,
        now: float,
    ) -> None:
        homed = {g for gpus in home.values() for g in gpus}
        used = {g for gpus in runs.values() for g in gpus}
        for g in range(cluster.total_gpus):
            busy = g in homed or g in used or bool(cluster.gpu_jobs[g])
            if busy:
                self._idle_since.pop(g, None)
            else:
                self._idle_since.setdefault(g, now)
        if self.grow_after_s is None:
            return
        for job_id in sorted(runs):
            job = live[job_id]
            cap = job.spec.max_gpus
            gpus = runs[job_id]
            if cap is None or cap <= len(gpus) or job_id not in home:
                continue
            servers = {cluster.node_position_of_gpu(g) for g in gpus}
            if len(servers) != 1:
                continue
            node = cluster.node_ids[servers.pop()]
            taken = {g for other in runs.values() for g in other}
            kept = [g for g in job.gpus if g not in gpus and g not in homed and g not in taken]
            fresh = [
                g
                for g in cluster.nodes[node].gpu_ids
                if g not in taken
                and g not in homed
                and g not in kept
                and g not in job.gpus
                and now - self._idle_since.get(g, math.inf) >= self.grow_after_s
            ]
            extra = (kept + fresh)[: cap - len(gpus)]
            if extra:
                runs[job_id] = tuple(sorted((*gpus, *extra)))
                for g in extra:
                    self._idle_since.pop(g, None)


class _ServerView:
    """Homes grouped by server: unhomed GPUs, jobs, affinity and height (scratch, per call)."""

    def __init__(self, home: Mapping[str, tuple[int, ...]], cluster: ClusterState) -> None:
        n = len(cluster.node_ids)
        self.gpus: list[tuple[int, ...]] = [cluster.nodes[node].gpu_ids for node in cluster.node_ids]
        self.shares = [0] * cluster.total_gpus
        self.jobs: list[set[str]] = [set() for _ in range(n)]
        self.sizes: list[set[int]] = [set() for _ in range(n)]
        for job_id, gpus in home.items():
            for g in gpus:
                self.shares[g] += 1
            for s in {cluster.node_position_of_gpu(g) for g in gpus}:
                self.jobs[s].add(job_id)
                self.sizes[s].add(len(gpus))
        self.free: list[list[int]] = [[g for g in self.gpus[s] if self.shares[g] == 0] for s in range(n)]

    def affinity(self, server: int) -> int:
        sizes = self.sizes[server]
        if not sizes:
            return 0
        return next(iter(sizes)) if len(sizes) == 1 else -1

    def height(self, server: int) -> int:
        allocated = sum(self.shares[g] for g in self.gpus[server])
        return math.ceil(allocated / len(self.gpus[server]))

    def height_with(self, server: int, need: int) -> int:
        allocated = sum(self.shares[g] for g in self.gpus[server]) + need
        return math.ceil(allocated / len(self.gpus[server]))

    def take_free(self, server: int, need: int) -> tuple[int, ...]:
        return tuple(sorted(self.free[server])[:need])

    def take_spread(self, need: int) -> tuple[int, ...] | None:
        if sum(len(f) for f in self.free) < need:
            return None
        chosen: list[int] = []
        for s in sorted(range(len(self.free)), key=lambda s: (-len(self.free[s]), s)):
            chosen.extend(sorted(self.free[s])[: need - len(chosen)])
            if len(chosen) == need:
                break
        return tuple(sorted(chosen))

    def take_shared_across(self, need: int, max_height: int) -> tuple[int, ...] | None:
        """``need`` GPUs over several servers, lowest height first, each staying within ``max_height``."""
        chosen: list[int] = []
        for s in sorted(range(len(self.gpus)), key=lambda s: (self.height(s), s)):
            take = min(need - len(chosen), len(self.gpus[s]))
            if self.height_with(s, take) <= max_height:
                chosen.extend(self.take_shared(s, take))
            if len(chosen) == need:
                return tuple(sorted(chosen))
        return None

    def take_shared(self, server: int, need: int) -> tuple[int, ...]:
        ranked: Iterable[int] = sorted(self.gpus[server], key=lambda g: (self.shares[g], g))
        return tuple(sorted(list(ranked)[:need]))
