"""The native API of a thread's branches (docs/branches.md): regenerate an answer,
edit a user message, list the branches, switch the current one.

Each write publishes one command and answers with the processor's decision, as a
post does (`gateway.api.rest`): 202 with the run (`"status": "pending"` if no decision
came in time), the same problem+json errors, an `Idempotency-Key` that makes a resend
answer with the original run. A branch is named by the seq of its newest message
(`branch`); `GET /v1/threads/{id}/messages?branch=` reads one.
"""

from __future__ import annotations

import uuid
from typing import Any

from aiohttp import web

from gateway.api.rest import (
    check_input_text,
    decided_run,
    idempotency_key,
    multitask_strategy,
    own_thread,
    string_field,
)
from gateway.http.auth import TENANT
from gateway.http.limits import tenant_active_runs
from gateway.http.plumbing import json_answer, read_json_body
from gateway.http.problems import Problem
from gateway.keys import BUS, LIMITER, READ_MODEL
from gateway.model.branches import branch_heads
from gateway.model.decisions import new_traceparent
from gateway.model.read_model import ReadModel
from streams.clock import now_ms
from streams.core.branches import head_of
from streams.core.domain import (
    BranchSwitched,
    Command,
    EditMessage,
    Event,
    MultitaskStrategy,
    RegenerateAccepted,
    RegenerateAnswer,
    RejectReason,
    RunRejected,
    SwitchBranch,
    ThreadState,
)
from streams.core.ids import (
    idempotent_message_id_for,
    regenerate_run_id_for,
    run_id_for,
    workflow_id_for,
)

__all__ = ["edit_message", "list_branches", "question_seq", "regenerate", "regenerate_answer",
           "edit", "switch_branch"]


def question_seq(read_model: ReadModel, thread_id: str, message_id: str) -> int:
    """The seq of the user message `message_id` names: itself, or for an answer, the
    question it answers. 404 if the thread holds no such message."""
    store = read_model.store
    seq = store.message_seq(thread_id, message_id)
    record = None if seq is None else store.message(thread_id, seq)
    if seq is None or record is None:
        raise Problem(404, "no-such-message", "the thread holds no message with this id",
                      message_id=message_id)
    if record.message.role == "user":
        return seq
    ref = store.run(record.message.run_id)  # the answer's run names its question
    if ref is None or ref.thread_id != thread_id:
        raise Problem(422, "invalid-input", "this answer's question is not stored any more",
                      message_id=message_id)
    return ref.seq


async def _decide(request: web.Request, state: ThreadState, command: Command) -> Event | None:
    request.config_dict[READ_MODEL].note_write(state.thread_id)
    return await request.config_dict[BUS].decide(command, request[TENANT], new_traceparent(
        request.headers.get("traceparent")))


def _refused(event: RunRejected) -> Problem:
    """The problem of a refused regenerate, edit or switch (a duplicate is no refusal)."""
    if event.reason is RejectReason.CONFLICT:
        return Problem(409, "branch-conflict", event.detail or "another run is active on the "
                       "thread", active_run_id=event.existing_run_id)
    if event.reason is RejectReason.PAYLOAD_MISMATCH:
        return Problem(422, "idempotency-key-reused", "the Idempotency-Key was used with "
                       "another body", existing_run_id=event.existing_run_id)
    if event.reason is RejectReason.UNKNOWN_THREAD:
        return Problem(404, "not-found", "no such thread")
    return Problem(422, "invalid-input", event.detail)


def _admit_run(request: web.Request) -> None:
    tenant = request[TENANT]
    request.config_dict[LIMITER].admit_run(
        tenant, tenant_active_runs(request.config_dict[READ_MODEL], tenant))


async def regenerate_answer(request: web.Request, state: ThreadState, seq: int, key: str,
                            strategy: MultitaskStrategy) -> tuple[str, bool, Event | None]:
    """Regenerate the answer to the user message at `seq`: (the run, whether it is the
    original run of a repeated key, the decision or None while pending). Every API
    that regenerates goes through here."""
    read_model = request.config_dict[READ_MODEL]
    record = read_model.store.message(state.thread_id, seq)
    if record is None or record.message.role != "user":
        raise Problem(404, "no-such-message", "no user message at this seq")
    _admit_run(request)
    run_id = regenerate_run_id_for(state.thread_id, key)
    event = await _decide(request, state, RegenerateAnswer(
        state.thread_id, request[TENANT], record.message.message_id, key, now_ms(), strategy))
    if isinstance(event, RunRejected):
        if event.reason is not RejectReason.DUPLICATE:
            raise _refused(event)
        return event.existing_run_id or run_id, True, event
    if event is not None and not isinstance(event, RegenerateAccepted):
        raise Problem(500, "internal", f"unexpected decision {type(event).__name__}")
    return (run_id if event is None else event.run_id), False, event


