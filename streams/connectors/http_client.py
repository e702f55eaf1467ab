"""The connector's blocking HTTP client: kept-alive connections per origin, no
redirects, and the fence lease judged between opening a connection and writing
the request.

    take an idle connection of the origin that is still open, or open one
      (DNS, TCP, TLS: up to the call timeout)
    before_send()  -> False: NotSent, nothing written (the connection is kept)
    write the request, read the whole reply
    keep the connection for the next call, unless the server closes it

Built on `http.client` rather than urllib or a library: urllib follows
redirects (re-sending the bot token to wherever a 3xx points), asks for
`Connection: close` and opens a connection per call; and no pooled client at
hand (urllib3, aiohttp) lets the caller decide, after the connection is open and
before a byte of the request is written, whether to send at all, which is the
moment the lease must be checked. A 3xx is returned as a reply like any other.

Proxies from the environment (`https_proxy`, `http_proxy`, `no_proxy`) are
used as urllib uses them; loopback is never proxied.
"""

from __future__ import annotations

import base64
import http.client
import select
import ssl
import threading
import urllib.parse
import urllib.request
from collections.abc import Mapping

from streams.connectors.calls import BeforeSend, HttpReply, NotSent, Retry

__all__ = ["HttpClient"]

_Origin = tuple[str, str, int]  # scheme, host, port
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


class HttpClient:
    """A thread-safe HTTP/1.1 client that keeps idle connections per origin for reuse."""
    def __init__(self, max_idle_per_origin: int = 8) -> None:
        self._idle: dict[_Origin, list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()
        self._max_idle = max_idle_per_origin
        self._tls = ssl.create_default_context()

    def request(self, method: str, url: str, *, body: bytes | None, headers: Mapping[str, str],
                timeout_s: float, before_send: BeforeSend | None = None
                ) -> HttpReply | Retry | NotSent:
        """One HTTP exchange. Any status is an `HttpReply` (a redirect too, never
        followed). A connection that could not be opened is a `Retry` that was not
        sent; a failure once the request was being written may have had its effect."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        origin = (parts.scheme, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
        proxy = _proxy_for(parts.scheme, parts.hostname)
        target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        if proxy is not None and parts.scheme == "http":
            target = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path or "/",
                                              parts.query, ""))
        conn = self._take_idle(origin)
        if conn is None:
            conn = self._connection(origin, proxy, timeout_s)
            try:
                conn.connect()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                return Retry(f"{method} {url}: could not connect: {type(exc).__name__}: {exc}", None,
                             maybe_done=False)
        elif conn.sock is not None:
            conn.sock.settimeout(timeout_s)
        if before_send is not None and not before_send():
            self._keep(origin, conn)
            return NotSent("the fence lease ran out before the request was sent")
        try:
            conn.request(method, target, body=body, headers=dict(headers))
            response = conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:  # timeouts, resets, broken replies
            conn.close()
            return Retry(f"{method} {url}: {type(exc).__name__}: {exc}", None, maybe_done=True)
        if response.will_close:
            conn.close()
        else:
            self._keep(origin, conn)
        return HttpReply(response.status, dict(response.headers.items()), data)

    def close(self) -> None:
        """Close every idle connection."""
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()

    # --- the pool ------------------------------------------------------------------------

    def _take_idle(self, origin: _Origin) -> http.client.HTTPConnection | None:
        while True:
            with self._lock:
                conns = self._idle.get(origin)
                if not conns:
                    return None
                conn = conns.pop()
            if _still_open(conn):
                return conn
            conn.close()

    def _keep(self, origin: _Origin, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            conns = self._idle.setdefault(origin, [])
            if len(conns) < self._max_idle:
                conns.append(conn)
                return
        conn.close()

    def _connection(self, origin: _Origin, proxy: urllib.parse.SplitResult | None,
                    timeout_s: float) -> http.client.HTTPConnection:
        scheme, host, port = origin
        if proxy is None or not proxy.hostname:
            if scheme == "https":
                return http.client.HTTPSConnection(host, port, timeout=timeout_s, context=self._tls)
            return http.client.HTTPConnection(host, port, timeout=timeout_s)
        proxy_port = proxy.port or (443 if proxy.scheme == "https" else 80)
        if scheme == "http":  # a plain request in absolute form, to the proxy
            return http.client.HTTPConnection(proxy.hostname, proxy_port, timeout=timeout_s)
        tunnel = http.client.HTTPSConnection(proxy.hostname, proxy_port, timeout=timeout_s,
                                             context=self._tls)
        auth = {}
        if proxy.username:
            user_pass = f"{urllib.parse.unquote(proxy.username)}:{urllib.parse.unquote(proxy.password or '')}"
            auth["Proxy-Authorization"] = "Basic " + base64.b64encode(user_pass.encode()).decode()
        tunnel.set_tunnel(host, port, headers=auth)
        return tunnel


def _still_open(conn: http.client.HTTPConnection) -> bool:
    """An idle connection with anything to read was closed by the server (or sent
    what nobody asked for): either way it is not reused."""
    if conn.sock is None:
        return False
    try:
        readable, _, _ = select.select([conn.sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


def _proxy_for(scheme: str, host: str) -> urllib.parse.SplitResult | None:
    if host in _LOOPBACK or urllib.request.proxy_bypass(host):
        return None
    proxy = urllib.request.getproxies().get(scheme)
    if not proxy:
        return None
    return urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
