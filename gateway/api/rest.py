"""The JSON endpoints: threads, user messages, runs, messages.

Writes publish a command and answer with the processor's decision on it; if none
comes within `decision_timeout_ms`, they answer 202 with `"status": "pending"`: the
command is durably queued and will be decided, so the client must not see an error.
Reads come from the read model (`gateway.model.read_model`), a local store: a thread is
one point read, a page of messages or threads one range scan.

Pagination: `limit` (messages: default 100, at most 1000; threads: default 50, at
most 200) and opaque cursors. Messages come oldest first within a page; `after`
continues forward, `before` alone reads the page just before it (`before=end`: the
newest messages); `next_cursor` continues in the same direction and is null at the
end.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
import uuid
from typing import Any

from aiohttp import web

from gateway.http.auth import TENANT
from gateway.http.browser_tokens import DEFAULT_TTL_S, MAX_TTL_S, BrowserTokens
from gateway.http.limits import tenant_active_runs
from gateway.http.plumbing import END_SEQ, json_answer, query_limit, read_json_body
from gateway.http.problems import Problem
from gateway.kafka import partition_for
from gateway.keys import BUS, LIMITER, READ_MODEL, SETTINGS
from gateway.live.sse import iso_ms
from gateway.model.branches import branch_heads
from gateway.model.decisions import new_traceparent
from gateway.model.read_model import RunView
from gateway.model.titles import display_title
from streams.clock import now_ms
from streams.core.branches import branch_count, head_of, parent_seq_of
from streams.core.domain import (
    CancelRun,
    CreateThread,
    DeleteThread,
    Event,
    MessageAccepted,
    MultitaskStrategy,
    PostUserMessage,
    RejectReason,
    RunAccepted,
    RunCancelled,
    RunCompleted,
    RunRejected,
    RunStatus,
    ThreadCreated,
    ThreadDeleted,
    ThreadState,
)
from streams.core.ids import idempotent_message_id_for, run_id_for, workflow_id_for
from streams.core.records import MessageRecord

__all__ = ["MAX_MESSAGES_PAGE", "MAX_TITLE_CHARS", "MAX_THREADS_PAGE", "MESSAGES_PAGE", "THREADS_PAGE",
           "cancel", "cancel_run", "check_input_text", "create_thread", "cursor", "decided_run",
           "delete_thread",
           "get_thread", "idempotency_key", "list_messages", "list_threads", "message_json",
           "multitask_strategy", "own_run", "own_thread", "post_user_message", "seq_cursor",
           "string_field", "submit_user_message", "thread_json"]

MESSAGES_PAGE, MAX_MESSAGES_PAGE = 100, 1000  # GET /v1/threads/{id}/messages: default, max
THREADS_PAGE, MAX_THREADS_PAGE = 50, 200  # GET /v1/threads

MAX_TITLE_CHARS = 500
MAX_ID_CHARS = 200  # a thread id named in a body (ours are uuids)
MAX_KEY_CHARS = 255


def string_field(body: dict[str, Any], name: str, default: str | None = None) -> str:
    """The body's string `name` (or `default`), Unicode text; 422 otherwise."""
    value = body.get(name, default)
    if not isinstance(value, str):
        raise Problem(422, "invalid-body", f"'{name}' must be a string", field=name)
    try:  # JSON lets "\ud800" through; Avro, Kafka and every client want real text
        value.encode()
    except UnicodeEncodeError as exc:
        raise Problem(422, "invalid-body", f"'{name}' holds an unpaired surrogate at character "
                      f"{exc.start}: not Unicode text", field=name) from exc
    return value


def message_json(record: MessageRecord, state: ThreadState) -> dict[str, Any]:
    """A stored message as the native API shows it."""
    m = record.message
    body: dict[str, Any] = {
        "seq": record.seq, "message_id": m.message_id, "role": m.role, "text": m.text,
        "run_id": m.run_id, "created_at_ms": m.created_at_ms,
        "steps": [{"kind": s.kind, "name": s.name, "payload_json": s.payload_json}
                  for s in m.steps],
        "citations": [{"url": c.url, "title": c.title} for c in m.citations],
        "parent_seq": parent_seq_of(record),  # its parent in the thread's tree (branches)
    }
    if m.role == "user":
        run = state.active_run
        status = run.status if run is not None and run.run_id == m.run_id else record.run_status
        queued = any(q.message_id == m.message_id for q in state.queued)
        body["run_status"] = "queued" if queued else None if status is None else status.value
    elif record.run_status is RunStatus.CANCELLED:  # what an interrupted run had streamed
        body["run_status"] = RunStatus.CANCELLED.value
        body["partial"] = True
    return body


