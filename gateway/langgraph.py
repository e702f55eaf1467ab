"""The LangGraph Platform runs API (an Agent Protocol subset), under `/langgraph`.

What `langgraph-sdk` (and agent-chat-ui, assistant-ui, CopilotKit through it) calls:
threads (create, get, search, state, history), the one assistant, and runs (create,
stream, wait, list, get, join, join_stream, cancel). `setup(app)` adds the routes.
The SDK's `x-api-key` is one of the deployment's API keys (`gateway.auth`).

Streams: a run's stream is read from this gateway's own `/v1/runs/{run_id}/events`
(over loopback HTTP, with the caller's key), so it has that endpoint's resume
semantics, and each event is mapped by `gateway.langgraph_events`. The SSE `id:` of
a LangGraph part is the resume token of the Threadline event it came from; when one
event makes several parts, all but the last carry `{token}~{index}`. A reconnect
(`Last-Event-ID`) reads the run from its start again, folding the answer so far,
and writes only what follows the part named: no gap, no repeat. Responses carry
`Location` (the join stream, relative to the API root, as LangGraph servers send
it) and `Content-Location` (the run), which the SDK follows to reconnect.

Not served (a 422 names them): `multitask_strategy` other than `reject`, `command`
(human in the loop), `interrupt_before`/`after`, checkpoints, cancel `action=rollback`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web

from gateway.auth import TENANT
from gateway.decisions import new_traceparent
from gateway.keys import BUS, FEED, LIMITER, READ_MODEL, SETTINGS
from gateway.langgraph_events import VALUES, Part, Translator, modes_from
from gateway.langgraph_views import (
    ASSISTANT_ID,
    MAX_THREAD_ID_CHARS,
    assistant,
    internal_thread_id,
    lg_message,
    run_json,
    thread_json,
    thread_status,
)
from gateway.limits import tenant_active_runs
from gateway.problems import Problem
from gateway.tokens import BadEventId
from streams.clock import now_ms
from streams.domain import (
    CancelRun,
    CreateThread,
    Event,
    MessageAccepted,
    PostUserMessage,
    RejectReason,
    RunAccepted,
    RunCancelled,
    RunRejected,
    ThreadCreated,
    ThreadState,
)
from streams.ids import run_id_for

__all__ = ["PREFIX", "VALUES_CAP", "setup"]

PREFIX = "/langgraph"
VALUES_CAP = 50  # messages in a `values` part or a state, newest first (page with ?before=)
SEARCH_VALUES_CAP = 10  # messages in each thread of a search
MAX_PAGE = 100
MAX_OFFSET = 1000
START_WAIT_S = 30.0
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
               "X-Accel-Buffering": "no"}
STREAM_CLIENT = web.AppKey("langgraph_http", aiohttp.ClientSession)
ASSISTANT_NAMES = frozenset({ASSISTANT_ID, "agent"})


def setup(app: web.Application) -> None:
    """Add the LangGraph routes under PREFIX, and the loopback client they stream with."""
    app.cleanup_ctx.append(_client)
    r = app.router
    r.add_post(f"{PREFIX}/threads", create_thread)
    r.add_post(f"{PREFIX}/threads/search", search_threads)
    r.add_get(f"{PREFIX}/threads/{{thread_id}}", get_thread)
    r.add_get(f"{PREFIX}/threads/{{thread_id}}/state", get_state)
    r.add_post(f"{PREFIX}/threads/{{thread_id}}/history", get_history)
    r.add_post(f"{PREFIX}/assistants/search", search_assistants)
    r.add_get(f"{PREFIX}/assistants/{{assistant_id}}", get_assistant)
    r.add_post(f"{PREFIX}/threads/{{thread_id}}/runs", create_run)
    r.add_post(f"{PREFIX}/threads/{{thread_id}}/runs/stream", stream_run)
    r.add_post(f"{PREFIX}/threads/{{thread_id}}/runs/wait", wait_run)
    r.add_get(f"{PREFIX}/threads/{{thread_id}}/runs", list_runs)
    r.add_get(f"{PREFIX}/threads/{{thread_id}}/runs/{{run_id}}", get_run)
    r.add_get(f"{PREFIX}/threads/{{thread_id}}/runs/{{run_id}}/join", join_run)
    r.add_get(f"{PREFIX}/threads/{{thread_id}}/runs/{{run_id}}/stream", join_stream)
    r.add_post(f"{PREFIX}/threads/{{thread_id}}/runs/{{run_id}}/cancel", cancel_run)


async def _client(app: web.Application) -> AsyncIterator[None]:
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    app[STREAM_CLIENT] = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)
    yield
    await app[STREAM_CLIENT].close()


# --- requests ------------------------------------------------------------------------


async def _ready(request: web.Request) -> None:
    feed = request.app[FEED]
    if not feed.started and not await feed.wait_started(START_WAIT_S):
        raise Problem(503, "starting", "the gateway is loading its read model; retry shortly",
                      headers={"Retry-After": "2"})


async def _body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise Problem(400, "malformed-json", "the body is not JSON") from exc
    if not isinstance(body, dict):
        raise Problem(422, "invalid-body", "the body must be a JSON object")
    return body


def _int(value: object, name: str, default: int, maximum: int) -> int:
    if value is None:
        return default
    try:
        number = int(str(value))
    except (TypeError, ValueError):
        number = -1
    if not 0 <= number <= maximum:
        raise Problem(422, "invalid-body", f"'{name}' must be an integer from 0 to {maximum}")
    return number


def _is_text(value: object) -> bool:
    """A string every layer can carry (JSON and URLs let unpaired surrogates through)."""
    if not isinstance(value, str):
        return False
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


async def _find(request: web.Request, lg_id: str) -> ThreadState | None:
    if not _is_text(lg_id) or not lg_id or len(lg_id) > MAX_THREAD_ID_CHARS:
        return None
    tenant, read_model = request[TENANT], request.app[READ_MODEL]
    state = await read_model.thread(tenant, internal_thread_id(tenant, lg_id))
    if state is None and _is_uuid(lg_id):  # a thread made over /v1, by its own id
        state = await read_model.thread(tenant, lg_id)
    return state


async def _thread(request: web.Request) -> ThreadState:
    await _ready(request)
    state = await _find(request, request.match_info["thread_id"])
    if state is None:
        raise Problem(404, "not-found", "no such thread")
    return state


def _is_uuid(text: str) -> bool:
    try:
        return str(uuid.UUID(text)) == text
    except ValueError:
        return False


async def _values(request: web.Request, state: ThreadState, cap: int = VALUES_CAP,
                  before: int | None = None) -> tuple[dict[str, Any], int | None]:
    """The newest `cap` messages (before seq `before`), and the seq to page on from."""
    page = request.app[READ_MODEL].messages(
        state.thread_id, before=(1 << 63) - 1 if before is None else before, limit=cap)
    older = page.records[0].seq if page.more and page.records else None
    return {"messages": [lg_message(r) for r in page.records]}, older


# --- threads and assistants ------------------------------------------------------------


async def create_thread(request: web.Request) -> web.Response:
    """POST /threads {thread_id?, metadata?, if_exists?}"""
    await _ready(request)
    body = await _body(request)
    lg_id = body.get("thread_id") or str(uuid.uuid4())
    if not _is_text(lg_id) or len(lg_id) > MAX_THREAD_ID_CHARS or \
            not lg_id.isprintable() or "/" in lg_id:
        raise Problem(422, "invalid-body", f"'thread_id' must be 1 to {MAX_THREAD_ID_CHARS} "
                      "printable characters without '/'", field="thread_id")
    existing = await _find(request, lg_id)
    if existing is not None:
        if body.get("if_exists") == "do_nothing":
            return web.json_response(thread_json(existing, (await _values(request, existing))[0]))
        raise Problem(409, "thread-exists", "a thread with this id exists")
    state = await _create(request, lg_id)
    return web.json_response(thread_json(state, {"messages": []}))


async def _create(request: web.Request, lg_id: str) -> ThreadState:
    tenant = request[TENANT]
    thread_id = internal_thread_id(tenant, lg_id)
    request.app[READ_MODEL].note_write(thread_id)
    event = await request.app[BUS].decide(
        CreateThread(thread_id, tenant, lg_id, now_ms()), tenant,
        new_traceparent(request.headers.get("traceparent")))
    at = event.at_ms if isinstance(event, ThreadCreated) else now_ms()
    return ThreadState(thread_id=thread_id, tenant=tenant, title=lg_id, created_at_ms=at)


async def get_thread(request: web.Request) -> web.Response:
    """GET /threads/{thread_id}"""
    state = await _thread(request)
    return web.json_response(thread_json(state, (await _values(request, state))[0]))


async def search_threads(request: web.Request) -> web.Response:
    """POST /threads/search {limit, offset, ids?, status?}: newest first."""
    await _ready(request)
    body = await _body(request)
    limit = _int(body.get("limit"), "limit", 10, MAX_PAGE)
    offset = _int(body.get("offset"), "offset", 0, MAX_OFFSET)
    status = body.get("status")
    ids = body.get("ids")
    read_model, tenant = request.app[READ_MODEL], request[TENANT]
    states: list[ThreadState] = []
    if isinstance(ids, list):
        for lg_id in ids[:MAX_PAGE]:
            found = await _find(request, lg_id) if isinstance(lg_id, str) else None
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
        thread_json(s, (await _values(request, s, SEARCH_VALUES_CAP))[0])
        for s in chosen[offset:offset + limit]])


async def get_state(request: web.Request) -> web.Response:
    """GET /threads/{thread_id}/state[?before=seq]: the newest messages, bounded."""
    state = await _thread(request)
    before = request.query.get("before")
    if before is not None and not (before.isascii() and before.isdigit() and
                                   int(before) < (1 << 63) - 1):
        raise Problem(400, "bad-cursor", "'before' is the messages_before of a state")
    return web.json_response(await _state(request, state, None if before is None else
                                          int(before)))


async def _state(request: web.Request, state: ThreadState,
                 before: int | None = None) -> dict[str, Any]:
    values, older = await _values(request, state, VALUES_CAP, before)
    view = thread_json(state, values)
    return {"values": values, "next": [] if state.active_run is None else ["agent"],
            "tasks": [], "interrupts": [],
            "checkpoint": {"thread_id": view["thread_id"], "checkpoint_ns": "",
                           "checkpoint_id": str(state.message_count)},
            "parent_checkpoint": None, "created_at": view["updated_at"],
            "metadata": {"messages_before": older, "message_count": state.message_count,
                         **view["metadata"]}}


async def get_history(request: web.Request) -> web.Response:
    """POST /threads/{thread_id}/history: the current state only (no checkpoints)."""
    state = await _thread(request)
    return web.json_response([await _state(request, state)])


async def search_assistants(request: web.Request) -> web.Response:
    """POST /assistants/search: the one assistant."""
    body = await _body(request)
    offset = _int(body.get("offset"), "offset", 0, MAX_OFFSET)
    graph = body.get("graph_id")
    found = [] if offset or graph not in (None, "agent") else [assistant()]
    return web.json_response(found)


async def get_assistant(request: web.Request) -> web.Response:
    """GET /assistants/{assistant_id}"""
    if request.match_info["assistant_id"] not in ASSISTANT_NAMES:
        raise Problem(404, "not-found", "no such assistant")
    return web.json_response(assistant())


# --- runs --------------------------------------------------------------------------------


def _input_text(body: dict[str, Any]) -> str:
    strategy = body.get("multitask_strategy")
    if strategy not in (None, "reject"):
        raise Problem(422, "multitask-strategy-unsupported", f"multitask_strategy '{strategy}' "
                      "is not supported yet; only 'reject' is", field="multitask_strategy")
    for name in ("command", "interrupt_before", "interrupt_after", "checkpoint",
                 "checkpoint_id"):
        if body.get(name):
            raise Problem(422, "unsupported", f"'{name}' is not supported by this server",
                          field=name)
    assistant_id = body.get("assistant_id")
    if assistant_id is not None and (not isinstance(assistant_id, str) or
                                     assistant_id not in ASSISTANT_NAMES):
        raise Problem(404, "not-found", "no such assistant")
    raw = body.get("input")
    messages = raw.get("messages") if isinstance(raw, dict) else None
    if isinstance(messages, dict):
        messages = [messages]
    texts = [_text(m) for m in messages or [] if isinstance(m, dict) and
             (m.get("role") in ("user", "human") or m.get("type") == "human")]
    if texts and not _is_text(texts[-1]):
        raise Problem(422, "invalid-input", "the user message holds an unpaired surrogate: "
                      "not Unicode text", field="input")
    if not texts or not texts[-1].strip():
        raise Problem(422, "invalid-input", "the input needs a user message: "
                      '{"messages": [{"role": "user", "content": "..."}]}', field="input")
    return texts[-1]


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content
                       if isinstance(p, dict) and p.get("type") == "text")
    return content if isinstance(content, str) else ""


async def _start(request: web.Request, body: dict[str, Any]) -> tuple[ThreadState, str]:
    """Post the run's user message (as POST /v1/.../user_message does): the thread, run id."""
    await _ready(request)
    text = _input_text(body)
    lg_id = request.match_info["thread_id"]
    state = await _find(request, lg_id)
    if state is None:
        if body.get("if_not_exists") != "create":
            raise Problem(404, "not-found", "no such thread")
        state = await _create(request, lg_id)
    limit = request.app[SETTINGS].policy.max_input_chars
    if len(text) > limit:
        raise Problem(422, "invalid-input", f"the user message has {len(text)} characters, "
                      f"the limit is {limit}", field="input")
    tenant, read_model = request[TENANT], request.app[READ_MODEL]
    request.app[LIMITER].admit_run(tenant, tenant_active_runs(read_model, tenant))
    message_id = str(uuid.uuid4())
    read_model.note_write(state.thread_id)
    event = await request.app[BUS].decide(
        PostUserMessage(state.thread_id, tenant, message_id, text, None, now_ms()), tenant,
        new_traceparent(request.headers.get("traceparent")))
    _check_accepted(event)
    return state, run_id_for(state.thread_id, message_id)


