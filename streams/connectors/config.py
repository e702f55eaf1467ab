"""The connector's settings, read from the environment once (beside `Settings`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, model_validator

from streams.config import Settings
from streams.env import Section, parse_list
from streams.identity import instance_id

__all__ = ["ConnectorConfig", "ConnectorEnv", "instance_id_for"]


def instance_id_for(settings: Settings) -> str:
    """Stable across restarts of one instance (same data folder): its transactional
    id and static group membership, so a restart replaces its crashed self at once.
    Unique per data folder's contents (`streams.identity`), so replicas never fence
    each other."""
    return instance_id(settings, prefix="c")


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
    offset_reset: Literal["earliest", "latest"]  # where a new connector group starts in the events
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
        read = ConnectorEnv.read({**os.environ, **(overrides or {})})
        return cls(
            signing_secret=read.signing_secret,
            bot_token=read.bot_token,
            slack_api_url=read.slack_api_url.rstrip("/"),
            http_host=read.http_host,
            http_port=read.http_port,
            inbound_timeout_s=read.inbound_timeout_s,
            signature_window_s=read.signature_window_s,
            # A call fenced just before a pause must not outlive the session timeout,
            # after which another instance owns the thread.
            lease_s=min(read.lease_s, settings.session_timeout_ms / 2000),
            clock_margin_s=read.clock_margin_s,
            call_timeout_s=read.call_timeout_s,
            retry_after_max_s=read.retry_after_max_s,
            concurrency=read.concurrency,
            webhook_url=read.webhook_url,
            webhook_secret=read.webhook_secret,
            webhook_max_attempts=read.webhook_max_attempts,
            webhook_backoff_s=read.webhook_backoff_s,
            webhook_backoff_max_s=read.webhook_backoff_max_s,
            audit_retention_ms=int(read.audit_retention_s * 1000),
            offset_reset=read.offset_reset,
            crash_after_call=read.crash_after_call,
            crash_kinds=frozenset(read.crash_kinds),
        )


class ConnectorEnv(Section):
    """The variables of `ConnectorConfig`, with their defaults."""

    signing_secret: str = Field("", alias="THREADLINE_SLACK_SIGNING_SECRET")
    bot_token: str = Field("", alias="THREADLINE_SLACK_BOT_TOKEN")
    slack_api_url: str = Field("https://slack.com/api", alias="THREADLINE_SLACK_API_URL")
    http_host: str = Field("127.0.0.1", alias="THREADLINE_CONNECTOR_HTTP_HOST")
    http_port: int = Field(8091, ge=0, le=65_535, alias="THREADLINE_CONNECTOR_HTTP_PORT")
    inbound_timeout_s: float = Field(2.5, gt=0, alias="THREADLINE_CONNECTOR_INBOUND_TIMEOUT_S")
    signature_window_s: float = Field(300.0, gt=0, alias="THREADLINE_SLACK_SIGNATURE_WINDOW_S")
    lease_s: float = Field(2.0, gt=0, alias="THREADLINE_CONNECTOR_LEASE_S")  # at most half the session
    clock_margin_s: float = Field(1.0, ge=0, alias="THREADLINE_CONNECTOR_CLOCK_MARGIN_S")
    call_timeout_s: float = Field(10.0, gt=0, alias="THREADLINE_CONNECTOR_CALL_TIMEOUT_S")
    retry_after_max_s: float = Field(300.0, ge=0, alias="THREADLINE_CONNECTOR_RETRY_AFTER_MAX_S")
    concurrency: int = Field(8, gt=0, alias="THREADLINE_CONNECTOR_CONCURRENCY")
    webhook_url: str = Field("", alias="THREADLINE_WEBHOOK_URL")
    webhook_secret: str = Field("", alias="THREADLINE_WEBHOOK_SECRET")
    webhook_max_attempts: int = Field(10, gt=0, alias="THREADLINE_WEBHOOK_MAX_ATTEMPTS")
    webhook_backoff_s: float = Field(0.5, ge=0, alias="THREADLINE_WEBHOOK_BACKOFF_S")
    webhook_backoff_max_s: float = Field(60.0, ge=0, alias="THREADLINE_WEBHOOK_BACKOFF_MAX_S")
    audit_retention_s: float = Field(90 * 86_400, gt=0, alias="THREADLINE_AUDIT_RETENTION_S")
    offset_reset: Literal["earliest", "latest"] = Field("earliest",
                                                        alias="THREADLINE_CONNECTOR_OFFSET_RESET")
    # Test switches: the probability of os._exit(137) after a call, and the outbox kinds
    # it applies to (empty: all).
    crash_after_call: float = Field(0.0, ge=0, le=1, alias="THREADLINE_CONNECTOR_CRASH_AFTER_CALL")
    crash_kinds: Annotated[tuple[str, ...], BeforeValidator(parse_list)] = Field(
        (), alias="THREADLINE_CONNECTOR_CRASH_KINDS")

    @model_validator(mode="after")
    def _a_webhook_needs_a_secret(self) -> ConnectorEnv:
        if self.webhook_url and not self.webhook_secret:
            raise ValueError("THREADLINE_WEBHOOK_URL is set but THREADLINE_WEBHOOK_SECRET is empty: "
                             "the receiver could not tell our requests from anyone's")
        return self
