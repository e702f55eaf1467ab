"""The generic webhook sink: POST a run's final message to a configured URL.

Each request carries

    Content-Type: application/json
    Idempotency-Key: <outbox id>          the same for every retry of one message
    X-Threadline-Timestamp: <unix seconds>
    X-Threadline-Signature: v1=<hex HMAC-SHA256(secret, "{timestamp}.{body}")>

A 2xx is delivered; 408, 425, 429 and 5xx and transport failures are retried
with exponential backoff (or the receiver's `Retry-After`, capped) up to a number
of attempts; any other status refuses the message for good, a redirect too: it
is never followed. The secret must not be empty (anyone could sign). Retries go through the
outbox like every other call, so they survive restarts; a receiver that keeps
the idempotency keys it has seen turns the at-least-once requests into one effect.
"""

from __future__ import annotations

import hashlib
import hmac
import time

from streams.connectors.calls import BeforeSend, Done, HttpReply, Outcome, Refused, Retry
from streams.connectors.http_client import HttpClient

__all__ = ["SIGNATURE_HEADER", "TIMESTAMP_HEADER", "WebhookSink", "sign", "verify"]

SIGNATURE_HEADER = "X-Threadline-Signature"
TIMESTAMP_HEADER = "X-Threadline-Timestamp"
_RETRIED = frozenset({408, 425, 429})


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The webhook's v1 signature: HMAC-SHA256 of timestamp and body."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "v1=" + mac.hexdigest()


def verify(secret: str, timestamp: str, body: bytes, signature: str, *, now_s: float,
           window_s: float = 300.0) -> bool:
    """For receivers: the signature is ours and the timestamp is recent."""
    try:
        fresh = abs(now_s - int(timestamp)) <= window_s
    except ValueError:
        return False
    return fresh and hmac.compare_digest(sign(secret, timestamp, body), signature)


class WebhookSink:
    """POSTs signed answers to the configured webhook URL."""
    def __init__(self, url: str, secret: str, timeout_s: float = 10.0,
                 http: HttpClient | None = None) -> None:
        if not secret:
            raise ValueError("a webhook needs a signing secret: an empty one lets anyone sign")
        self.url = url
        self.secret = secret
        self.timeout_s = timeout_s
        self.http = http or HttpClient()

    def post(self, body: str, outbox_id: str, before_send: BeforeSend | None = None) -> Outcome:
        """POST one signed body with its outbox id as Idempotency-Key; the outcome by status."""
        data = body.encode()
        timestamp = str(int(time.time()))
        headers = {"Content-Type": "application/json", "Idempotency-Key": outbox_id,
                   TIMESTAMP_HEADER: timestamp, SIGNATURE_HEADER: sign(self.secret, timestamp, data)}
        reply = self.http.request("POST", self.url, body=data, headers=headers,
                                  timeout_s=self.timeout_s, before_send=before_send)
        if not isinstance(reply, HttpReply):
            return reply
        if 200 <= reply.status < 300:
            return Done(None, f"HTTP {reply.status}")
        if reply.status >= 500 or reply.status in _RETRIED:
            return Retry(f"webhook: HTTP {reply.status}", reply.retry_after_s(), maybe_done=True,
                         rate_limited=reply.status == 429)
        if reply.redirect:
            return Refused(f"webhook: HTTP {reply.status} to {reply.headers.get('Location', '?')}, "
                           "not followed")
        return Refused(f"webhook: HTTP {reply.status}")

    def close(self) -> None:
        """Close the HTTP client's connections."""
        self.http.close()