def thread_json(state: ThreadState, title: str) -> dict[str, Any]:
    """A thread's JSON; `title` is its display title (`ReadModel.display_title`)."""
    run, last = state.active_run, state.last_run
    return {
        "id": state.thread_id, "thread_id": state.thread_id, "title": state.title,
        "display_title": title,
        "created_at_ms": state.created_at_ms,
        "updated_at_ms": state.updated_at_ms or state.created_at_ms,
        "workflow_id": workflow_id_for(state.thread_id), "message_count": state.message_count,
        "run_count": state.run_count,
        "branch": head_of(state), "branch_count": branch_count(state),
        "copied_from": state.copied_from,
        "active_run": None if run is None else {
            "run_id": run.run_id, "message_id": run.message_id, "attempt": run.attempt,
            "status": run.shown_status, "accepted_at_ms": run.accepted_at_ms or None,
            "interrupt": None if run.interrupt_json is None else json.loads(run.interrupt_json)},
        "last_run": None if last is None else {
            "run_id": last.run_id, "message_id": last.message_id, "status": last.status.value,
            "attempts": last.attempts},
    }


async def own_thread(request: web.Request, *, command: bool = False) -> ThreadState:
    """The caller's thread named in the path, or 404. `command`: the request only
    checks that before it publishes a command (`ReadModel.thread`)."""
    state = await request.config_dict[READ_MODEL].thread(
        request[TENANT], request.match_info["thread_id"], command=command)
    if state is None:
        raise Problem(404, "not-found", "no such thread")
    return state


