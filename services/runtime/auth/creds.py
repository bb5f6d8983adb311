"""One identity's credentials file: who it is (role and name) and the NATS user nkey seed that proves it.

The format is plain text, readable by people and by any NATS client that reads seed files (the seed
block is the standard one ``nsc`` writes, so ``nats --nkey`` tools can use the file as it is)::

    # Roundhouse credentials: worker node-1
    # Secret: whoever holds this file speaks as this identity on the bus. Keep it mode 0600.
    role: worker
    identity: node-1
    public_key: UBX...

    -----BEGIN USER NKEY SEED-----
    SUA...
    ------END USER NKEY SEED------

The seed is generated and handled only by the ``nkeys`` library (ed25519); the broker knows only the
public key (``identities.json`` and the generated ``auth.conf``), and authenticates a connection by
the signature of the nonce it sends, so the seed never travels.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import nkeys

from schemas.roles import Role, validate_identity

__all__ = ["CREDS_ENV", "Credentials", "CredentialsError", "new_credentials", "read_creds", "write_creds"]

CREDS_ENV: Final = "ROUNDHOUSE_CREDS"
"""The environment variable every service and command reads its credentials file from."""

_HEADER: Final = "# Roundhouse credentials:"
_SEED_BEGIN: Final = "-----BEGIN USER NKEY SEED-----"
_SEED_END: Final = "------END USER NKEY SEED------"
_SEED_BLOCK = re.compile(r"-{3,}BEGIN USER NKEY SEED-{3,}\s*\n\s*(S[A-Z2-7]+)\s*\n\s*-{3,}END USER NKEY SEED-{3,}")
_FIELD = re.compile(r"^(role|identity|public_key):\s*(\S+)\s*$", re.MULTILINE)
FILE_MODE: Final = 0o600
DIR_MODE: Final = 0o700


class CredentialsError(ValueError):
    """A credentials file that is missing, unreadable, malformed or does not match its seed."""


@dataclass(frozen=True, slots=True)
class Credentials:
    role: Role
    identity: str
    seed: str
    """The user nkey seed (``SU...``): the secret."""

    @property
    def public_key(self) -> str:
        """The user nkey (``U...``) the broker authenticates this identity by."""
        return _public_key(self.seed)

    def __repr__(self) -> str:  # never print the seed (logs, tracebacks)
        return f"Credentials(role={self.role.value!r}, identity={self.identity!r})"


def _public_key(seed: str) -> str:
    try:
        key: bytes = nkeys.from_seed(bytearray(seed.encode())).public_key
    except (nkeys.NkeysError, ValueError) as exc:
        raise CredentialsError(f"not a valid NATS nkey seed ({type(exc).__name__})") from None
    if not key.startswith(b"U"):
        raise CredentialsError("the seed is not a NATS *user* nkey seed (it must start with SU)")
    return key.decode()


def new_credentials(role: Role, identity: str) -> Credentials:
    """Fresh credentials for ``identity``: a new random user nkey (32 bytes from the OS's CSPRNG)."""
    validate_identity(role, identity)
    seed: bytes = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    return Credentials(role, identity, seed.decode())


def render_creds(creds: Credentials) -> str:
    return (
        f"{_HEADER} {creds.role.value} {creds.identity}\n"
        "# Secret: whoever holds this file speaks as this identity on the bus. Keep it mode 0600.\n"
        f"role: {creds.role.value}\n"
        f"identity: {creds.identity}\n"
        f"public_key: {creds.public_key}\n"
        "\n"
        f"{_SEED_BEGIN}\n{creds.seed}\n{_SEED_END}\n"
    )


def parse_creds(text: str, *, source: str = "credentials") -> Credentials:
    """The credentials in ``text``; CredentialsError naming ``source`` and what is wrong."""
    fields = dict(_FIELD.findall(text))
    block = _SEED_BLOCK.search(text)
    missing = [name for name in ("role", "identity") if name not in fields]
    if block is None:
        missing.append("the USER NKEY SEED block")
    if missing:
        raise CredentialsError(f"{source} is not a Roundhouse credentials file: no {', '.join(missing)}")
    assert block is not None
    try:
        role = Role(fields["role"])
    except ValueError:
        raise CredentialsError(
            f"{source}: unknown role {fields['role']!r} (one of {', '.join(r.value for r in Role)})"
        ) from None
    try:
        identity = validate_identity(role, fields["identity"])
    except ValueError as exc:
        raise CredentialsError(f"{source}: {exc}") from None
    creds = Credentials(role, identity, block.group(1))
    try:
        public_key = creds.public_key
    except CredentialsError as exc:
        raise CredentialsError(f"{source}: {exc}") from None
    if "public_key" in fields and fields["public_key"] != public_key:
        raise CredentialsError(f"{source}: public_key does not belong to the seed (the file was edited)")
    return creds


def read_creds(path: Path) -> Credentials:
    """Read a credentials file; CredentialsError saying why it cannot be used.

    A file others can read is refused, as ssh refuses a private key others can read: it is a secret."""
    try:
        mode = path.stat().st_mode
        text = path.read_text()
    except FileNotFoundError:
        raise CredentialsError(f"credentials file {path} does not exist") from None
    except OSError as exc:
        raise CredentialsError(f"cannot read credentials file {path}: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CredentialsError(
            f"credentials file {path} is accessible by other users (mode {stat.S_IMODE(mode):o}): "
            f"run `chmod 600 {path}`"
        )
    return parse_creds(text, source=f"credentials file {path}")


def write_creds(path: Path, creds: Credentials) -> Path:
    """Write ``creds`` to ``path`` (mode 0600; the directory made 0700 if new), atomically."""
    path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    # O_EXCL + mode at creation: the secret is never, even briefly, in a file others may read.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(render_creds(creds))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
