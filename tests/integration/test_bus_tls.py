"""A tls:// URL is never spoken to in clear text (issue 13): the client starts with the TLS handshake.

Without that, nats-py reads the server's INFO in clear text and carries on in clear text when the INFO
does not ask for TLS, so a man in the middle posing as a plain broker could relay the real broker's
nonce and log in with the client's signature.
"""

from __future__ import annotations

import time

import pytest

from schemas.roles import Role
from services.runtime.auth import new_credentials
from services.runtime.broker import Broker
from services.runtime.bus import Bus, BusOptions, TlsHandshakeError, identity_settings, tls_settings


async def test_a_tls_url_does_not_fall_back_to_clear_text(broker: Broker) -> None:
    plain_url = broker.url
    tls_url = plain_url.replace("nats://", "tls://")
    options = BusOptions(connect_timeout_s=1.0)  # a service's: reconnect forever
    began = time.monotonic()
    with pytest.raises(TlsHandshakeError, match=r"no TLS handshake with tls://.*ROUNDHOUSE_TLS_CA"):
        await Bus.connect(tls_url, name="tls-to-plain", options=options, provision=False)
    assert time.monotonic() - began < 5.0  # at once: retrying cannot help
    # The control: the same broker over its plain URL answers, so the failure above is the TLS rule.
    bus = await Bus.connect(plain_url, name="plain", options=options, provision=False)
    try:
        assert bus.nc.is_connected
    finally:
        await bus.close()


def test_tls_urls_start_with_the_handshake_and_verify_certificates() -> None:
    settings = tls_settings(["tls://a:4222", "tls://b:4222"])
    assert settings["tls_handshake_first"] is True
    assert settings["tls"].verify_mode.name == "CERT_REQUIRED"
    assert tls_settings("nats://a:4222") == {}


def test_a_cluster_is_reached_with_tls_or_without_never_both() -> None:
    with pytest.raises(ValueError, match="mixed tls:// and plain URLs"):
        tls_settings(["tls://a:4222", "nats://b:4222"])


def test_a_raw_connection_gets_the_same_identity_and_tls_options_as_the_bus() -> None:
    """``roundhouse up``'s readiness pings connect without the Bus: they must still speak TLS first and
    use the identity's own inbox (they once left TLS out, and never got ready against a tls:// broker)."""
    operator = new_credentials(Role.OPERATOR, "operator")
    settings = identity_settings(["tls://a:4222"], operator)
    assert settings["tls_handshake_first"] is True
    assert settings["nkeys_seed_str"] == operator.seed
    assert settings["inbox_prefix"] == "_INBOX.operator.operator"
    assert identity_settings("nats://a:4222", None) == {}
