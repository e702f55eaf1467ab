"""The LangGraph API's threads and assistant (`gateway.adapters.langgraph`), and the request
helpers its run handlers share: reading a body, finding the tenant's thread by the id
its client knows (`gateway.adapters.langgraph.views`), the bounded `values` view. Bodies,
integers are `gateway.http.plumbing`'s, as for every API; the gateway's middleware answers
503 while it loads."""

from __future__ import annotations

import uuid
from typing import Any

from aiohttp import web

from gateway.adapters.langgraph.views import (
    ASSISTANT_ID,
    MAX_THREAD_ID_CHARS,
    assistant,
    conversation,
    internal_thread_id,
    lg_message,
    lg_thread_id,
    thread_json,
    thread_status,
)
from gateway.api.copies import copy_into
from gateway.http.auth import TENANT
from gateway.http.plumbing import END_SEQ, int_field, is_text, read_json_body
from gateway.http.problems import Problem
from gateway.keys import BUS, READ_MODEL
from gateway.model.decisions import new_traceparent
from gateway.model.placement import served_here
from streams.clock import now_ms
from streams.core.domain import CreateThread, ThreadCreated, ThreadState

__all__ = ["ASSISTANT_NAMES", "MAX_OFFSET", "MAX_PAGE", "VALUES_CAP", "copy_thread",
           "create_lg_thread", "create_thread", "find_thread", "get_assistant", "get_thread",
           "own_thread", "search_assistants", "search_threads", "values_view"]

VALUES_CAP = 50  # messages in a `values` part or a state, newest first (page with ?before=)
SEARCH_VALUES_CAP = 10  # messages in each thread of a search
MAX_PAGE = 100
MAX_OFFSET = 1000
ASSISTANT_NAMES = frozenset({ASSISTANT_ID, "agent"})


async def find_thread(request: web.Request, lg_id: str) -> ThreadState | None:
    """The tenant's thread its LangGraph client calls `lg_id`, or None."""
    if not is_text(lg_id) or not lg_id or len(lg_id) > MAX_THREAD_ID_CHARS:
        return None
    tenant, read_model = request[TENANT], request.config_dict[READ_MODEL]
    internal = internal_thread_id(tenant, lg_id)
    if not _is_uuid(lg_id):
        return await read_model.thread(tenant, internal)
    # Two candidates, in two partitions maybe: the first is looked at wherever it is
    # held (a gateway group), and the request goes where the one found is.
    state = await read_model.thread(tenant, internal, peek=True)
    if state is not None:
        read_model.here_or_elsewhere(internal)
        return state
    return await read_model.thread(tenant, lg_id)  # a thread made over /v1, by its own id


async def own_thread(request: web.Request) -> ThreadState:
    """The thread named in the path, or 404."""
    state = await find_thread(request, request.match_info["thread_id"])
    if state is None:
        raise Problem(404, "not-found", "no such thread")
    return state


def _is_uuid(text: str) -> bool:
    try:
        return str(uuid.UUID(text)) == text
    except ValueError:
        return False


async def values_view(request: web.Request, state: ThreadState, cap: int | None = None,
                      before: int | None = None) -> tuple[dict[str, Any], int | None]:
    """The newest `cap` (VALUES_CAP) messages before seq `before`, and the seq to page on
    from (None at the first message)."""
    page = await request.config_dict[READ_MODEL].current_page(  # the current branch
        state, before=END_SEQ if before is None else before,
        limit=VALUES_CAP if cap is None else cap)
    older = page.records[0].seq if page.more and page.records else None
    queued = {q.message_id for q in state.queued}
    return {"messages": [lg_message(r) for r in conversation(page.records, queued)]}, older


async def create_thread(request: web.Request) -> web.Response:
    """POST /threads {thread_id?, metadata?, if_exists?}"""
    body = await read_json_body(request, required=False)
    lg_id = body.get("thread_id") or str(uuid.uuid4())
    if not is_text(lg_id) or len(lg_id) > MAX_THREAD_ID_CHARS or \
            not lg_id.isprintable() or "/" in lg_id:
        raise Problem(422, "invalid-body", f"'thread_id' must be 1 to {MAX_THREAD_ID_CHARS} "
                      "printable characters without '/'", field="thread_id")
    existing = await find_thread(request, lg_id)
    if existing is not None:
        if body.get("if_exists") == "do_nothing":
            return web.json_response(thread_json(existing, (await values_view(request, existing))[0]))
        raise Problem(409, "thread-exists", "a thread with this id exists")
    state = await create_lg_thread(request, lg_id)
    return web.json_response(thread_json(state, {"messages": []}))


