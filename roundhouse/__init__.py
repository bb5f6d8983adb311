"""Roundhouse: a GPU cluster scheduler for deep-learning training."""

from __future__ import annotations

from services.runtime.version import __version__

__all__ = ["__version__"]
