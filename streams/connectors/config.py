"""The connector's settings, read from the environment once (beside `Settings`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from streams.config import Settings
from streams.identity import instance_id

__all__ = ["ConnectorConfig", "instance_id_for"]


def instance_id_for(settings: Settings) -> str:
    """Stable across restarts of one instance (same data folder): its transactional
    id and static group membership, so a restart replaces its crashed self at once.
    Unique per data folder's contents (`streams.identity`), so replicas never fence
    each other."""
    return instance_id(settings, prefix="c")


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    return default if raw in (None, "") else float(raw)


@dataclass(frozen=True, slots=True)
class ConnectorConfig:
    """The chat connector's settings: Slack, webhook, HTTP listener, leases and limits."""
    signing_secret: str  # Slack's signing secret; empty: every event is refused
    bot_token: str  # Slack bot token; empty: nothing is posted to the chat
    slack_api_url: str
    http_host: str
    http_port: int
    inbound_timeout_s: float  # the Kafka write must be acked within this (Slack allows 3 s)
    signature_window_s: float
    lease_s: float  # a fenced call must start within this, or it is fenced again
    clock_margin_s: float  # added to a lease before another owner reconciles
    call_timeout_s: float
    retry_after_max_s: float  # a server's Retry-After is obeyed up to this
    concurrency: int  # chat and webhook calls in flight at once
    webhook_url: str  # empty: no webhook
    webhook_secret: str
    webhook_max_attempts: int
    webhook_backoff_s: float
    webhook_backoff_max_s: float
    audit_retention_ms: int
    offset_reset: str  # where a new connector group starts in the events: earliest | latest
    crash_after_call: float  # test switch: probability of os._exit(137) after a call
    crash_kinds: frozenset[str]  # test switch: the outbox kinds it applies to (empty: all)

    @property
    def chat_enabled(self) -> bool:
        """Whether a Slack bot token is set, so answers are posted to the chat."""
        return bool(self.bot_token)

    @property
    def webhook_enabled(self) -> bool:
        """Whether a webhook URL is set, so answers are also POSTed there."""
        return bool(self.webhook_url)

    @classmethod
    def from_env(cls, settings: Settings, overrides: Mapping[str, str] | None = None
                 ) -> ConnectorConfig:
        """The connector's settings from THREADLINE_* variables (plus overrides)."""
        env = {**os.environ, **(overrides or {})}
        # A call fenced just before a pause must not outlive the session timeout,
        # after which another instance owns the thread.
        lease = min(_float(env, "THREADLINE_CONNECTOR_LEASE_S", 2.0),
                     settings.session_timeout_ms / 2000)
        webhook_url = env.get("THREADLINE_WEBHOOK_URL", "")
        webhook_secret = env.get("THREADLINE_WEBHOOK_SECRET", "")
        if webhook_url and not webhook_secret:
            raise ValueError("THREADLINE_WEBHOOK_URL is set but THREADLINE_WEBHOOK_SECRET is empty: "
                             "the receiver could not tell our requests from anyone's")
        return cls(
            signing_secret=env.get("THREADLINE_SLACK_SIGNING_SECRET", ""),
            bot_token=env.get("THREADLINE_SLACK_BOT_TOKEN", ""),
            slack_api_url=env.get("THREADLINE_SLACK_API_URL", "https://slack.com/api").rstrip("/"),
            http_host=env.get("THREADLINE_CONNECTOR_HTTP_HOST", "127.0.0.1"),
            http_port=int(env.get("THREADLINE_CONNECTOR_HTTP_PORT") or 8091),
            inbound_timeout_s=_float(env, "THREADLINE_CONNECTOR_INBOUND_TIMEOUT_S", 2.5),
            signature_window_s=_float(env, "THREADLINE_SLACK_SIGNATURE_WINDOW_S", 300.0),
            lease_s=lease,
            clock_margin_s=_float(env, "THREADLINE_CONNECTOR_CLOCK_MARGIN_S", 1.0),
            call_timeout_s=_float(env, "THREADLINE_CONNECTOR_CALL_TIMEOUT_S", 10.0),
            retry_after_max_s=_float(env, "THREADLINE_CONNECTOR_RETRY_AFTER_MAX_S", 300.0),
            concurrency=int(env.get("THREADLINE_CONNECTOR_CONCURRENCY") or 8),
            webhook_url=webhook_url,
            webhook_secret=webhook_secret,
            webhook_max_attempts=int(env.get("THREADLINE_WEBHOOK_MAX_ATTEMPTS") or 10),
            webhook_backoff_s=_float(env, "THREADLINE_WEBHOOK_BACKOFF_S", 0.5),
            webhook_backoff_max_s=_float(env, "THREADLINE_WEBHOOK_BACKOFF_MAX_S", 60.0),
            audit_retention_ms=int(_float(env, "THREADLINE_AUDIT_RETENTION_S", 90 * 86_400) * 1000),
            offset_reset=env.get("THREADLINE_CONNECTOR_OFFSET_RESET") or "earliest",
            crash_after_call=_float(env, "THREADLINE_CONNECTOR_CRASH_AFTER_CALL", 0.0),
            crash_kinds=frozenset(k.strip() for k in env.get(
                "THREADLINE_CONNECTOR_CRASH_KINDS", "").split(",") if k.strip()),
        )
