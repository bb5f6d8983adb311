"""The page: server-rendered HTML with inline CSS and inline SVG charts, no script, no external asset.

Pure functions of a :class:`Snapshot` and the identity's samples, so they are tested without a
server. Every text that reaches the page passes through :func:`_text` (``html.escape``, quotes too):
job names, users and reasons are whatever someone submitted. The page refreshes itself with a meta
refresh, which keeps the browser's Basic credentials and needs no script (the page's Content
Security Policy allows none).
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Iterable, Sequence

from roundhouse.commands.jobs import one_line
from roundhouse.dashboard.history import Sample
from roundhouse.dashboard.snapshot import NodeView, PolicyView, Snapshot
from schemas.control import JobView

__all__ = ["render_page"]

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1d2330;background:#f7f8fa}
h1{font-size:1.4em;margin:0 0 .2em} h2{font-size:1.1em;margin:1.4em 0 .4em}
.meta{color:#5a6272} .errors{background:#fdecea;border:1px solid #f5c2c0;padding:.5em 1em;border-radius:4px}
table{border-collapse:collapse;background:#fff;width:100%} td,th{padding:.3em .6em;border-bottom:1px solid #e3e6eb;
text-align:left;vertical-align:top} th{background:#eef0f4;font-weight:600} td.num{text-align:right}
.empty{color:#7a8190;font-style:italic} .grid{display:flex;flex-wrap:wrap;gap:1.2em}
.card{background:#fff;border:1px solid #e3e6eb;border-radius:4px;padding:.6em .9em}
.bar{display:inline-block;height:.8em;background:#3b82f6;vertical-align:middle}
.barbg{display:inline-block;width:120px;height:.8em;background:#e3e6eb;vertical-align:middle}
.up{color:#15803d} .down{color:#b91c1c} code{font-size:.95em}
"""


def _text(value: object) -> str:
    return html.escape(str(value), quote=True)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def _placement(job: JobView) -> str:
    return ", ".join(f"{node}:{'+'.join(map(str, gpus))}" for node, gpus in sorted(job.placement.items())) or "-"


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, table_id: str, empty: str) -> str:
    """``rows`` hold HTML already escaped; an empty table says ``empty`` instead."""
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    if not body:
        return f'<p class="empty" id="{table_id}">{_text(empty)}</p>'
    head = "".join(f"<th>{_text(h)}</th>" for h in headers)
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _eta(job: JobView) -> str:
    """The scheduler's expected start (``~`` when it rests on guessed durations), or why it has none."""
    if job.eta_s is None:
        return f'<span title="{_text(job.eta_reason)}">-</span>' if job.eta_reason else "-"
    guessed = "~" if job.eta_quality == "guessed" else ""
    return _text(f"in {guessed}{_duration(job.eta_s)}")


def _queue(snapshot: Snapshot) -> str:
    now = snapshot.taken_at
    rows = []
    for job in snapshot.waiting:
        rows.append([
            _text(job.queue_position if job.queue_position is not None else "-"), _text(job.job_id),
            _text(job.name), _text(job.user), _text(job.job_class.value), _text(job.status), _text(job.gpus),
            _text(_duration(now - job.submit_time)), _eta(job),
            _text(one_line(job.reason) or "-"),
        ])  # fmt: skip
    return _table(("#", "ID", "NAME", "USER", "CLASS", "STATUS", "GPUS", "WAITED", "ETA", "REASON"), rows,
                  table_id="queue", empty="no job is waiting")  # fmt: skip


def _running(snapshot: Snapshot) -> str:
    rows = [[_text(job.job_id), _text(job.name), _text(job.user), _text(job.status), _text(job.gpus),
             _text(_placement(job)), _text(_duration(job.runtime_s)), _text(job.iterations_done),
             _text(job.preemptions)] for job in snapshot.running]  # fmt: skip
    return _table(("ID", "NAME", "USER", "STATUS", "GPUS", "PLACEMENT", "RUNTIME", "ITER", "PREEMPT"), rows,
                  table_id="running", empty="no job is running")  # fmt: skip


