"""Resume tokens: SSE event ids that only a gateway of this deployment can make.

Pure: no I/O. An event id names a position in the stream topic, and a client sends
it back (`Last-Event-ID`, `?last_event_id=`, `?last_entry_id=`) to resume; the
gateway then reads Kafka from the run's start (`run_start`) up to that position. A
position a client made up (say `run_start` 0) would make it scan a whole partition,
so every id is signed, and `ResumeTokens.verify` is the one place a token from a
client is read.

A token is base64url of ``v2.{partition}.{offset}.{sub}.{run_start}.{mac}.{run_id}``:
the positions stay readable (tests and the chaos tools read them; the run id stays
last), and ``mac`` is the first 16 bytes, base64url, of HMAC-SHA256 over the same
fields *and the thread id*. The thread id is not in the token: the verifier takes it
from the stream asked for, so a token only resumes the thread it was made for.

Keys: `THREADLINE_RESUME_TOKEN_KEYS`, comma-separated; the first signs, every one
verifies, so a key is rotated by putting the new one first, and dropping the old one
once no client holds its tokens (the stream topic's retention, 30 min by default).
Unset, the key derives from `THREADLINE_API_KEYS` and the topic prefix: every gateway
of a deployment agrees without configuration, and no tenant can derive it unless it
knows every API key (a deployment with one tenant should set the keys).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from streams.config import Settings

__all__ = ["BadEventId", "EventId", "ResumeTokens", "deployment_keys", "derived_key"]

_VERSION = "v2"
_MAC_BYTES = 16
_MAX_TOKEN_CHARS = 512
_TEXT = re.compile(r"v2\.(\d{1,6})\.(-?\d{1,19})\.(-?\d{1,3})\.(-?\d{1,19})\."
                   r"([A-Za-z0-9_-]{22})\.([0-9A-Za-z-]{1,64})")


class BadEventId(ValueError):
    """A Last-Event-ID (or last_event_id) that this deployment's gateways did not make."""


@dataclass(frozen=True, slots=True)
class EventId:
    """A verified position: offset and sub in the partition, and the run's start."""

    partition: int
    offset: int
    sub: int
    run_start: int
    run_id: str

    @property
    def position(self) -> tuple[int, int]:
        """The event's place in the partition: (offset, sub-index in the record)."""
        return (self.offset, self.sub)


def derived_key(api_keys: Mapping[str, str], topic_prefix: str) -> bytes:
    """The signing key when none is configured: the same in every gateway that shares
    the API keys and the topics, secret to anyone who does not hold all the keys."""
    material = "\0".join(f"{k}={t}" for k, t in sorted(api_keys.items()))
    return hashlib.sha256(f"threadline resume tokens\0{topic_prefix}\0{material}".encode()).digest()


def deployment_keys(settings: Settings) -> list[bytes]:
    """The keys every gateway of a deployment shares: `THREADLINE_RESUME_TOKEN_KEYS`
    (the first signs), or the one derived from the API keys and the topic prefix."""
    keys = settings.gateway.limits.resume_token_keys
    if keys:
        return [k.encode() for k in keys]
    return [derived_key(settings.gateway.api_keys, settings.topic_prefix)]


class ResumeTokens:
    """Signs the event ids the gateway sends, and verifies those clients send back."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys or not all(keys):
            raise ValueError("resume tokens need at least one non-empty key")
        self._signing = keys[0]
        self._keys = tuple(keys)

    @classmethod
    def from_settings(cls, settings: Settings) -> ResumeTokens:
        """Tokens signed with the configured keys, or a key derived from the API keys."""
        return cls(deployment_keys(settings))

    def sign(self, thread_id: str, partition: int, offset: int, sub: int, run_start: int,
             run_id: str) -> str:
        """A signed, URL-safe resume token (SSE event id) for this place in a run."""
        mac = _mac(self._signing, thread_id, partition, offset, sub, run_start, run_id)
        text = f"{_VERSION}.{partition}.{offset}.{sub}.{run_start}.{mac}.{run_id}"
        return base64.urlsafe_b64encode(text.encode()).rstrip(b"=").decode()

    def verify(self, token: str, thread_id: str) -> EventId:
        """The position `token` names, if a gateway of this deployment made it for
        `thread_id`; else BadEventId (the detail says what, never which key)."""
        if not token or len(token) > _MAX_TOKEN_CHARS:
            raise BadEventId("event id is empty or too long")
        try:
            text = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode("ascii")
        except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
            raise BadEventId("event id is not base64url") from exc
        match = _TEXT.fullmatch(text)
        if match is None:
            raise BadEventId("event id is not one of this gateway's ids")
        partition, offset, sub, start = (int(g) for g in match.groups()[:4])
        mac, run_id = match.group(5), match.group(6)
        if not any(hmac.compare_digest(
                _mac(key, thread_id, partition, offset, sub, start, run_id), mac)
                for key in self._keys):
            raise BadEventId("event id is not from this stream, or its signature does not hold")
        if offset < 0 or sub < -1 or start < -1 or start > offset:
            raise BadEventId("event id names an impossible position")
        return EventId(partition, offset, sub, start, run_id)


def _mac(key: bytes, thread_id: str, partition: int, offset: int, sub: int, run_start: int,
         run_id: str) -> str:
    signed = (f"{_VERSION}.{len(thread_id)}:{thread_id}.{partition}.{offset}.{sub}.{run_start}."
              f"{run_id}").encode()
    digest = hmac.digest(key, signed, "sha256")[:_MAC_BYTES]
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