def _check_accepted(event: Event | None) -> None:
    if event is None or isinstance(event, MessageAccepted | RunAccepted):
        return  # None: the decision is slow; the command is queued and will run
    if isinstance(event, RunRejected):
        if event.reason == RejectReason.CONFLICT:
            raise Problem(409, "run-active", "another run is active on the thread (the "
                          "multitask_strategy is 'reject')", active_run_id=event.existing_run_id)
        raise Problem(422, "invalid-input", event.detail)
    raise Problem(500, "internal", f"unexpected decision {type(event).__name__}")


def _links(run_id: str, lg_id: str, query: str = "") -> dict[str, str]:
    run = f"/threads/{lg_id}/runs/{run_id}"
    return {"Location": f"{run}/stream{query}", "Content-Location": run}


async def create_run(request: web.Request) -> web.Response:
    """POST /threads/{thread_id}/runs: a background run."""
    body = await _body(request)
    state, run_id = await _start(request, body)
    lg_id = request.match_info["thread_id"]
    headers = _links(run_id, lg_id)
    return web.json_response(run_json(state, run_id, None, now_ms()), headers=headers)


async def stream_run(request: web.Request) -> web.StreamResponse:
    """POST /threads/{thread_id}/runs/stream"""
    body = await _body(request)
    try:
        modes = modes_from(body.get("stream_mode"))
    except ValueError as exc:
        raise Problem(422, "invalid-body", str(exc), field="stream_mode") from exc
    state, run_id = await _start(request, body)
    return await _stream(request, state, run_id, modes, None)


