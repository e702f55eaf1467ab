"""Copies of a thread (docs/branches.md, "Copies"): `POST /v1/threads/{thread_id}/copy`,
and `copy_into`, which every API that copies goes through (LangGraph's `threads.copy`).

A copy is one command on the source (`CopyThread`); the processors carry the history
over in parts (`streams.core.copies`), and the answer waits for the copy's last part,
so a client that gets the new thread can read all of it at once, from any branch. If
no decision came in time the copy still completes: 202 with the new thread's id.
"""

from __future__ import annotations

import uuid

from aiohttp import web

from gateway.api.rest import MAX_TITLE_CHARS, own_thread, string_field, thread_json
from gateway.http.auth import TENANT
from gateway.http.plumbing import json_answer, read_json_body
from gateway.http.problems import Problem
from gateway.keys import BUS, LIMITER, READ_MODEL
from gateway.model.decisions import new_traceparent
from streams.clock import now_ms
from streams.core.domain import (
    CopyThread,
    Event,
    HistoryImported,
    RejectReason,
    RunRejected,
    ThreadState,
)
from streams.core.ids import workflow_id_for

__all__ = ["copy_into", "copy_thread"]


def _answers(event: Event) -> bool:
    """A copy is answered by its refusal on the source or by its last part on the copy."""
    return isinstance(event, RunRejected) or (isinstance(event, HistoryImported) and event.last)


async def copy_into(request: web.Request, state: ThreadState, target_id: str,
                    title: str) -> ThreadState | None:
    """Copy the caller's thread `state`, every branch, into new thread `target_id`: its
    state once it is complete and readable, or None if no decision came in time (it
    will still be made). Refusals raise their problem."""
    tenant, read_model = request[TENANT], request.config_dict[READ_MODEL]
    read_model.note_write(target_id)
    with request.config_dict[LIMITER].copy(tenant):  # 429 past THREADLINE_TENANT_MAX_COPIES
        event = await request.config_dict[BUS].decide(
            CopyThread(state.thread_id, tenant, target_id, title, now_ms()), tenant,
            new_traceparent(request.headers.get("traceparent")), answers=_answers)
    if event is None:
        return None
    if isinstance(event, RunRejected):
        if event.reason is RejectReason.UNKNOWN_THREAD:
            raise Problem(404, "not-found", "no such thread")
        if event.reason is RejectReason.CONFLICT:
            raise Problem(409, "copy-conflict", event.detail)
        raise Problem(422, "copy-refused", event.detail)
    copied = await read_model.thread(tenant, target_id)
    return copied if copied is not None and not copied.import_parts_left else None


async def copy_thread(request: web.Request) -> web.Response:
    """POST /v1/threads/{thread_id}/copy `{title?}`: a new thread holding this one's
    history, every branch at its own seq, the same branch current; 201 with it."""
    state = await own_thread(request)
    body = await read_json_body(request, required=False)
    title = string_field(body, "title", state.title)
    if len(title) > MAX_TITLE_CHARS:
        raise Problem(422, "invalid-body", f"'title' is longer than {MAX_TITLE_CHARS} characters",
                      field="title")
    target_id = str(uuid.uuid4())
    location = {"Location": f"/v1/threads/{target_id}"}
    copied = await copy_into(request, state, target_id, title)
    if copied is None:
        return json_answer(202, {"id": target_id, "thread_id": target_id, "title": title,
                                 "workflow_id": workflow_id_for(target_id),
                                 "copied_from": state.thread_id, "status": "pending"}, location)
    display = request.config_dict[READ_MODEL].display_title(copied)
    return json_answer(201, {**thread_json(copied, display), "status": "copied"}, location)
