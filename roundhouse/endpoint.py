"""Where the user's Roundhouse is: a NATS URL and a namespace.

Resolution order: explicit flags, then ``ROUNDHOUSE_NATS`` / ``ROUNDHOUSE_NAMESPACE`` /
``ROUNDHOUSE_CREDS``, then the ``up.json`` that ``roundhouse up`` writes into its state directory
(``./.roundhouse`` by default). Credentials are looked up the same way (``--creds``, then
``ROUNDHOUSE_CREDS``, then the creds file ``up.json`` names: the identity of whoever ran ``up``), so
every command run where ``up`` runs authenticates with no flag.
With none of them there is no default: a command must not silently talk to whatever NATS happens to
listen on this host's default port (another cluster, or none), so it fails and says what to do.
``--nats`` may list several servers of one cluster, comma-separated.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from services.runtime.auth.creds import CREDS_ENV

DEFAULT_STATE_DIR = Path(".roundhouse")
UP_FILE = "up.json"


class NoClusterError(ConnectionError):
    """No Roundhouse is named: no flag, no environment variable, no ``up.json``."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    nats: str
    namespace: str = ""
    creds: Path | None = None
    """The credentials file to connect with (None: an open broker)."""

    def write(self, state_dir: Path) -> Path:
        path = state_dir / UP_FILE
        found: dict[str, str] = {"nats": self.nats, "namespace": self.namespace}
        if self.creds is not None:
            # A path, not the secret: up.json stays readable while the creds file is 0600.
            found["creds"] = str(self.creds.resolve())
        path.write_text(json.dumps(found) + "\n")
        return path


def resolve(
    nats: str | None = None,
    namespace: str | None = None,
    *,
    creds: str | Path | None = None,
    state_dir: Path | None = None,
) -> Endpoint:
    env = os.environ
    nats = nats or env.get("ROUNDHOUSE_NATS")
    namespace = namespace if namespace is not None else env.get("ROUNDHOUSE_NAMESPACE")
    creds = creds or env.get(CREDS_ENV) or None
    if nats is None or namespace is None or creds is None:
        up = (state_dir or DEFAULT_STATE_DIR) / UP_FILE
        if up.is_file():
            try:
                found = json.loads(up.read_text())
            except ValueError:
                found = {}
            # up.json's credentials belong to up.json's cluster: taken only if its NATS is the one used.
            same_cluster = nats is None or nats == found.get("nats")
            nats = nats or found.get("nats")
            namespace = namespace if namespace is not None else found.get("namespace")
            if creds is None and same_cluster:
                creds = found.get("creds")
    if not nats:
        where = (state_dir or DEFAULT_STATE_DIR) / UP_FILE
        raise NoClusterError(
            f"no Roundhouse to talk to: pass --nats URL[,URL...], set ROUNDHOUSE_NATS, or run this where "
            f"`roundhouse up` runs (it writes {where})"
        )
    return Endpoint(nats, namespace or "", Path(creds) if creds else None)