async def join_stream(request: web.Request) -> web.StreamResponse:
    """GET /threads/{thread_id}/runs/{run_id}/stream (Last-Event-ID resumes)."""
    state = await _thread(request)
    run_id = request.match_info["run_id"]
    await _own_run(request, state, run_id)
    raw = request.query.getall("stream_mode", [])
    try:
        modes = modes_from(raw or None)
    except ValueError as exc:
        raise Problem(422, "invalid-body", str(exc), field="stream_mode") from exc
    return await _stream(request, state, run_id, modes, request.headers.get("Last-Event-ID"))


async def _own_run(request: web.Request, state: ThreadState, run_id: str) -> Any:
    run = await request.app[READ_MODEL].run(request[TENANT], run_id)
    if run is None or run.state.thread_id != state.thread_id:
        raise Problem(404, "not-found", "no such run on this thread")
    return run


def _resume_point(request: web.Request, state: ThreadState, run_id: str,
                  last: str | None) -> tuple[str, int] | None:
    """The event to resume after (its token) and how many of its parts were sent."""
    if not last:
        return None
    token, _, index = last.strip().partition("~")
    try:
        event_id = request.app[FEED].tokens.verify(token, state.thread_id)
    except BadEventId as exc:
        raise Problem(400, "bad-last-event-id", str(exc)) from exc
    if event_id.run_id != run_id or (index and not (index.isascii() and index.isdigit() and
                                                    len(index) <= 6)):
        raise Problem(400, "bad-last-event-id", "the event id is not from this run's stream")
    return token, int(index) + 1 if index else -1  # -1: every part of it was sent


