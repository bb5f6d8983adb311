"""The aiohttp application: one read-only page (``GET /``), behind the bus's own authentication.

Every request is signed in (:mod:`visitors`, :mod:`sessions`) before anything is rendered: no
credentials, unusable ones, or ones the broker refuses get ``401`` with a ``WWW-Authenticate``
challenge, so a browser asks for them. Only with ``insecure`` (a dashboard for an ``--insecure``
cluster) is the page served to anyone, as the dashboard's own identity.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from roundhouse.dashboard.render import render_page
from roundhouse.dashboard.sessions import Connect, Session, Sessions, SignInRefused
from roundhouse.dashboard.snapshot import SnapshotSource
from roundhouse.dashboard.visitors import BadCredentials, parse_basic

__all__ = ["DashboardConfig", "create_app", "serve"]

log = logging.getLogger("roundhouse.dashboard")

_SESSIONS: web.AppKey[Sessions] = web.AppKey("sessions", Sessions)
PageHandler = Callable[[web.Request, Session], Awaitable[web.StreamResponse]]
_REALM = 'Basic realm="Roundhouse: user = your identity, password = your credentials seed", charset="UTF-8"'
_HEADERS = {
    # No script, no frame, no outside asset: the page is inline HTML, CSS and SVG.
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class DashboardConfig:
    host: str = "127.0.0.1"
    port: int = 8787
    """0: any free port (the bound URL is logged and written to ``url_file``)."""
    insecure: bool = False
    """Serve without authentication, as the dashboard's own connection (an ``--insecure`` cluster)."""
    refresh_s: float = 5.0
    sample_s: float = 5.0
    idle_s: float = 300.0
    cluster: str = ""
    """Shown in the title (the namespace)."""
    url_file: Path | None = None


_CONFIG: web.AppKey[DashboardConfig] = web.AppKey("config", DashboardConfig)


def _unauthorized(reason: str) -> web.Response:
    headers = {"WWW-Authenticate": _REALM, **_HEADERS}
    return web.Response(status=401, text=f"401 Unauthorized: {reason}\n", headers=headers)


def _signed_in(handler: PageHandler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """``handler`` run only for a visitor who signed in (with the visitor's session); 401 otherwise."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        session = await _sign_in(request)
        return session if isinstance(session, web.StreamResponse) else await handler(request, session)

    return guarded


async def _sign_in(request: web.Request) -> Session | web.StreamResponse:
    sessions = request.app[_SESSIONS]
    config = request.app[_CONFIG]
    try:
        visitor = parse_basic(request.headers.get("Authorization"))
    except BadCredentials as exc:
        return _unauthorized(str(exc))
    if visitor is None and not config.insecure:
        return _unauthorized("sign in with your Roundhouse identity and its credentials seed")
    if config.insecure:
        visitor = None  # one open session: the dashboard's own connection
    try:
        return await sessions.get(visitor)
    except SignInRefused as exc:
        log.info("dashboard: sign-in refused for %s: %s", visitor.label if visitor else "?", exc)
        return _unauthorized(str(exc))
    except (OSError, TimeoutError) as exc:
        return web.Response(status=503, text=f"503: cannot reach the bus: {exc}\n", headers=_HEADERS)


async def _page(request: web.Request, session: Session) -> web.Response:
    config = request.app[_CONFIG]
    snapshot = await session.snapshot(request.app[_SESSIONS].source)
    body = render_page(snapshot, session.history.samples(), refresh_s=config.refresh_s, cluster=config.cluster)
    return web.Response(text=body, content_type="text/html", charset="utf-8", headers=_HEADERS)


def create_app(config: DashboardConfig, connect: Connect, source: SnapshotSource) -> web.Application:
    """The application; ``connect`` opens a bus connection as a visitor's credentials."""
    app = web.Application()
    app[_CONFIG] = config
    app[_SESSIONS] = Sessions(connect, source, idle_s=config.idle_s, sample_s=config.sample_s)
    app.router.add_get("/", _signed_in(_page))  # every route is wrapped: nothing is served unsigned

    async def close_sessions(app: web.Application) -> None:
        await app[_SESSIONS].close()

    app.on_cleanup.append(close_sessions)
    return app


async def serve(config: DashboardConfig, connect: Connect, source: SnapshotSource, stop: asyncio.Event) -> None:
    """Serve until ``stop`` is set; the bound URL is logged and, with ``url_file``, written there."""
    runner = web.AppRunner(create_app(config, connect, source), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, config.host, config.port)
        await site.start()
        host, port = runner.addresses[0][:2]
        url = f"http://{host if ':' not in host else f'[{host}]'}:{port}/"
        log.info("dashboard: serving %s%s", url, " WITHOUT authentication (--insecure)" if config.insecure else "")
        if config.url_file is not None:
            tmp = config.url_file.with_suffix(".tmp")
            tmp.write_text(url + "\n")
            tmp.replace(config.url_file)  # whoever waits for it reads a whole URL
        await stop.wait()
    finally:
        await runner.cleanup()
