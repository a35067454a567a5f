"""Kafka security for the asyncio clients: the TLS context and Faust's broker credentials."""

from __future__ import annotations

import ssl
from typing import Any

from ragwarm.settings import KafkaSettings


def ssl_context(kafka: KafkaSettings) -> ssl.SSLContext | None:
    """The client TLS context `kafka` describes; None when the protocol has no TLS."""
    if not kafka.uses_ssl:
        return None
    cafile = str(kafka.ssl_cafile) if kafka.ssl_cafile else None
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile)
    context.check_hostname = kafka.ssl_check_hostname
    if kafka.ssl_certfile and kafka.ssl_keyfile:
        password = kafka.ssl_key_password
        context.load_cert_chain(
            str(kafka.ssl_certfile),
            str(kafka.ssl_keyfile),
            password.get_secret_value() if password else None,
        )
    return context


def faust_credentials(kafka: KafkaSettings) -> Any:
    """Faust's `broker_credentials` for `kafka`: SASL (over TLS or not), TLS alone, or None."""
    import faust

    context = ssl_context(kafka)
    if kafka.uses_sasl:
        assert kafka.sasl_password is not None  # KafkaSettings checks SASL is complete
        credentials = faust.SASLCredentials(
            username=kafka.sasl_username,
            password=kafka.sasl_password.get_secret_value(),
            ssl_context=context,
            mechanism=kafka.sasl_mechanism or "PLAIN",
        )
        return credentials
    if context is not None:
        return faust.SSLCredentials(context)
    return None


def aiokafka_options(kafka: KafkaSettings) -> dict[str, Any]:
    """Security options of an aiokafka client for `kafka` (only the protocol for PLAINTEXT)."""
    opts: dict[str, Any] = {"security_protocol": kafka.security_protocol}
    context = ssl_context(kafka)
    if context is not None:
        opts["ssl_context"] = context
    if kafka.uses_sasl:
        assert kafka.sasl_password is not None  # KafkaSettings checks SASL is complete
        opts.update(
            sasl_mechanism=kafka.sasl_mechanism or "PLAIN",
            sasl_plain_username=kafka.sasl_username,
            sasl_plain_password=kafka.sasl_password.get_secret_value(),
        )
    return opts
