"""How every Threadline Kafka client connects: the bootstrap servers plus, when the
environment sets them, TLS and SASL settings (docs/security.md).

    THREADLINE_KAFKA_SECURITY_PROTOCOL   PLAINTEXT (default), SASL_PLAINTEXT, SASL_SSL, SSL
    THREADLINE_KAFKA_SASL_MECHANISM      SCRAM-SHA-512 (default when a username is set), SCRAM-SHA-256, PLAIN
    THREADLINE_KAFKA_SASL_USERNAME / _PASSWORD
    THREADLINE_KAFKA_SSL_CA_LOCATION     a CA bundle (PEM) for SSL and SASL_SSL

`Settings.kafka_security` holds them as librdkafka keys; `librdkafka_config` and
`aiokafka_config` turn them into the two client libraries' configurations, so the
two never drift apart. The configurations of the transactional table loop's own
clients (`streams.kafka.loop`) are built here too, once for every role.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Mapping
from typing import Any

from streams.config import KafkaSecurityEnv, Settings
from streams.kafka.liveness import heartbeat_interval_ms, session_timeout_ms
from streams.kafka.takeover import Takeover, Writer

__all__ = ["aiokafka_config", "brokers_reachable", "librdkafka_config", "restore_consumer_config",
           "security_from_env", "table_consumer_config", "table_producer_config", "takeover_for"]


def security_from_env(env: Mapping[str, str]) -> dict[str, str]:
    """The TLS and SASL settings of the environment, as librdkafka keys."""
    return KafkaSecurityEnv.read(env).librdkafka()


def librdkafka_config(settings: Settings, **extra: Any) -> dict[str, Any]:
    """A confluent-kafka client configuration: bootstrap servers, security, `extra`.

    Reconnects back off to 1 s at most (librdkafka's default goes up to 10 s): after
    a broker restart every client is back within a second of the broker, not ten.

    Each client connects to the brokers it learns of at once. Connecting on demand
    (librdkafka's default), a new client's first request after the bootstrap waited
    out librdkafka's suppression of new connections (50 ms) for the broker it had just
    learned of: each of the processor's new producers and restore readers, in turn, at
    every start and assignment (issue #22).

    No re-bootstrap (`metadata.recovery.strategy` none, the Java client's default up to
    Kafka 3.9; librdkafka 2.16's is KIP-1102's "rebootstrap"). For an hour of broker
    restarts on 2026-12-05 the takeover's request after each restart timed out (3 s);
    librdkafka's debug log of one showed the processor's admin client decommission the
    one broker it knew while it was down (re-bootstrap), then that broker's thread
    loop "terminating" with references held. Side by side the failure did not recur
    with either setting (docs/benchmarks.md): what this buys is not measured."""
    return {"bootstrap.servers": settings.bootstrap, "reconnect.backoff.max.ms": 1_000,
            "enable.sparse.connections": False, "metadata.recovery.strategy": "none",
            **settings.kafka_security, **extra}


def table_consumer_config(settings: Settings, group_id: str, client_id: str, *,
                          offset_reset: str = "earliest",
                          group_instance_id: str | None = None) -> dict[str, Any]:
    """The table loop's group consumer: read_committed, offsets committed only with
    the transaction, range assignment (co-partitioned topics stay together)."""
    session_ms = session_timeout_ms(settings)  # the broker's minimum, if higher
    config = librdkafka_config(settings, **{
        "log_level": 3,
        "client.id": client_id,
        "group.id": group_id,
        "enable.auto.commit": False,
        "auto.offset.reset": offset_reset,
        "isolation.level": "read_committed",
        "session.timeout.ms": session_ms,
        "heartbeat.interval.ms": heartbeat_interval_ms(session_ms),
        # A fetch comes back on the first record written; this bounds an idle one (at
        # 20 ms: 50 fetches a second from an idle processor, issue #22) and how long
        # newly assigned partitions or a rewind wait for the fetch parked at the broker.
        "fetch.wait.max.ms": 100,
        "partition.assignment.strategy": "range",
    })
    if group_instance_id is not None:  # static membership: a restart takes its partitions back at once
        config["group.instance.id"] = group_instance_id
    return config


def table_producer_config(settings: Settings, client_id: str, *, transactional_id: str | None,
                          linger_ms: int, transaction_timeout_ms: int = 60_000) -> dict[str, Any]:
    """The table loop's producer: idempotent, and transactional unless
    `transactional_id` is None (at_least_once, benchmarks only)."""
    config = librdkafka_config(settings, **{
        "log_level": 3,
        "client.id": client_id,
        "partitioner": "murmur2_random",
        "linger.ms": linger_ms,
        "enable.idempotence": True,
    })
    if transactional_id is not None:
        config["transactional.id"] = transactional_id
        # A transaction begun right after the last one's commit finds the coordinator
        # still completing it (CONCURRENT_TRANSACTIONS) and is retried after this
        # backoff, doubled on each retry: at librdkafka's 100 ms, that was most of every
        # decision's latency (commits took 90-130 ms on a 2-core machine, 35-60 ms with
        # 10 ms). The coordinator needs a few ms: retry after 2, then 4, 8... capped at
        # 50 ms so that a longer outage (a leader election) is not hammered.
        # `python -m bench.txn_backoff` measures it side by side.
        config["retry.backoff.ms"] = 2
        config["retry.backoff.max.ms"] = 50
        # A crashed instance's open transaction blocks read_committed readers until
        # it is aborted: by the same instance restarting (init_transactions), by the
        # one taking its partitions over (streams.kafka.takeover: the processor), or
        # else by the coordinator after this long. The processor's 60 s outlast a
        # broker restart (15-25 s on a loaded machine): the coordinator would abort
        # the transaction in flight and fence the producer, a fatal error, and the
        # process would start cold instead of carrying on. The connector, which
        # fences nobody, keeps 10 s (streams.connectors.relay).
        config["transaction.timeout.ms"] = transaction_timeout_ms
    return config


def brokers_reachable(settings: Settings) -> Callable[[], bool]:
    """A probe: whether any bootstrap server accepts a TCP connection now (1 s each)."""
    addresses = [(host, int(port)) for host, _, port in
                 (server.strip().rpartition(":") for server in settings.bootstrap.split(","))]

    def probe() -> bool:
        for address in addresses:
            with contextlib.suppress(OSError), socket.create_connection(address, timeout=1.0):
                return True
        return False

    return probe


def takeover_for(settings: Settings, group_id: str, transactional_id: str,
                 member_id: str) -> Takeover:
    """What fences the deposed writers of partitions this table loop takes over."""
    return Takeover(Writer(transactional_id, member_id), group_id,
                    librdkafka_config(settings, log_level=3),
                    lambda deposed: table_producer_config(settings, f"fence-{member_id}",
                                                          transactional_id=deposed, linger_ms=0))


def restore_consumer_config(settings: Settings, group_id: str) -> dict[str, Any]:
    """A consumer that reads changelog partitions to their end outside any group
    assignment (read_committed, with end-of-partition events)."""
    return librdkafka_config(settings, **{
        "log_level": 3, "group.id": group_id, "enable.auto.commit": False,
        "isolation.level": "read_committed", "enable.partition.eof": True,
        # The end of a partition is known when a fetch comes back empty: without this
        # it waited 500 ms for data that a restore does not want.
        "fetch.wait.max.ms": 10})


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