def _finished(snapshot: Snapshot, last: int = 20) -> str:
    done = sorted(snapshot.finished, key=lambda job: job.finish_time or 0.0, reverse=True)[:last]
    rows = [[_text(job.job_id), _text(job.name), _text(job.user), _text(job.status), _text(job.gpus),
             _text(_duration(job.finish_time - job.submit_time) if job.finish_time is not None else "-"),
             _text(one_line(job.reason) or "-")] for job in done]  # fmt: skip
    return _table(("ID", "NAME", "USER", "STATUS", "GPUS", "JCT", "REASON"), rows, table_id="finished",
                  empty="no job has finished")  # fmt: skip


def _gauge(used: int, total: int | None) -> str:
    if not total:
        return _text(f"{used} in use")
    width = round(120 * min(1.0, used / total))
    return f'<span class="barbg"><span class="bar" style="width:{width}px"></span></span> {_text(f"{used}/{total}")}'


def _liveness(node: NodeView) -> str:
    if node.up is None:
        return _text(node.state or "-")
    word = node.state or ("up" if node.up else "silent")
    state = f'<span class="{"up" if node.up else "down"}">{_text(word)}</span>'
    return state + (" (draining)" if node.draining and word not in ("draining", "drained") else "")


def _node_jobs(node: NodeView) -> str:
    others = f"{node.other_jobs} of other users" if node.other_jobs else ""
    return _text(", ".join(part for part in (", ".join(node.jobs), others) if part) or "-")


def _nodes(nodes: list[NodeView]) -> str:
    rows = [[_text(node.node_id), _gauge(node.allocated, node.gpus), _liveness(node),
             _node_jobs(node)] for node in nodes]  # fmt: skip
    return _table(("NODE", "GPUS ALLOCATED", "STATE", "JOBS"), rows, table_id="nodes",
                  empty="no node is known yet")  # fmt: skip


def _policies(policies: list[PolicyView]) -> str:
    rows = [[_text(p.service), _text((p.instance or "-") + (" (leader)" if p.leader else "")), _text(p.policy),
             f"<code>{_text(p.options)}</code>"] for p in policies]  # fmt: skip
    return _table(("SERVICE", "INSTANCE", "POLICY", "OPTIONS"), rows, table_id="policies",
                  empty="not known (the scheduler did not answer query.status)")  # fmt: skip


def _line_chart(points: list[tuple[float, float]], *, title: str, chart_id: str, y_max: float | None = None,
                unit: str = "") -> str:  # fmt: skip
    """An SVG line of ``points`` (time, value), with its latest value and its scale in the title."""
    width, height, pad = 420, 120, 4
    if len(points) < 2:
        latest = f"{points[-1][1]:g}{unit}" if points else "no sample yet"
        return f'<div class="card" id="{chart_id}"><b>{_text(title)}</b>: {_text(latest)}</div>'
    t0, t1 = points[0][0], points[-1][0]
    top = y_max if y_max is not None else max(1.0, *(v for _, v in points))
    span = max(t1 - t0, 1e-9)
    coords = " ".join(
        f"{pad + (t - t0) / span * (width - 2 * pad):.1f},{height - pad - v / top * (height - 2 * pad):.1f}"
        for t, v in points
    )
    caption = f"{title}: now {points[-1][1]:g}{unit} (max {top:g}{unit}, last {_duration(t1 - t0)})"
    return (f'<div class="card" id="{chart_id}"><b>{_text(caption)}</b><br><svg width="{width}" height="{height}" '
            f'role="img" aria-label="{_text(title)}"><rect width="{width}" height="{height}" fill="#fbfcfd" '
            f'stroke="#e3e6eb"/><polyline fill="none" stroke="#3b82f6" stroke-width="2" points="{coords}"/></svg>'
            "</div>")  # fmt: skip