async def regenerate(request: web.Request) -> web.Response:
    """POST /v1/threads/{thread_id}/messages/{message_id}/regenerate
    `{multitask_strategy?}`: answer the user message again (or, named by an answer,
    the question it answers) on a new branch from it, which becomes current."""
    state = await own_thread(request)
    body = await read_json_body(request, required=False)
    strategy = multitask_strategy(body.get("multitask_strategy", MultitaskStrategy.REJECT.value))
    seq = question_seq(request.config_dict[READ_MODEL], state.thread_id,
                       request.match_info["message_id"])
    key = idempotency_key(request) or str(uuid.uuid4())
    run_id, replayed, event = await regenerate_answer(request, state, seq, key, strategy)
    record = request.config_dict[READ_MODEL].store.message(state.thread_id, seq)
    answer: dict[str, Any] = {
        "workflow_id": workflow_id_for(state.thread_id), "run_id": run_id,
        "message_id": record.message.message_id if record is not None else None,
        "branch": seq, "status": "pending" if event is None else "accepted"}
    if replayed:
        answer["replayed"] = True
    return json_answer(202, answer)


async def edit(request: web.Request, state: ThreadState, message_id: str, text: str,
               new_message_id: str, key: str | None, strategy: MultitaskStrategy,
               field: str = "input_text") -> Event | None:
    """Post `text` as user message `new_message_id` in place of user message
    `message_id`, on a new branch from its parent: the decision (None while pending).
    Every API that edits goes through here."""
    check_input_text(request, text, field)
    _admit_run(request)
    event = await _decide(request, state, EditMessage(
        state.thread_id, request[TENANT], message_id, new_message_id, text, key, now_ms(),
        strategy))
    if isinstance(event, RunRejected) and event.reason is not RejectReason.DUPLICATE:
        raise _refused(event)
    return event


async def edit_message(request: web.Request) -> web.Response:
    """POST /v1/threads/{thread_id}/messages/{message_id}/edit `{input_text,
    message_id?, multitask_strategy?}`: a new user message in place of this one, on a
    new branch from its parent, which becomes current and runs."""
    state = await own_thread(request)
    body = await read_json_body(request, required=True)
    text = string_field(body, "input_text")
    strategy = multitask_strategy(body.get("multitask_strategy", MultitaskStrategy.REJECT.value))
    message_id = request.match_info["message_id"]
    seq = request.config_dict[READ_MODEL].store.message_seq(state.thread_id, message_id)
    if seq is None:
        raise Problem(404, "no-such-message", "the thread holds no message with this id",
                      message_id=message_id)
    key = idempotency_key(request)
    new_id = body.get("message_id")
    if new_id is not None and (not isinstance(new_id, str) or not 0 < len(new_id) <= 200
                               or not new_id.isprintable()):
        raise Problem(422, "invalid-body", "'message_id' must be 1 to 200 printable "
                      "characters", field="message_id")
    if new_id is None:
        new_id = idempotent_message_id_for(request[TENANT], state.thread_id, key) if key \
            else str(uuid.uuid4())
    event = await edit(request, state, message_id, text, new_id, key, strategy)
    accepted = {"workflow_id": workflow_id_for(state.thread_id), "message_id": new_id,
                "run_id": run_id_for(state.thread_id, new_id), "edited_message_id": message_id}
    if event is None:
        return json_answer(202, {**accepted, "status": "pending"})
    run_id, replayed = decided_run(event, state.thread_id, new_id)
    return json_answer(202, {**accepted, "run_id": run_id, "status": "accepted",
                             **({"replayed": True} if replayed else {})})


async def list_branches(request: web.Request) -> web.Response:
    """GET /v1/threads/{thread_id}/branches: every branch, the current one first, with
    where it forks from the current one."""
    state = await own_thread(request)
    read_model = request.config_dict[READ_MODEL]
    found = []
    for branch in read_model.branches(state):
        record = read_model.store.message(state.thread_id, branch.seq) if branch.seq >= 0 \
            else None
        found.append({"branch": branch.seq, "current": branch.current,
                      "fork_seq": branch.fork_seq, "first_seq": branch.first_seq,
                      "message_count": branch.message_count,
                      "message_id": None if record is None else record.message.message_id,
                      "role": None if record is None else record.message.role})
    return json_answer(200, {"thread_id": state.thread_id, "current": head_of(state),
                             "branches": found})


async def switch_branch(request: web.Request) -> web.Response:
    """POST /v1/threads/{thread_id}/branches/current `{branch}`: make the branch whose
    newest message is at seq `branch` the current one (409 while a run is active)."""
    state = await own_thread(request)
    body = await read_json_body(request, required=True)
    seq = body.get("branch")
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise Problem(422, "invalid-body", "'branch' must be a branch's seq "
                      "(GET /v1/threads/{thread_id}/branches)", field="branch")
    if seq not in branch_heads(state):
        raise Problem(404, "no-such-branch", f"{seq} names no branch of this thread",
                      field="branch")
    answer = {"thread_id": state.thread_id, "branch": seq}
    if seq == head_of(state):  # current already: a switch would decide nothing
        return json_answer(200, {**answer, "status": "current"})
    event = await _decide(request, state, SwitchBranch(state.thread_id, request[TENANT], seq,
                                                       now_ms()))
    if event is None:
        return json_answer(202, {**answer, "status": "pending"})
    if isinstance(event, RunRejected):
        raise _refused(event)
    if not isinstance(event, BranchSwitched):
        raise Problem(500, "internal", f"unexpected decision {type(event).__name__}")
    return json_answer(200, {**answer, "status": "switched"})
