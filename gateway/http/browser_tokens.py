"""Browser tokens: short-lived credentials a tenant's backend gives a browser, so that the
browser never holds the tenant's API key.

Pure: no I/O. `POST /v1/browser_tokens` (gateway.api.rest), called with an API key,
issues one: scoped to the key's tenant and optionally to one thread, valid for
`ttl_s` seconds (15 min by default, 1 h at most). The browser presents it as it would
a key (`Authorization: Bearer`, `x-api-key`, or `access_token` on an SSE URL); the
auth middleware (`gateway.http.auth`) admits it until it expires, as its tenant, and
with a thread scope only on that thread's routes. A browser token cannot issue
another.

A token is ``tlb1.<payload>.<mac>``: base64url of the JSON payload (tenant, thread or
null, expiry in Unix seconds), and base64url of HMAC-SHA256 over ``tlb1.<payload>``
with a key derived from the resume-token keys (`THREADLINE_RESUME_TOKEN_KEYS`, or the
key derived from the API keys: `gateway.live.tokens`), so every gateway of a
deployment verifies every other's, and rotating those keys rotates these. Nothing is
stored: a token cannot be revoked before it expires; keep `ttl_s` short.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.live.tokens import deployment_keys
from streams.config import Settings

__all__ = ["DEFAULT_TTL_S", "MAX_TTL_S", "PREFIX", "BadBrowserToken", "BrowserGrant",
           "BrowserTokens"]

PREFIX = "tlb1."
DEFAULT_TTL_S = 900
MAX_TTL_S = 3600
_MAX_CHARS = 1024
_LABEL = b"threadline browser tokens\0"


class BadBrowserToken(ValueError):
    """A browser token that is malformed, not signed by this deployment, or expired."""


@dataclass(frozen=True, slots=True)
class BrowserGrant:
    """What a valid browser token grants: a tenant, maybe one thread, until when."""

    tenant: str
    thread_id: str | None
    expires_at_s: int


class BrowserTokens:
    """Issues browser tokens and verifies those presented."""

    def __init__(self, base_keys: Sequence[bytes]) -> None:
        if not base_keys or not all(base_keys):
            raise ValueError("browser tokens need at least one non-empty key")
        # Keys of their own, derived: a resume token's MAC can never pass for one of these.
        self._keys = tuple(hmac.digest(key, _LABEL, "sha256") for key in base_keys)

    @classmethod
    def from_settings(cls, settings: Settings) -> BrowserTokens:
        """Keyed as the deployment's resume tokens are (`gateway.live.tokens`)."""
        return cls(deployment_keys(settings))

    def issue(self, tenant: str, thread_id: str | None, ttl_s: int, now_s: float) -> tuple[str, int]:
        """A token for `tenant` (and `thread_id`, if given) valid `ttl_s` from `now_s`,
        and its expiry (Unix seconds)."""
        expires = int(now_s) + ttl_s
        body = json.dumps({"t": tenant, "th": thread_id, "exp": expires}, separators=(",", ":"))
        payload = _b64(body.encode())
        return f"{PREFIX}{payload}.{_mac(self._keys[0], payload)}", expires

    def verify(self, token: str, now_s: float) -> BrowserGrant:
        """The grant of a token this deployment issued and that has not expired; else
        BadBrowserToken (saying which, never which key)."""
        if len(token) > _MAX_CHARS or not token.startswith(PREFIX):
            raise BadBrowserToken("not a browser token")
        payload, _, mac = token.removeprefix(PREFIX).partition(".")
        if not any(hmac.compare_digest(_mac(key, payload), mac) for key in self._keys):
            raise BadBrowserToken("the browser token's signature does not hold")
        try:
            body = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
            grant = BrowserGrant(str(body["t"]), None if body["th"] is None else str(body["th"]),
                                 int(body["exp"]))
        except (binascii.Error, ValueError, KeyError, TypeError) as exc:
            raise BadBrowserToken("the browser token is malformed") from exc
        if grant.expires_at_s <= now_s:
            raise BadBrowserToken("the browser token has expired")
        return grant


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _mac(key: bytes, payload: str) -> str:
    return _b64(hmac.digest(key, (PREFIX + payload).encode(), hashlib.sha256))
