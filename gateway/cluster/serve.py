"""The owner's side of a forwarded stream (`gateway.cluster.remote`): the thread's
stream on this gateway's feed, as lines of JSON to the gateway that asked.

Authenticated by the hop header alone (the asking gateway checked the client's
key: `gateway.http.auth`). A gateway that does not own the thread's partition (a
rebalance moved it) answers 421, and the asking one looks for the new owner.
"""

from __future__ import annotations

import contextlib

from aiohttp import web

from gateway.cluster.remote import item_line, parse_start_param, start_line
from gateway.http.auth import TENANT
from gateway.http.problems import Problem
from gateway.keys import FEED, READ_MODEL
from gateway.live.feed import NotOwned
from gateway.live.run_stream import STREAMS

__all__ = ["internal_stream"]

NDJSON = {"Content-Type": "application/x-ndjson", "Cache-Control": "no-cache"}


async def internal_stream(request: web.Request) -> web.StreamResponse:
    """GET /internal/v1/threads/{thread_id}/stream (a hop; see the module)."""
    tenant, thread_id = request[TENANT], request.match_info["thread_id"]
    config = request.config_dict
    feed = config[FEED]
    if not feed.owns(feed.partition_of(thread_id)):
        raise Problem(421, "misdirected", "this gateway does not own the thread's partition")
    state = await config[READ_MODEL].thread(tenant, thread_id)
    if state is None:
        raise Problem(404, "not-found", "no such thread")
    run = None
    run_id = request.query.get("run_id")
    if run_id:
        run = await config[READ_MODEL].run(tenant, run_id)
        if run is None or run.state.thread_id != thread_id:
            raise Problem(404, "not-found", "no such run")
    async with contextlib.AsyncExitStack() as opened:
        try:
            # The tenant's stream slot is held by the gateway the client reached.
            stream = await opened.enter_async_context(config[STREAMS].open_local(
                tenant, state, run, after=request.query.get("after"),
                last_message_id=request.query.get("last_message_id"), slot=False,
                start=parse_start_param(request.query.get("start"))))
        except NotOwned:  # a rebalance moved it while the stream's start was found
            raise Problem(421, "misdirected", "the thread's partition moved to another "
                          "gateway") from None
        response = web.StreamResponse(headers=NDJSON)
        await response.prepare(request)
        try:
            if stream.start is not None:
                await response.write(start_line(stream.start))
            async for caught_up in stream.catch_up():
                await response.write(item_line(caught_up))
            await response.write(item_line(None))  # live from here
            async for item in stream.live():
                await response.write(item_line(item))
            await response.write(item_line(None, stream.end_reason()))
        except ConnectionError:
            pass  # the asking gateway went away
        return response

