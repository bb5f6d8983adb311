"""A process pool whose workers exit when the process that started them dies.

A ``ProcessPoolExecutor`` worker waits on its call queue, and each worker holds both ends of that
queue's pipe, so it never sees end-of-file when its parent dies: a service killed with SIGKILL
(a chaos run, an OOM kill, ``kill -9`` under ``roundhouse up``) left its pool's worker and
multiprocessing's resource tracker running for good (found with the scheduler's ETA pool:
orphans an hour old). Each worker here watches its parent and exits once it is gone; the resource
tracker then sees its last client go and exits too.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Final

__all__ = ["PARENT_CHECK_S", "process_pool"]

PARENT_CHECK_S: Final = 1.0
"""How often a worker checks that its parent still runs (``os.getppid`` is a cheap system call)."""


def _watch_parent(parent_pid: int) -> None:
    """Worker initializer: exit the worker (at once, skipping cleanup a dead parent cannot use)
    when it is re-parented, i.e. when the process that started it is gone."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_CHECK_S)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def process_pool(max_workers: int, *, start_method: str | None = "spawn") -> ProcessPoolExecutor:
    """A pool whose workers exit with the calling process.

    ``start_method``: ``spawn`` by default (a fork would copy a service's event loop and NATS
    connection); None takes the platform's default, which the CLI's sweeps and reproductions keep
    (they hold no connection, and a fork carries policies a caller registered at run time)."""
    context = get_context(start_method)
    return ProcessPoolExecutor(
        max_workers=max_workers, mp_context=context, initializer=_watch_parent, initargs=(os.getpid(),)
    )