def _key(request: web.Request) -> str:
    header = request.headers.get("Authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return request.headers.get("x-api-key", "").strip()


def _loopback(request: web.Request, path: str) -> str:
    sock = request.transport.get_extra_info("sockname") if request.transport else None
    if not sock:
        raise Problem(503, "unavailable", "the connection closed")
    host = sock[0] if ":" not in sock[0] else f"[{sock[0]}]"
    return f"http://{host}:{sock[1]}{path}"


async def _events(request: web.Request,
                  run_id: str) -> AsyncGenerator[tuple[str | None, str, Any], None]:
    """The run's Threadline events from its start: (SSE id, name, data); ("", "", None)
    for each keep-alive. Raises Problem for an error status, before anything is sent."""
    url = _loopback(request, f"/v1/runs/{run_id}/events")
    session = request.app[STREAM_CLIENT]
    async with session.get(url, headers={"Authorization": f"Bearer {_key(request)}"}) as up:
        if up.status != 200:
            raise Problem(up.status if up.status >= 400 else 502, "upstream",
                          f"the run's events: {(await up.text())[:300]}")
        sse_id, name, data = None, "message", []
        async for raw in up.content:
            line = raw.decode().rstrip("\r\n")
            if line.startswith(":"):
                yield "", "", None
                continue
            if line:
                key, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if key == "id":
                    sse_id = value
                elif key == "event":
                    name = value
                elif key == "data":
                    data.append(value)
                continue
            if data:
                text = "\n".join(data)
                yield sse_id, name, text if text == "[DONE]" else json.loads(text)
            sse_id, name, data = None, "message", []


def _frame(event: str, data: Any, event_id: str | None) -> bytes:
    head = f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n"
    return (head + (f"id: {event_id}\n" if event_id else "") + "\n").encode()


async def _stream(request: web.Request, state: ThreadState, run_id: str,
                  modes: frozenset[str], last: str | None) -> web.StreamResponse:
    lg_id = request.match_info["thread_id"]
    resume = _resume_point(request, state, run_id, last)
    query = "".join(f"{'&' if i else '?'}stream_mode={m}" for i, m in enumerate(sorted(modes)))
    response = web.StreamResponse(headers={**SSE_HEADERS, **_links(run_id, lg_id, query)})
    translator = Translator(modes, lg_id, ASSISTANT_ID)
    skipping = resume is not None
    events = _events(request, run_id)
    try:
        first = await anext(events, None)  # an error status is still a status
        await response.prepare(request)
        if resume is None:
            await response.write(_frame("metadata", {"run_id": run_id, "attempt": 1}, None))
        item = first
        while item is not None:
            sse_id, name, data = item
            if not name:
                await response.write(b": keep-alive\n\n")
            else:
                parts = _parts(translator, name, data)
                start = 0
                if name == "message_not_streaming":
                    skipping = False  # the run's events are gone: say how it ended
                if skipping and resume is not None:
                    if sse_id != resume[0]:
                        parts = []
                    else:
                        skipping = False
                        start = len(parts) if resume[1] < 0 else resume[1]
                frames = [_frame(p.event, await _fill(request, state, p), _part_id(sse_id, i,
                                                                                   len(parts)))
                          for i, p in enumerate(parts) if i >= start]
                if frames:
                    await response.write(b"".join(frames))
            item = await anext(events, None)
    except ConnectionError:
        pass
    finally:
        await events.aclose()
    return response


def _parts(translator: Translator, name: str, data: Any) -> list[Part]:
    if name == "message_not_streaming":  # the run's stream is gone: its end, from the store
        return [Part("values", VALUES), Part("end", None)]
    return translator.translate(name, data)


def _part_id(sse_id: str | None, index: int, count: int) -> str | None:
    if not sse_id:
        return None
    return sse_id if index == count - 1 else f"{sse_id}~{index}"


async def _fill(request: web.Request, state: ThreadState, part: Part) -> Any:
    if part.data is not VALUES:
        return part.data
    await request.app[READ_MODEL].catch_up([request.app[FEED].partition_of(state.thread_id)])
    return (await _values(request, state))[0]


async def _wait(request: web.Request, state: ThreadState, run_id: str) -> dict[str, Any]:
    """Read the run's events to its end: the thread's values then (and `__error__`)."""
    error = None
    events = _events(request, run_id)
    try:
        async for _, name, data in events:
            if name == "run_failed" and isinstance(data, dict):
                error = {"error": "RunFailed", "message": data.get("detail") or "the run failed"}
            if name in ("done", "message_not_streaming"):
                break
    finally:
        await events.aclose()
    await request.app[READ_MODEL].catch_up([request.app[FEED].partition_of(state.thread_id)])
    values = (await _values(request, state))[0]
    return values if error is None else {**values, "__error__": error}


async def wait_run(request: web.Request) -> web.Response:
    """POST /threads/{thread_id}/runs/wait: the thread's values once the run ended."""
    body = await _body(request)
    state, run_id = await _start(request, body)
    headers = _links(run_id, request.match_info["thread_id"])
    headers["Location"] = headers["Content-Location"] + "/join"
    return web.json_response(await _wait(request, state, run_id), headers=headers)


async def join_run(request: web.Request) -> web.Response:
    """GET /threads/{thread_id}/runs/{run_id}/join"""
    state = await _thread(request)
    run_id = request.match_info["run_id"]
    await _own_run(request, state, run_id)
    return web.json_response(await _wait(request, state, run_id))


async def get_run(request: web.Request) -> web.Response:
    """GET /threads/{thread_id}/runs/{run_id}"""
    state = await _thread(request)
    run = await _own_run(request, state, request.match_info["run_id"])
    return web.json_response(run_json(run.state, run.run_id, run.status, run.accepted_at_ms))


async def list_runs(request: web.Request) -> web.Response:
    """GET /threads/{thread_id}/runs?limit&offset: newest first, from the user messages."""
    state = await _thread(request)
    limit = _int(request.query.get("limit"), "limit", 10, MAX_PAGE)
    offset = _int(request.query.get("offset"), "offset", 0, MAX_OFFSET)
    read_model = request.app[READ_MODEL]
    runs: list[dict[str, Any]] = []
    before = (1 << 63) - 1
    while len(runs) < offset + limit:
        page = read_model.messages(state.thread_id, before=before, limit=MAX_PAGE)
        for record in reversed(page.records):
            m = record.message
            if m.role == "user":
                run = await read_model.run(request[TENANT], m.run_id)
                runs.append(run_json(state, m.run_id, None if run is None else run.status,
                                     m.created_at_ms))
        if not page.more or not page.records:
            break
        before = page.records[0].seq
    return web.json_response(runs[offset:offset + limit])


async def cancel_run(request: web.Request) -> web.Response:
    """POST /threads/{thread_id}/runs/{run_id}/cancel?wait=&action=interrupt"""
    state = await _thread(request)
    run_id = request.match_info["run_id"]
    action = request.query.get("action", "interrupt")
    if action != "interrupt":
        raise Problem(422, "unsupported", f"cancel action '{action}' is not supported yet; "
                      "only 'interrupt' is", field="action")
    run = await _own_run(request, state, run_id)
    if run.terminal:
        raise Problem(409, "run-finished", "the run already ended",
                      run_status=run.status.value if run.status else None)
    tenant = request[TENANT]
    request.app[READ_MODEL].note_write(state.thread_id)
    event = await request.app[BUS].decide(
        CancelRun(state.thread_id, tenant, run_id, "cancelled by the client", now_ms()), tenant,
        new_traceparent(request.headers.get("traceparent")), watch_run=run_id)
    if event is not None and not isinstance(event, RunCancelled):
        raise Problem(409, "run-finished", "the run ended before it could be cancelled")
    if request.query.get("wait") in ("1", "true"):
        await _wait(request, state, run_id)
    return web.Response(status=202)