def cursor(*parts: object) -> str:
    """An opaque page cursor holding `parts` (the first names the list)."""
    raw = json.dumps(parts, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _parse_cursor(request: web.Request, name: str, kind: str) -> list[Any] | None:
    raw = request.query.get(name)
    if raw is None:
        return None
    try:
        parts = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
    except (ValueError, binascii.Error) as exc:
        raise Problem(400, "bad-cursor", f"'{name}' is not a cursor of this list") from exc
    if not isinstance(parts, list) or not parts or parts[0] != kind:
        raise Problem(400, "bad-cursor", f"'{name}' is not a cursor of this list")
    return parts[1:]


def seq_cursor(request: web.Request, name: str) -> int | None:
    """The message seq of the query's cursor `name` (`before=end`: past the newest)."""
    if name == "before" and request.query.get(name) == "end":
        return END_SEQ
    parts = _parse_cursor(request, name, "m")
    if parts is None:
        return None
    if len(parts) != 1 or not isinstance(parts[0], int) or not 0 <= parts[0] < END_SEQ:
        raise Problem(400, "bad-cursor", f"'{name}' is not a cursor of this list")
    return parts[0]


async def issue_browser_token(request: web.Request) -> web.Response:
    """POST /v1/browser_tokens `{thread_id?, ttl_s?}`: a short-lived token a tenant's
    backend gives a browser instead of its API key (`gateway.http.browser_tokens`);
    with `thread_id`, good for that thread's routes only."""
    body = await read_json_body(request, required=False)
    ttl = body.get("ttl_s", DEFAULT_TTL_S)
    if not isinstance(ttl, int) or isinstance(ttl, bool) or not 1 <= ttl <= MAX_TTL_S:
        raise Problem(422, "invalid-body", f"'ttl_s' must be an integer from 1 to {MAX_TTL_S}",
                      field="ttl_s")
    tenant, thread_id = request[TENANT], body.get("thread_id")
    if thread_id is not None:
        if not isinstance(thread_id, str) or not 0 < len(thread_id) <= MAX_ID_CHARS \
                or not _utf8(thread_id):
            raise Problem(422, "invalid-body", "'thread_id' must be a thread's id",
                          field="thread_id")
        if await request.config_dict[READ_MODEL].thread(tenant, thread_id) is None:
            raise Problem(404, "not-found", "no such thread")
    issued = time.time()
    token, expires = BrowserTokens.from_settings(request.config_dict[SETTINGS]).issue(
        tenant, thread_id, ttl, issued)
    return json_answer(201, {"token": token, "token_type": "Bearer", "expires_in": ttl,
                             "expires_at": iso_ms(expires * 1000), "tenant": tenant,
                             "thread_id": thread_id}, {"Cache-Control": "no-store"})


def _utf8(text: str) -> bool:
    """Whether `text` has a UTF-8 form (JSON can carry a lone surrogate, which has none)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


async def create_thread(request: web.Request) -> web.Response:
    """POST /v1/threads"""
    body = await read_json_body(request, required=False)
    title = string_field(body, "title", "")
    if len(title) > MAX_TITLE_CHARS:
        raise Problem(422, "invalid-body", f"'title' is longer than {MAX_TITLE_CHARS} characters")
    tenant, thread_id = request[TENANT], str(uuid.uuid4())
    command = CreateThread(thread_id, tenant, title, now_ms())
    request.config_dict[READ_MODEL].note_write(thread_id)
    event = await request.config_dict[BUS].decide(command, tenant, new_traceparent(
        request.headers.get("traceparent")))
    location = {"Location": f"/v1/threads/{thread_id}"}
    if not isinstance(event, ThreadCreated):
        return json_answer(202, {"id": thread_id, "thread_id": thread_id, "title": title,
                           "display_title": display_title(title),
                           "workflow_id": workflow_id_for(thread_id), "status": "pending"},
                     location)
    state = ThreadState(thread_id=thread_id, tenant=tenant, title=title,
                        created_at_ms=event.at_ms)
    return json_answer(201, {**thread_json(state, display_title(title)), "status": "created"},
                       location)


async def get_thread(request: web.Request) -> web.Response:
    """GET /v1/threads/{thread_id}"""
    state = await own_thread(request)
    return json_answer(200, thread_json(state, request.config_dict[READ_MODEL].display_title(state)))


async def list_messages(request: web.Request) -> web.Response:
    """GET /v1/threads/{thread_id}/messages?limit=&after=|before=&branch=

    The current branch (a thread that never branched: every message), or with `branch`
    the branch whose head or tip is that seq (`GET .../branches`)."""
    limit = query_limit(request, MESSAGES_PAGE, MAX_MESSAGES_PAGE)
    after, before = seq_cursor(request, "after"), seq_cursor(request, "before")
    state = await own_thread(request)
    read_model = request.config_dict[READ_MODEL]
    branch = _branch_param(request, state)
    if branch is None:
        page = read_model.current_messages(state, after=after, before=before, limit=limit)
    else:
        page = read_model.branch_messages(state, branch, after=after, before=before,
                                          limit=limit)
    next_cursor = None
    if page.more and page.records:
        backward = before is not None and after is None
        next_cursor = cursor("m", page.records[0 if backward else -1].seq)
    return json_answer(200, {"thread_id": state.thread_id,
                       "branch": head_of(state) if branch is None else branch,
                       "messages": [message_json(r, state) for r in page.records],
                       "next_cursor": next_cursor})


def _branch_param(request: web.Request, state: ThreadState) -> int | None:
    raw = request.query.get("branch")
    if raw is None:
        return None
    try:
        seq = int(raw)
    except ValueError:
        seq = None
    if seq is None or seq not in branch_heads(state):
        raise Problem(404, "no-such-branch", f"'branch' {raw!r} names no branch of this thread "
                      "(GET /v1/threads/{thread_id}/branches lists them)", field="branch")
    return seq


async def list_threads(request: web.Request) -> web.Response:
    """GET /v1/threads?limit=&cursor="""
    limit = query_limit(request, THREADS_PAGE, MAX_THREADS_PAGE)
    parts = _parse_cursor(request, "cursor", "t")
    after = None
    if parts is not None:
        if len(parts) != 2 or not isinstance(parts[0], int) or not isinstance(parts[1], str):
            raise Problem(400, "bad-cursor", "'cursor' is not a cursor of this list")
        after = (parts[0], parts[1])
    read_model = request.config_dict[READ_MODEL]
    page = await read_model.threads(request[TENANT], after=after, limit=limit)
    last = page.states[-1] if page.states else None
    next_cursor = None if not page.more or last is None else cursor(
        "t", last.updated_at_ms or last.created_at_ms, last.thread_id)
    return json_answer(200, {"threads": [thread_json(s, page.titles.get(s.thread_id)
                                                     or read_model.display_title(s))
                                         for s in page.states],
                       "next_cursor": next_cursor})


async def delete_thread(request: web.Request) -> web.Response:
    """DELETE /v1/threads/{thread_id}"""
    state = await own_thread(request, command=True)
    tenant, thread_id = request[TENANT], state.thread_id
    read_model = request.config_dict[READ_MODEL]
    read_model.note_write(thread_id)
    event = await request.config_dict[BUS].decide(
        DeleteThread(thread_id, tenant, now_ms()), tenant,
        new_traceparent(request.headers.get("traceparent")), until=ThreadDeleted)
    if event is None:
        return json_answer(202, {"thread_id": thread_id, "status": "pending"})
    # The tombstones were committed with the decision: read them before answering,
    # so this gateway answers 404 for the thread from now on.
    await read_model.catch_up([partition_for(thread_id, request.config_dict[SETTINGS].partitions)])
    return web.Response(status=204)


def idempotency_key(request: web.Request) -> str | None:
    """The request's Idempotency-Key header, checked; None without one."""
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return None
    key = key.strip().strip('"')  # the IETF draft sends it as a quoted string
    if not key or len(key) > MAX_KEY_CHARS or not key.isprintable():
        raise Problem(400, "bad-idempotency-key",
                      f"Idempotency-Key must be 1 to {MAX_KEY_CHARS} printable characters")
    return key


async def post_user_message(request: web.Request) -> web.Response:
    """POST /v1/threads/{thread_id}/user_message"""
    state = await own_thread(request, command=True)
    body = await read_json_body(request, required=True)
    text = string_field(body, "input_text")
    strategy = multitask_strategy(body.get("multitask_strategy", MultitaskStrategy.REJECT.value))
    event, message_id = await submit_user_message(request, state, text,
                                                  idempotency_key(request), strategy=strategy)
    return _post_answer(event, state.thread_id, message_id)


def multitask_strategy(value: object) -> MultitaskStrategy:
    """The body's `multitask_strategy` (docs/multitask.md); 422 unless one of the four."""
    try:
        return MultitaskStrategy(value if isinstance(value, str) else "")
    except ValueError:
        raise Problem(422, "invalid-body", "'multitask_strategy' must be one of "
                      + ", ".join(s.value for s in MultitaskStrategy),
                      field="multitask_strategy") from None


def check_input_text(request: web.Request, text: str, field: str) -> None:
    """A user message's text (named `field` in errors): not empty, within the limit."""
    limit = request.config_dict[SETTINGS].policy.max_input_chars
    if not text.strip():
        raise Problem(422, "invalid-input", f"'{field}' is empty", field=field)
    if len(text) > limit:
        raise Problem(422, "invalid-input", f"'{field}' has {len(text)} characters, the "
                      f"limit is {limit}", field=field)


async def submit_user_message(request: web.Request, state: ThreadState, text: str,
                              key: str | None, field: str = "input_text",
                              strategy: MultitaskStrategy = MultitaskStrategy.REJECT) -> \
        tuple[Event | None, str]:
    """Check `text` (named `field` in errors), the tenant's run limit, and post it to
    the thread with `strategy` for a run already active: the decision (None while
    pending) and the user message's id (the key's, if one is given). Every API that
    posts a user message goes through here."""
    check_input_text(request, text, field)
    tenant, thread_id = request[TENANT], state.thread_id
    read_model = request.config_dict[READ_MODEL]
    request.config_dict[LIMITER].admit_run(tenant, tenant_active_runs(read_model, tenant))
    message_id = idempotent_message_id_for(tenant, thread_id, key) if key else str(uuid.uuid4())
    command = PostUserMessage(thread_id, tenant, message_id, text, key, now_ms(), strategy)
    read_model.note_write(thread_id)
    event = await request.config_dict[BUS].decide(command, tenant, new_traceparent(
        request.headers.get("traceparent")))
    return event, message_id


def _post_answer(event: Event | None, thread_id: str, message_id: str) -> web.Response:
    accepted = {"workflow_id": workflow_id_for(thread_id), "message_id": message_id,
                "run_id": run_id_for(thread_id, message_id)}
    if event is None:
        return json_answer(202, {**accepted, "status": "pending"})
    run_id, replayed = decided_run(event, thread_id, message_id)
    if not replayed:
        return json_answer(202, {**accepted, "status": "accepted"})
    return json_answer(202, {**accepted, "run_id": run_id, "status": "accepted", "replayed": True})


def decided_run(event: Event, thread_id: str, message_id: str) -> tuple[str, bool]:
    """The run a post's decision started (or, for a duplicate, the original's, with
    True); a rejection raises its problem (409 while a run is active, 422, 404)."""
    if isinstance(event, MessageAccepted | RunAccepted):
        return run_id_for(thread_id, message_id), False
    if not isinstance(event, RunRejected):
        raise Problem(500, "internal", f"unexpected decision {type(event).__name__}")
    match event.reason:
        case RejectReason.DUPLICATE:
            return event.existing_run_id or run_id_for(thread_id, message_id), True
        case RejectReason.CONFLICT:
            raise Problem(409, "run-active", "another run is active on the thread; "
                          "wait for it to end or cancel it", active_run_id=event.existing_run_id)
        case RejectReason.PAYLOAD_MISMATCH:
            raise Problem(422, "idempotency-key-reused", "the Idempotency-Key was used with "
                          "another body", existing_run_id=event.existing_run_id)
        case RejectReason.UNKNOWN_THREAD:
            raise Problem(404, "not-found", "no such thread")
        case _:
            raise Problem(422, "invalid-input", event.detail)


async def own_run(request: web.Request) -> tuple[ThreadState, RunView]:
    """The thread and run named in the path (`/v1/threads/{thread_id}/runs/{run_id}`),
    both the caller's, or 404."""
    state = await own_thread(request)
    run = await request.config_dict[READ_MODEL].run(request[TENANT], request.match_info["run_id"])
    if run is None or run.state.thread_id != state.thread_id:
        raise Problem(404, "not-found", "no such run on this thread")
    return state, run


async def cancel_run(request: web.Request) -> web.Response:
    """POST /v1/threads/{thread_id}/runs/{run_id}/cancel"""
    run_id = request.match_info["run_id"]
    state, run = await own_run(request)
    body = await read_json_body(request, required=False)
    reason = string_field(body, "reason", "cancelled by the client")[:500]
    if run.status is not None and run.status.is_terminal:
        raise Problem(409, "run-finished", f"the run already ended ({run.status.value})",
                      run_status=run.status.value)
    return await cancel(request, state, run_id, reason)


async def cancel(request: web.Request, state: ThreadState, run_id: str,
                 reason: str) -> web.Response:
    """Cancel a run of the thread: 202 cancelled (or pending), 409 if it ended first."""
    tenant = request[TENANT]
    command = CancelRun(state.thread_id, tenant, run_id, reason, now_ms())
    request.config_dict[READ_MODEL].note_write(state.thread_id)
    event = await request.config_dict[BUS].decide(command, tenant, new_traceparent(
        request.headers.get("traceparent")), watch_run=run_id)
    if event is None:
        return json_answer(202, {"run_id": run_id, "status": "pending"})
    if isinstance(event, RunCancelled):
        return json_answer(202, {"run_id": run_id, "status": "cancelled"})
    ended = RunStatus.COMPLETED if isinstance(event, RunCompleted) else RunStatus.FAILED
    raise Problem(409, "run-finished", "the run ended before it could be cancelled",
                  run_status=ended.value)
