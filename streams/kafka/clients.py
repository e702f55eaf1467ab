"""How every Threadline Kafka client connects: the bootstrap servers plus, when the
environment sets them, TLS and SASL settings (docs/security.md).

    THREADLINE_KAFKA_SECURITY_PROTOCOL   PLAINTEXT (default), SASL_PLAINTEXT, SASL_SSL, SSL
    THREADLINE_KAFKA_SASL_MECHANISM      SCRAM-SHA-512 (default when a username is set), SCRAM-SHA-256, PLAIN
    THREADLINE_KAFKA_SASL_USERNAME / _PASSWORD
    THREADLINE_KAFKA_SSL_CA_LOCATION     a CA bundle (PEM) for SSL and SASL_SSL

`Settings.kafka_security` holds them as librdkafka keys; `librdkafka_config` and
`aiokafka_config` turn them into the two client libraries' configurations, so the
two never drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from streams.config import Settings

__all__ = ["aiokafka_config", "librdkafka_config", "security_from_env"]

_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


def security_from_env(env: Mapping[str, str]) -> dict[str, str]:
    """The TLS and SASL settings of the environment, as librdkafka keys."""
    username = env.get("THREADLINE_KAFKA_SASL_USERNAME", "")
    default = "SASL_PLAINTEXT" if username else "PLAINTEXT"
    protocol = (env.get("THREADLINE_KAFKA_SECURITY_PROTOCOL") or default).upper()
    if protocol not in _PROTOCOLS:
        raise ValueError(f"THREADLINE_KAFKA_SECURITY_PROTOCOL={protocol!r}: one of {', '.join(_PROTOCOLS)}")
    config = {"security.protocol": protocol} if protocol != "PLAINTEXT" else {}
    if protocol.startswith("SASL_"):
        if not username:
            raise ValueError(f"security protocol {protocol} needs THREADLINE_KAFKA_SASL_USERNAME")
        config["sasl.mechanism"] = env.get("THREADLINE_KAFKA_SASL_MECHANISM") or "SCRAM-SHA-512"
        config["sasl.username"] = username
        config["sasl.password"] = env.get("THREADLINE_KAFKA_SASL_PASSWORD", "")
    ca = env.get("THREADLINE_KAFKA_SSL_CA_LOCATION")
    if ca and protocol.endswith("SSL"):
        config["ssl.ca.location"] = ca
    return config


def librdkafka_config(settings: Settings, **extra: Any) -> dict[str, Any]:
    """A confluent-kafka client configuration: bootstrap servers, security, `extra`."""
    return {"bootstrap.servers": settings.bootstrap, **settings.kafka_security, **extra}


def aiokafka_config(settings: Settings, **extra: object) -> dict[str, object]:
    """Keyword arguments of an aiokafka client: bootstrap servers, security, `extra`."""
    security = settings.kafka_security
    config: dict[str, object] = {"bootstrap_servers": settings.bootstrap}
    protocol = security.get("security.protocol", "PLAINTEXT")
    if protocol != "PLAINTEXT":
        config["security_protocol"] = protocol
    if protocol.startswith("SASL_"):
        config["sasl_mechanism"] = security["sasl.mechanism"]
        config["sasl_plain_username"] = security["sasl.username"]
        config["sasl_plain_password"] = security["sasl.password"]
    if protocol.endswith("SSL"):
        from aiokafka.helpers import create_ssl_context

        config["ssl_context"] = create_ssl_context(cafile=security.get("ssl.ca.location"))
    config.update(extra)
    return config
