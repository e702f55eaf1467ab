"""Human in the loop over HTTP: `POST /v1/threads/{thread_id}/runs/{run_id}/resume`.

A run whose agent called `interrupt(payload)` is `interrupted`: `GET` of the thread
shows `active_run.status: "interrupted"` and `active_run.interrupt` (the payload),
and the stream carries an `interrupt` lifecycle event with the payload as its
`detail`. The body `{"value": <any JSON>}` resumes it: the agent's `interrupt()`
returns the value. 202 `resumed` (or `pending`), 404 for an unknown run, 409 if the
run is not interrupted, 413 if the value is larger than a journal entry may be.
`resume` is the decision itself, shared with the LangGraph API's `command.resume`.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from gateway.api.rest import own_run
from gateway.http.auth import TENANT
from gateway.http.plumbing import json_answer, read_json_body
from gateway.http.problems import Problem
from gateway.keys import BUS, READ_MODEL, SETTINGS
from gateway.model.decisions import new_traceparent
from streams.clock import now_ms
from streams.core.domain import ResumeRun, RunCancelled, RunFailed, StepRecorded, ThreadState

__all__ = ["resume", "resume_run"]


async def resume_run(request: web.Request) -> web.Response:
    """POST /v1/threads/{thread_id}/runs/{run_id}/resume"""
    run_id = request.match_info["run_id"]
    state, run = await own_run(request)
    body = await read_json_body(request, required=True)
    if "value" not in body:
        raise Problem(422, "invalid-body", "'value' is required (any JSON)", field="value")
    status = await resume(request, state, run_id, body["value"],
                          run.status.value if run.status is not None else "unknown")
    return json_answer(202, {"run_id": run_id, "status": status})


async def resume(request: web.Request, state: ThreadState, run_id: str, value: Any,
                 run_status: str, field: str = "value") -> str:
    """Decide `ResumeRun` of the thread's interrupted run `run_id` with `value`:
    `resumed`, or `pending` if the decision is slow. 413 if the value is too large, 409
    if the run is not interrupted (`run_status`: its status, for the problem)."""
    value_json = json.dumps(value, ensure_ascii=False, sort_keys=True)
    limit = request.config_dict[SETTINGS].policy.journal.max_entry_bytes // 2
    if len(value_json.encode("utf-8", "surrogatepass")) > limit:
        raise Problem(413, "value-too-large", f"the value is larger than {limit} bytes",
                      field=field)
    active = state.active_run
    if active is None or active.run_id != run_id or not active.awaiting_resume:
        raise Problem(409, "run-not-interrupted", f"the run is not interrupted ({run_status})",
                      run_status=run_status)
    tenant = request[TENANT]
    command = ResumeRun(state.thread_id, tenant, run_id, value_json, now_ms())
    request.config_dict[READ_MODEL].note_write(state.thread_id)
    event = await request.config_dict[BUS].decide(command, tenant, new_traceparent(
        request.headers.get("traceparent")), watch_run=run_id)
    if event is None:
        return "pending"
    if isinstance(event, StepRecorded):
        return "resumed"
    ended = "cancelled" if isinstance(event, RunCancelled) else \
        "failed" if isinstance(event, RunFailed) else "completed"
    raise Problem(409, "run-not-interrupted", "the run ended before it could be resumed",
                  run_status=ended)