def _over_time(samples: list[Sample]) -> str:
    queue = [(s.at, float(s.waiting)) for s in samples]
    utilization = [(s.at, round(100 * u, 1)) for s in samples if (u := s.utilization) is not None]
    return (
        '<div class="grid">'
        + _line_chart(queue, title="Queue length", chart_id="queue-chart")
        + _line_chart(utilization, title="GPUs allocated", chart_id="utilization-chart", y_max=100.0, unit="%")
        + "</div>"
    )


def _jct(finished: list[JobView], bins: int = 10) -> str:
    """A histogram of finished jobs' completion times (finish - submission), in ``bins`` equal bins."""
    times = sorted(job.finish_time - job.submit_time for job in finished if job.finish_time is not None)
    if not times:
        return '<div class="card" id="jct-chart"><b>Job completion times</b>: no finished job yet</div>'
    low, high = times[0], times[-1]
    step = (high - low) / bins if high > low else 1.0
    counts = [0] * bins
    for value in times:
        counts[min(bins - 1, math.floor((value - low) / step))] += 1
    width, height, gap = 420, 120, 2
    bar_w = width / bins
    tallest = max(counts)
    bars = "".join(
        f'<rect x="{i * bar_w + gap:.1f}" y="{height - count / tallest * (height - 14):.1f}" '
        f'width="{bar_w - 2 * gap:.1f}" height="{count / tallest * (height - 14):.1f}" fill="#6366f1">'
        f"<title>{_text(f'{_duration(low + i * step)}-{_duration(low + (i + 1) * step)}: {count}')}</title></rect>"
        for i, count in enumerate(counts)
    )  # fmt: skip
    median = times[len(times) // 2]
    caption = (f"Job completion times: {len(times)} finished, median {_duration(median)}, "
               f"{_duration(low)}-{_duration(high)}")
    return (f'<div class="card" id="jct-chart"><b>{_text(caption)}</b><br><svg width="{width}" height="{height}" '
            f'role="img" aria-label="job completion time histogram">{bars}</svg></div>')  # fmt: skip


def render_page(snapshot: Snapshot, samples: list[Sample], *, refresh_s: float, cluster: str = "") -> str:
    allocated, total = snapshot.gpu_totals
    errors = "".join(f"<li>{_text(error)}</li>" for error in snapshot.errors)
    truncated = "<p class=\"meta\">(only the first jobs are shown)</p>" if snapshot.truncated else ""
    taken = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(snapshot.taken_at))
    summary = (f"{len(snapshot.waiting)} waiting, {len(snapshot.running)} running, "
               f"GPUs {allocated}/{total if total is not None else '?'} allocated")  # fmt: skip
    refresh = max(1, round(refresh_s))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="{refresh}">
<meta name="viewport" content="width=device-width,initial-scale=1">
<title>Roundhouse{_text(" " + cluster if cluster else "")}</title><style>{_CSS}</style></head>
<body>
<h1>Roundhouse{_text(" " + cluster if cluster else "")}</h1>
<p class="meta" id="summary">Signed in as <b id="visitor">{_text(snapshot.visitor)}</b> &middot; {_text(summary)}
&middot; {_text(taken)} &middot; refreshes every {refresh} s &middot; read-only</p>
{f'<ul class="errors" id="errors">{errors}</ul>' if errors else ""}
<h2>Queue</h2>{_queue(snapshot)}{truncated}
<h2>Running</h2>{_running(snapshot)}
<h2>Nodes</h2>{_nodes(snapshot.nodes)}
<h2>Over time</h2>{_over_time(samples)}
<h2>Finished jobs</h2><div class="grid">{_jct(snapshot.finished)}</div>{_finished(snapshot)}
<h2>Policies in force</h2>{_policies(snapshot.policies)}
</body></html>
"""
