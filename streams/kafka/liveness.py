"""How fast a member lost for good is noticed: the consumer groups' session timeout.

A member that stops heartbeating for the session timeout is expelled and its
partitions move; that is the only way Kafka learns that a process on a lost host is
gone. `THREADLINE_SESSION_TIMEOUT_S` (2 s) is that time, and every group member
heartbeats five times in it (`heartbeat_interval_ms`).

A broker refuses a session timeout below its `group.min.session.timeout.ms` (6 s on
a stock broker, 1 s on the embedded one and in docker-compose.yml): a join would
fail again and again. So `session_timeout_ms` reads the broker's minimum once per
process and raises the timeout to it when it is higher, with a warning that says
what that costs. If the broker's configuration cannot be read (no DescribeConfigs
ACL), the setting is used as it is.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

from streams.config import Settings

__all__ = ["heartbeat_interval_ms", "session_timeout_ms"]

log = logging.getLogger("threadline.kafka.liveness")

MIN_SESSION_KEY = "group.min.session.timeout.ms"
TIMEOUT_S = 10.0


def session_timeout_ms(settings: Settings) -> int:
    """The session timeout to ask for: the setting, or the broker's minimum if higher."""
    # The roles' own client configuration (security, reconnects, connecting at once);
    # imported here: streams.kafka.clients imports this module.
    from streams.kafka.clients import librdkafka_config

    floor = _broker_minimum(tuple(sorted(librdkafka_config(settings, log_level=0).items())))
    if floor is not None and floor > settings.session_timeout_ms:
        log.warning("THREADLINE_SESSION_TIMEOUT_S is %.1f s, below the broker's %s (%.1f s): "
                    "using %.1f s, so a member lost for good is noticed that late; lower %s on "
                    "the brokers (docs/operations.md)", settings.session_timeout_ms / 1000,
                    MIN_SESSION_KEY, floor / 1000, floor / 1000, MIN_SESSION_KEY)
        return floor
    return settings.session_timeout_ms


def heartbeat_interval_ms(session_ms: int) -> int:
    """Five heartbeats a session (between 0.1 and 1 s)."""
    return max(100, min(1_000, session_ms // 5))


@functools.cache
def _broker_minimum(config: tuple[tuple[str, Any], ...]) -> int | None:
    admin = AdminClient(dict(config))
    try:
        brokers = admin.list_topics(timeout=TIMEOUT_S).brokers
        if not brokers:
            return None
        resource = ConfigResource(ConfigResource.Type.BROKER, str(min(brokers)))
        configs = admin.describe_configs([resource], request_timeout=TIMEOUT_S)[resource]
        entry = configs.result(TIMEOUT_S).get(MIN_SESSION_KEY)
        return int(entry.value) if entry is not None and entry.value else None
    except (KafkaException, TimeoutError, ValueError) as exc:
        log.info("could not read the broker's %s (%s); using the session timeout as set",
                 MIN_SESSION_KEY, exc)
        return None
