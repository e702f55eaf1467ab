"""The JSON endpoints: threads, user messages, runs, messages.

Writes publish a command and answer with the processor's decision on it; if none
comes within `decision_timeout_ms`, they answer 202 with `"status": "pending"`: the
command is durably queued and will be decided, so the client must not see an error.
Reads come from the threads read model (`gateway.read_model`).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from aiohttp import web

from gateway.auth import TENANT
from gateway.decisions import new_traceparent
from gateway.keys import BUS, LIMITER, READ_MODEL, SETTINGS
from gateway.limits import tenant_active_runs
from gateway.problems import Problem
from streams.domain import (
    CancelRun,
    CreateThread,
    Event,
    MessageAccepted,
    PostUserMessage,
    RejectReason,
    RunAccepted,
    RunCancelled,
    RunCompleted,
    RunRejected,
    RunStatus,
    StoredMessage,
    ThreadCreated,
    ThreadState,
    workflow_id_for,
)
from streams.thread import run_id_for

__all__ = ["cancel_run", "create_thread", "get_thread", "list_messages", "message_id_for",
           "post_user_message"]

# Fixed forever: changing it changes the message id of every idempotency key.
_KEY_NAMESPACE = uuid.UUID("5d0c7c1e-9b0e-4f57-a3a4-2c1f0f1f6a11")
MAX_TITLE_CHARS = 500
MAX_KEY_CHARS = 255


def message_id_for(tenant: str, thread_id: str, idempotency_key: str) -> str:
    """The user message id of an idempotency key: the same key always names the same
    message, so the processor's duplicate rules answer a resend."""
    name = f"{len(tenant)}:{tenant}:{len(thread_id)}:{thread_id}:{idempotency_key}"
    return str(uuid.uuid5(_KEY_NAMESPACE, name))


def _now_ms() -> int:
    return int(time.time() * 1000)


