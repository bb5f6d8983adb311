"""A throwaway certificate authority and one server certificate for TLS tests, made with ``openssl``.

The ``openssl`` binary rather than a Python package: the project depends on no X.509 library, and the
commands are the ones deploy/README.md gives an operator for a test setup (an EC P-256 CA, and a server
certificate with the names clients dial, usable for mutual-TLS routes too).
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Pki", "make_pki", "openssl_binary"]


@dataclass(frozen=True, slots=True)
class Pki:
    ca_cert: Path
    server_cert: Path
    server_key: Path

    def client_context(self) -> ssl.SSLContext:
        """What a client that trusts this CA uses: Python's defaults (hostname check included)."""
        return ssl.create_default_context(cafile=str(self.ca_cert))


def openssl_binary() -> str | None:
    return shutil.which("openssl")


def _run(*args: str, cwd: Path) -> None:
    binary = openssl_binary()
    assert binary is not None, "openssl not found"
    done = subprocess.run([binary, *args], check=False, cwd=cwd, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {done.stderr.strip()}")


def make_pki(
    directory: Path, *, dns_names: tuple[str, ...] = ("localhost",), ips: tuple[str, ...] = ("127.0.0.1",)
) -> Pki:
    """A CA (``ca.crt``, ``ca.key``) and a server certificate (``server.crt``, ``server.key``) for
    ``dns_names`` and ``ips``, valid two days. Keys are written 0600."""
    directory.mkdir(parents=True, exist_ok=True)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _run(
        "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", "/CN=Roundhouse test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip
    _run("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=roundhouse-nats", cwd=directory)
    names = [f"DNS:{name}" for name in dns_names] + [f"IP:{ip}" for ip in ips]
    (directory / "server.ext").write_text(
        f"subjectAltName = {', '.join(names)}\n"
        "basicConstraints = critical, CA:FALSE\n"
        "keyUsage = critical, digitalSignature\n"
        # clientAuth too: a cluster server dials the other servers' routes with this certificate.
        "extendedKeyUsage = serverAuth, clientAuth\n"
        "subjectKeyIdentifier = hash\n"
        "authorityKeyIdentifier = keyid, issuer\n"
    )
    _run(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.crt", "-days", "2", "-extfile", "server.ext",
        cwd=directory,
    )  # fmt: skip
    for key in ("ca.key", "server.key"):
        (directory / key).chmod(0o600)
    return Pki(directory / "ca.crt", directory / "server.crt", directory / "server.key")
