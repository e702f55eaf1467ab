"""The hop between gateways: one gateway asks another on a client's behalf.

The gateway a client reached checks the client's key (once); the gateway it asks
trusts the tenant it names only under a MAC of the deployment's keys (the ones
that sign resume tokens: every gateway of a deployment shares them), over the
tenant, the request's method and path with its query, and an expiry. A stolen hop
header is good for that one request, for `HOP_TTL_S`.

    Threadline-Hop: <tenant, base64url>.<expiry, unix seconds>.<mac, hex>
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Sequence

__all__ = ["HOP_HEADER", "HOP_TTL_S", "BadHop", "HopSigner", "hop_target"]

HOP_HEADER = "Threadline-Hop"
HOP_TTL_S = 30
_DOMAIN = b"threadline gateway hop v1"
_MAX_CHARS = 2_000


class BadHop(ValueError):
    """A hop header that is malformed, expired, or not signed by this deployment."""


class HopSigner:
    """Signs the hops this gateway makes and verifies those it receives."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys or not all(keys):
            raise ValueError("hops need at least one non-empty key")
        # Keys of their own, derived: a hop MAC can never pass for a resume token's.
        self._keys = [hmac.new(k, _DOMAIN, hashlib.sha256).digest() for k in keys]

    def sign(self, tenant: str, method: str, path_qs: str, now_s: float) -> str:
        """The hop header's value for this request, valid `HOP_TTL_S` from `now_s`."""
        expiry = int(now_s) + HOP_TTL_S
        name = base64.urlsafe_b64encode(tenant.encode()).rstrip(b"=").decode()
        return f"{name}.{expiry}.{_mac(self._keys[0], name, expiry, method, path_qs)}"

    def verify(self, value: str, method: str, path_qs: str, now_s: float) -> str:
        """The tenant a valid hop names; BadHop otherwise."""
        if len(value) > _MAX_CHARS or value.count(".") != 2:
            raise BadHop("malformed hop")
        name, expiry_text, mac = value.split(".")
        if not expiry_text.isdigit():
            raise BadHop("malformed hop")
        expiry = int(expiry_text)
        if not any(hmac.compare_digest(mac, _mac(k, name, expiry, method, path_qs))
                   for k in self._keys):
            raise BadHop("hop not signed by this deployment")
        if expiry < now_s or expiry > now_s + 2 * HOP_TTL_S:
            raise BadHop("hop expired")
        try:
            return base64.urlsafe_b64decode(name + "=" * (-len(name) % 4)).decode()
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise BadHop("malformed hop") from exc


def _mac(key: bytes, name: str, expiry: int, method: str, path_qs: str) -> str:
    message = "\n".join((name, str(expiry), method.upper(), path_qs)).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def hop_target(path_qs: str, body: bytes) -> str:
    """What a whole request's hop MAC covers besides the tenant and method: the path
    and query, and the body's digest (a captured hop cannot carry another body)."""
    return f"{path_qs}#{hashlib.sha256(body).hexdigest()}" if body else path_qs