async def create_lg_thread(request: web.Request, lg_id: str) -> ThreadState:
    """Create the tenant's thread `lg_id` (its title keeps the id)."""
    tenant = request[TENANT]
    thread_id = internal_thread_id(tenant, lg_id)
    request.config_dict[READ_MODEL].note_write(thread_id)
    event = await request.config_dict[BUS].decide(
        CreateThread(thread_id, tenant, lg_id, now_ms()), tenant,
        new_traceparent(request.headers.get("traceparent")))
    at = event.at_ms if isinstance(event, ThreadCreated) else now_ms()
    return ThreadState(thread_id=thread_id, tenant=tenant, title=lg_id, created_at_ms=at)


async def get_thread(request: web.Request) -> web.Response:
    """GET /threads/{thread_id}"""
    state = await own_thread(request)
    return web.json_response(thread_json(state, (await values_view(request, state))[0]))


@served_here  # it gathers threads from every gateway: each read goes where it is held
async def search_threads(request: web.Request) -> web.Response:
    """POST /threads/search {limit, offset, ids?, status?}: newest first."""
    body = await read_json_body(request, required=False)
    limit = int_field(body.get("limit"), "limit", 10, MAX_PAGE)
    offset = int_field(body.get("offset"), "offset", 0, MAX_OFFSET)
    status = body.get("status")
    ids = body.get("ids")
    read_model, tenant = request.config_dict[READ_MODEL], request[TENANT]
    states: list[ThreadState] = []
    if isinstance(ids, list):
        for lg_id in ids[:MAX_PAGE]:
            found = await find_thread(request, lg_id) if isinstance(lg_id, str) else None
            if found is not None:
                states.append(found)
    else:
        after = None
        while len(states) < offset + limit:
            page = await read_model.threads(tenant, after=after, limit=MAX_PAGE)
            states += page.states
            if not page.more or not page.states:
                break
            last = page.states[-1]
            after = (last.updated_at_ms or last.created_at_ms, last.thread_id)
    chosen = [s for s in states if status is None or thread_status(s) == status]
    return web.json_response([
        thread_json(s, (await values_view(request, s, SEARCH_VALUES_CAP))[0])
        for s in chosen[offset:offset + limit]])


async def copy_thread(request: web.Request) -> web.Response:
    """POST /threads/{thread_id}/copy: a new thread (a new id) holding the source's
    history, every branch, each message at its own checkpoint (`checkpoint_id` seq + 1
    as in the source), answered once the whole copy is in (`gateway.api.copies`). A
    copy not decided in time is answered as a busy thread with no values yet: it will
    be complete, and runs on it are refused (409) until it is."""
    state = await own_thread(request)
    # The copy is known by its own id on both APIs, like a thread made over /v1; a
    # LangGraph thread's title is its id, which the copy does not keep.
    target_id = str(uuid.uuid4())
    title = state.title if lg_thread_id(state) == state.thread_id else ""
    copied = await copy_into(request, state, target_id, title)
    if copied is None:
        pending = ThreadState(thread_id=target_id, tenant=request[TENANT], title=title,
                              created_at_ms=now_ms(), import_parts_left=1)
        return web.json_response(thread_json(pending, {"messages": []}))
    return web.json_response(thread_json(copied, (await values_view(request, copied))[0]))


async def search_assistants(request: web.Request) -> web.Response:
    """POST /assistants/search: the one assistant."""
    body = await read_json_body(request, required=False)
    offset = int_field(body.get("offset"), "offset", 0, MAX_OFFSET)
    graph = body.get("graph_id")
    found = [] if offset or graph not in (None, "agent") else [assistant()]
    return web.json_response(found)


async def get_assistant(request: web.Request) -> web.Response:
    """GET /assistants/{assistant_id}"""
    if request.match_info["assistant_id"] not in ASSISTANT_NAMES:
        raise Problem(404, "not-found", "no such assistant")
    return web.json_response(assistant())
