"""The installed Roundhouse version, one value for every process that reports it.

Services announce it in ``$SRV.INFO``, the worker agent sends it in ``node.register``
(``agent_version``) and ``roundhouse --version`` prints it. It lives here, below the services and
the CLI, so that no service has to import ``roundhouse`` to learn it.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__ = version("roundhouse")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"
