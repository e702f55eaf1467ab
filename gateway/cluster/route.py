"""Requests about a thread another gateway holds: sent on whole to that gateway.

A gateway of a group holds the read model of its share of the partitions only
(`gateway.model.placement`). A handler that reads a thread held elsewhere before
it has done anything raises `HeldElsewhere`; this middleware then sends the whole
request to the partition's owner, as a hop (`gateway.cluster.hop`: the tenant this
gateway authenticated, a MAC over the method, the path and query, and the body's
digest), and relays its answer as it comes (a long poll or a page alike). The
client's key was checked here, once; its post was counted here, once.

A hop that reaches a gateway that no longer holds the partition (a rebalance moved
it) is answered 421, and is sent again to the owner the map names next, for as long
as a dead owner takes to leave the group. A request whose hop failed after it was
sent is not sent again unless it is a GET (a POST may have been applied): the client
gets 502 and retries, as the API's idempotency keys allow.

Streams (`served_here`) and requests that published a command stay here: their
reads are asked of the owner one by one (`gateway.cluster.reads`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Middleware

from gateway.cluster.hop import HOP_HEADER, hop_target
from gateway.cluster.remote import Forwarder
from gateway.http.auth import HOPPED, INTERNAL_PREFIX, TENANT
from gateway.http.problems import Handler, Problem
from gateway.model.placement import FORWARD, REMOTE, ROUTE, HeldElsewhere, is_served_here
from streams.observability.metrics import gateway_metrics

__all__ = ["route_middleware"]

log = logging.getLogger("threadline.gateway")

# Not sent on: the connection's own, the client's credentials (the hop replaces
# them), and what would make the owner's answer differ from this gateway's (an
# encoding the relay would have to undo, CORS, which this gateway adds itself).
_DROPPED_REQUEST = frozenset({
    "host", "connection", "keep-alive", "proxy-authorization", "proxy-connection", "te",
    "trailer", "transfer-encoding", "upgrade", "content-length", "authorization", "cookie",
    "x-api-key", "accept-encoding", "origin", HOP_HEADER.lower(), "threadline-hop-partition",
    "threadline-hops"})
# A long poll sent on (LangGraph's `runs/wait` and `join`) answers when its run ends:
# no read limit (a killed owner's socket is reset, and the client's own limits apply).
_NO_READ_LIMIT = aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=None)
# What routing a request sent on carries (not trusted for more than routing).
_HOP_PARTITION, _HOPS = "Threadline-Hop-Partition", "Threadline-Hops"
_DROPPED_RESPONSE = frozenset({
    "connection", "keep-alive", "transfer-encoding", "content-length", "server", "date",
    "upgrade", "trailer"})


def route_middleware(forwarder: Forwarder | None,
                     here: Callable[[int], bool] = lambda partition: True) -> Middleware:
    """Serve here, or send on whole to the partition's owner (see the module). The
    innermost middleware: the request's tenant is known and its post counted. `here`:
    whether this gateway's read model holds a partition now."""
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        hopped = request.get(HOPPED, False)
        ROUTE.set(REMOTE if is_served_here(request.match_info.handler) and not hopped
                  else FORWARD)
        try:
            return await handler(request)
        except HeldElsewhere as exc:
            if request.path.startswith(INTERNAL_PREFIX) or (hopped and not _onward(request, exc)):
                raise Problem(421, "misdirected", "this gateway does not hold the thread's "
                              "partition") from None
            if ROUTE.get() == REMOTE or forwarder is None:
                # A read that should have been asked of the owner: a defect, but the
                # request may be retried (a published command is idempotent).
                log.error("%s %s read a thread of partition %d held elsewhere after it "
                          "published", request.method, request.path, exc.partition)
                raise Problem(503, "unavailable", "retry the request",
                              headers={"Retry-After": "1"}) from None
            return await _send_on(request, handler, forwarder, here, exc.partition)

    return middleware


def _onward(request: web.Request, held: HeldElsewhere) -> bool:
    """Whether a request sent here may be sent on once more: it was sent for another
    partition (a LangGraph thread id names one of two threads), and only once."""
    return request.headers.get(_HOPS) == "1" and \
        request.headers.get(_HOP_PARTITION) != str(held.partition)


async def _send_on(request: web.Request, handler: Handler, forwarder: Forwarder,
                   here: Callable[[int], bool], partition: int) -> web.StreamResponse:
    board, tenant = forwarder.board, request[TENANT]
    body = await request.read() if request.body_exists else b""
    path_qs = request.raw_path
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROPPED_REQUEST}
    deadline = time.monotonic() + forwarder.owner_wait_s
    while True:
        if here(partition):
            # It came here meanwhile (this gateway was given it, and its read model
            # took it): nothing was done for the request yet, so it runs here again.
            return await handler(request)
        claim = board.owner(partition)
        if claim is not None:
            headers[_HOP_PARTITION] = str(partition)
            headers[_HOPS] = "2" if request.get(HOPPED) else "1"
            headers[HOP_HEADER] = forwarder.signer.sign(
                tenant, request.method, hop_target(path_qs, body), time.time())
            try:
                response = await forwarder.session.request(
                    request.method, claim.url + path_qs, data=body or None, headers=headers,
                    allow_redirects=False, timeout=_NO_READ_LIMIT)
            except aiohttp.ClientConnectorError as exc:  # not sent: send it elsewhere
                log.info("%s %s: owner %s unreachable: %s", request.method, request.path,
                         claim.url, exc)
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                if request.method != "GET":
                    raise Problem(502, "bad-gateway", "the gateway holding the thread did "
                                  "not answer; the request may have been applied, retry it "
                                  "with the same ids", headers={"Retry-After": "1"}) from exc
            else:
                if response.status != 421:
                    gateway_metrics().forwarded_requests.inc()
                    return await _relay(request, response)
                response.release()
        if time.monotonic() > deadline:
            raise Problem(503, "unavailable", "no gateway holds this thread now; retry",
                          headers={"Retry-After": "1"})
        await board.changed(0.2)


async def _relay(request: web.Request, response: aiohttp.ClientResponse) -> web.StreamResponse:
    """The owner's answer, as it comes."""
    out = web.StreamResponse(status=response.status, reason=response.reason)
    for name, value in response.headers.items():
        lowered = name.lower()
        if lowered not in _DROPPED_RESPONSE and not lowered.startswith("access-control-"):
            out.headers.add(name, value)
    try:
        await out.prepare(request)
        async for chunk in response.content.iter_any():
            await out.write(chunk)
        await out.write_eof()
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        log.info("%s %s: the owner's answer broke off: %s", request.method, request.path, exc)
        # The client's connection breaks off too: ended cleanly, a cut stream would pass
        # for a whole one (the AI SDK's chat would not resume).
        if request.transport is not None:
            request.transport.abort()
    finally:
        response.release()
    return out
