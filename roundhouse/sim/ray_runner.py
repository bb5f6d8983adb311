"""A sweep's cases as tasks on an existing Ray cluster (``roundhouse simulate --ray ADDRESS``).

:class:`RayExecutor` is a :class:`concurrent.futures.Executor`, so ``roundhouse.sim.sweep`` runs a
sweep through it exactly as through its local process pool: the same case function, the same
``Executor.map`` (results in case order); only the dispatch differs. A case is a plain, picklable
value and its run is deterministic, so a case's report is the same on the cluster as here (up to
``wall_s``, which no two runs share).

The cluster must be able to import this version of Roundhouse (install it on every node, e.g. in the
nodes' image, or start the cluster from this environment), and read any ``--trace`` or
``--cluster-spec`` file at the same path (a shared file system).

``ray.init`` against an address where no Ray cluster answers retries for minutes, so the address is
first checked within a bounded time (:func:`check_reachable`): a TCP connection, then a throwaway
process that connects as a driver and is killed if it has not within the time left.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar
from urllib.parse import urlsplit

T = TypeVar("T")

CONNECT_TIMEOUT_S = 60.0
"""How long ``--ray`` waits for the cluster to answer before giving up (TCP, then a driver's connect)."""

_PROBE = (
    "import sys, ray\n"
    "ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False)\n"
    "print(int(ray.cluster_resources().get('CPU', 0)))\n"
    "ray.shutdown()\n"
)


class RayUnavailableError(RuntimeError):
    """ray is not installed, or no Ray cluster answers at the address given."""


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayUnavailableError("--ray needs ray: pip install 'roundhouse[ray]' (or pip install ray)") from None
    return ray


def host_port(address: str) -> tuple[str, int] | None:
    """``HOST:PORT`` or ``ray://HOST:PORT`` split; None for ``auto`` (the cluster this machine is
    part of, which ray finds itself). Anything else is refused with the forms that work."""
    if address == "auto":
        return None
    parts = urlsplit(address if "://" in address else f"//{address}")
    if parts.scheme not in ("", "ray") or not parts.hostname:
        raise RayUnavailableError(f"--ray takes HOST:PORT, ray://HOST:PORT or auto, got {address!r}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None:
        raise RayUnavailableError(f"--ray {address!r}: no port (the head's GCS port, 6379 by default)")
    return parts.hostname, port


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> int:
    """The CPUs of the Ray cluster at ``address``; :class:`RayUnavailableError` within about
    ``timeout_s`` if none answers there."""
    deadline = time.monotonic() + timeout_s
    target = host_port(address)
    if target is not None:
        try:
            with socket.create_connection(target, timeout=timeout_s):
                pass
        except OSError as exc:
            raise RayUnavailableError(f"no Ray cluster at {address}: {exc.strerror or exc}") from None
    try:
        probe = subprocess.run(
            [sys.executable, "-c", _PROBE, address],
            capture_output=True,
            text=True,
            timeout=max(1.0, deadline - time.monotonic()),
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RayUnavailableError(
            f"no Ray cluster answered at {address} within {timeout_s:g} s (something listens there, not Ray's head?)"
        ) from None
    if probe.returncode != 0:
        last = [line for line in probe.stderr.splitlines() if line.strip()][-1:] or ["(no output)"]
        raise RayUnavailableError(f"cannot connect to the Ray cluster at {address}: {last[0]}")
    try:
        return int(probe.stdout.split()[-1])
    except (IndexError, ValueError):
        return 0


def _call(fn: Callable[..., T], *args: Any) -> T:
    """What a Ray task runs: ``fn(*args)`` (a module-level function, so every worker can unpickle it)."""
    return fn(*args)


def _local_error(error: BaseException) -> BaseException:
    """What a failed task raises here: the task's own exception (Ray's wrappers and remote traceback
    taken off), or :class:`RayUnavailableError` where the cluster, not the case, failed: a worker
    that cannot import Roundhouse (Ray wraps that as a system error), or a worker or node lost."""
    from ray.exceptions import RayError

    while isinstance(getattr(error, "cause", None), Exception):  # a task error wraps its cause
        error = error.cause  # type: ignore[attr-defined]
    lines = str(error).strip().splitlines()
    first = lines[0] if lines else type(error).__name__
    if isinstance(error, ImportError) or (isinstance(error, RayError) and "No module named" in first):
        return RayUnavailableError(
            f"a Ray worker cannot import what the case needs ({first}): install this Roundhouse on every node"
        )
    if isinstance(error, RayError):
        return RayUnavailableError(f"the Ray cluster failed to run a case: {first}")
    return error


class RayExecutor(Executor):
    """Runs each submitted call as a Ray task (one CPU each) on the cluster at ``address``.

    A task's exception comes back as itself (Ray's wrapper, with its remote traceback, is taken off),
    so callers catch the same errors as from a local run."""

    def __init__(self, address: str, *, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        ray = _import_ray()
        self.cpus = check_reachable(address, timeout_s)
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        except Exception as exc:  # what the probe did, this process could not (e.g. already a driver elsewhere)
            raise RayUnavailableError(f"cannot connect to the Ray cluster at {address}: {exc}") from exc
        self._ray = ray
        self._task = ray.remote(num_cpus=1)(_call)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        if kwargs:
            raise TypeError("RayExecutor.submit takes positional arguments only (bind keywords with functools.partial)")
        result: Future[T] = Future()
        remote = self._task.remote(fn, *args).future()

        def settle(done: Future[T]) -> None:
            error = done.exception()
            if error is None:
                result.set_result(done.result())
            else:
                result.set_exception(_local_error(error))

        remote.add_done_callback(settle)
        return result

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Disconnect this driver; the cluster keeps running."""
        self._ray.shutdown()