def _json(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> \
        web.Response:
    return web.json_response(body, status=status, headers=headers)


async def _body(request: web.Request, *, required: bool) -> dict[str, Any]:
    raw = await request.read()  # HTTPRequestEntityTooLarge past client_max_size
    if not raw.strip():
        if required:
            raise Problem(422, "invalid-body", "a JSON object body is required")
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Problem(400, "malformed-json", f"the body is not JSON: {exc}") from exc
    except RecursionError as exc:  # json's C scanner recurses once per nesting level
        raise Problem(400, "malformed-json", "the body is nested too deeply") from exc
    if not isinstance(body, dict):
        raise Problem(422, "invalid-body", "the body must be a JSON object")
    return body


def _string(body: dict[str, Any], name: str, default: str | None = None) -> str:
    value = body.get(name, default)
    if not isinstance(value, str):
        raise Problem(422, "invalid-body", f"'{name}' must be a string", field=name)
    try:  # JSON lets "\ud800" through; Avro, Kafka and every client want real text
        value.encode()
    except UnicodeEncodeError as exc:
        raise Problem(422, "invalid-body", f"'{name}' holds an unpaired surrogate at character "
                      f"{exc.start}: not Unicode text", field=name) from exc
    return value


def _message(m: StoredMessage) -> dict[str, Any]:
    return {
        "message_id": m.message_id, "role": m.role, "text": m.text, "run_id": m.run_id,
        "created_at_ms": m.created_at_ms,
        "steps": [{"kind": s.kind, "name": s.name, "payload_json": s.payload_json}
                  for s in m.steps],
        "citations": [{"url": c.url, "title": c.title} for c in m.citations],
    }


def _thread(state: ThreadState) -> dict[str, Any]:
    run = state.active_run
    return {
        "thread_id": state.thread_id, "title": state.title, "created_at_ms": state.created_at_ms,
        "workflow_id": workflow_id_for(state.thread_id), "message_count": len(state.messages),
        "active_run": None if run is None else {
            "run_id": run.run_id, "message_id": run.message_id, "attempt": run.attempt,
            "status": run.status.value},
        "runs": [{"run_id": r.run_id, "message_id": r.message_id, "status": r.status.value,
                  "attempts": r.attempts} for r in state.runs.values()],
    }


async def _own_thread(request: web.Request) -> ThreadState:
    state = await request.app[READ_MODEL].thread(request[TENANT], request.match_info["thread_id"])
    if state is None:
        raise Problem(404, "not-found", "no such thread")
    return state


async def create_thread(request: web.Request) -> web.Response:
    """POST /v1/threads"""
    body = await _body(request, required=False)
    title = _string(body, "title", "")
    if len(title) > MAX_TITLE_CHARS:
        raise Problem(422, "invalid-body", f"'title' is longer than {MAX_TITLE_CHARS} characters")
    tenant, thread_id = request[TENANT], str(uuid.uuid4())
    command = CreateThread(thread_id, tenant, title, _now_ms())
    request.app[READ_MODEL].note_write(thread_id)
    event = await request.app[BUS].decide(command, tenant, new_traceparent(
        request.headers.get("traceparent")))
    location = {"Location": f"/v1/threads/{thread_id}"}
    if not isinstance(event, ThreadCreated):
        return _json(202, {"thread_id": thread_id, "title": title,
                           "workflow_id": workflow_id_for(thread_id), "status": "pending"},
                     location)
    state = ThreadState(thread_id=thread_id, tenant=tenant, title=title,
                        created_at_ms=event.at_ms)
    return _json(201, {**_thread(state), "status": "created"}, location)


async def get_thread(request: web.Request) -> web.Response:
    """GET /v1/threads/{thread_id}"""
    return _json(200, _thread(await _own_thread(request)))


async def list_messages(request: web.Request) -> web.Response:
    """GET /v1/threads/{thread_id}/messages"""
    state = await _own_thread(request)
    return _json(200, {"thread_id": state.thread_id,
                       "messages": [_message(m) for m in state.messages]})


def _idempotency_key(request: web.Request) -> str | None:
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
    settings = request.app[SETTINGS]
    state = await _own_thread(request)
    body = await _body(request, required=True)
    text = _string(body, "input_text")
    limit = settings.policy.max_input_chars
    if not text.strip():
        raise Problem(422, "invalid-input", "'input_text' is empty", field="input_text")
    if len(text) > limit:
        raise Problem(422, "invalid-input", f"'input_text' has {len(text)} characters, the "
                      f"limit is {limit}", field="input_text")
    key = _idempotency_key(request)
    tenant, thread_id = request[TENANT], state.thread_id
    read_model = request.app[READ_MODEL]
    request.app[LIMITER].admit_run(tenant, tenant_active_runs(read_model, tenant))
    message_id = message_id_for(tenant, thread_id, key) if key else str(uuid.uuid4())
    command = PostUserMessage(thread_id, tenant, message_id, text, key, _now_ms())
    request.app[READ_MODEL].note_write(thread_id)
    event = await request.app[BUS].decide(command, tenant, new_traceparent(
        request.headers.get("traceparent")))
    return _post_answer(event, thread_id, message_id)


def _post_answer(event: Event | None, thread_id: str, message_id: str) -> web.Response:
    accepted = {"workflow_id": workflow_id_for(thread_id), "message_id": message_id,
                "run_id": run_id_for(thread_id, message_id)}
    if event is None:
        return _json(202, {**accepted, "status": "pending"})
    if isinstance(event, MessageAccepted | RunAccepted):
        return _json(202, {**accepted, "status": "accepted"})
    if not isinstance(event, RunRejected):
        raise Problem(500, "internal", f"unexpected decision {type(event).__name__}")
    match event.reason:
        case RejectReason.DUPLICATE:
            run_id = event.existing_run_id or accepted["run_id"]
            return _json(202, {**accepted, "run_id": run_id, "status": "accepted",
                               "replayed": True})
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


async def cancel_run(request: web.Request) -> web.Response:
    """POST /v1/threads/{thread_id}/runs/{run_id}/cancel"""
    run_id = request.match_info["run_id"]
    state = await _own_thread(request)
    if run_id not in state.runs:
        raise Problem(404, "not-found", "no such run on this thread")
    body = await _body(request, required=False)
    reason = _string(body, "reason", "cancelled by the client")[:500]
    record = state.runs[run_id]
    if record.status.is_terminal:
        raise Problem(409, "run-finished", f"the run already ended ({record.status.value})",
                      run_status=record.status.value)
    tenant = request[TENANT]
    command = CancelRun(state.thread_id, tenant, run_id, reason, _now_ms())
    request.app[READ_MODEL].note_write(state.thread_id)
    event = await request.app[BUS].decide(command, tenant, new_traceparent(
        request.headers.get("traceparent")), watch_run=run_id)
    if event is None:
        return _json(202, {"run_id": run_id, "status": "pending"})
    if isinstance(event, RunCancelled):
        return _json(202, {"run_id": run_id, "status": "cancelled"})
    ended = RunStatus.COMPLETED if isinstance(event, RunCompleted) else RunStatus.FAILED
    raise Problem(409, "run-finished", "the run ended before it could be cancelled",
                  run_status=ended.value)
