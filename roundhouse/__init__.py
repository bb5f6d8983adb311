"""Roundhouse: a GPU cluster scheduler for deep-learning training."""

from __future__ import annotations

__all__ = ["__version__"]


def __getattr__(name: str) -> str:
    # Read from the installed metadata only when asked: every `roundhouse` command imports this
    # package, and importlib.metadata costs ~20 ms of its start-up (issue 14, item 9).
    if name == "__version__":
        from services.runtime.version import __version__

        return __version__
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
