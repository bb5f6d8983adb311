"""``roundhouse dashboard``: a read-only web page of the queue, the running jobs, the nodes, the
queue and utilization over time, the job completion times and the policies in force.

Why here, under ``roundhouse/`` and not ``services/``: the dashboard is a *client* of the cluster, as
``roundhouse jobs`` is, not a service with state of its own. It reads through the same client SDK
(:class:`roundhouse.client.Client`, ``query.jobs``) with each visitor's own credentials, so it holds
no privilege and owns no subject; ``services/`` may not import ``roundhouse/``, and a service copy
of the client would be a second implementation of the same query to keep in step.

Modules, one job each: :mod:`visitors` (HTTP Basic credentials as a bus identity), :mod:`sessions`
(a cached bus connection per signed-in identity), :mod:`snapshot` (what one page shows),
:mod:`history` (the samples "over time"), :mod:`render` (the HTML), :mod:`app` (the aiohttp server).
docs/operations.md, "Dashboard", says how to run and sign in to it.
"""

from __future__ import annotations

from roundhouse.dashboard.app import DashboardConfig, create_app, serve
from roundhouse.dashboard.snapshot import SnapshotSource

__all__ = ["DashboardConfig", "SnapshotSource", "create_app", "serve"]
