"""The LangGraph API's runs (`gateway.adapters.langgraph`): create, stream, wait, list, get,
join, join_stream, cancel. A run is a user message posted as `POST
/v1/threads/{id}/user_message` posts it, with the body's `multitask_strategy` (`reject`,
the default, `enqueue`, `interrupt` or `rollback`; docs/multitask.md).

Human in the loop: a body with `command: {"resume": value}` (instead of `input`)
resumes the thread's interrupted run as `POST /v1/.../runs/{run_id}/resume` does
(`gateway.api.interrupts.resume`), and answers that same run: Threadline continues the
run where LangGraph would start a new one. Its stream (and `wait`) begins after the
interrupt resumed, so the client gets no part twice. 409 if no run is interrupted."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.adapters.langgraph.checkpoints import run_from_checkpoint, wanted_checkpoint
from gateway.adapters.langgraph.events import modes_from, modes_from_query
from gateway.adapters.langgraph.stream import links, stream_run_events, wait_for_run
from gateway.adapters.langgraph.threads import (
    ASSISTANT_NAMES,
    MAX_OFFSET,
    MAX_PAGE,
    create_lg_thread,
    find_thread,
    own_thread,
)
from gateway.adapters.langgraph.views import (
    interrupted_run,
    pending_interrupt,
    resumed_interrupts,
    run_json,
    thread_status,
)
from gateway.api import rest
from gateway.api.interrupts import resume
from gateway.http.auth import TENANT
from gateway.http.plumbing import END_SEQ, int_field, is_text, read_json_body
from gateway.http.problems import Problem
from gateway.keys import BUS, READ_MODEL
from gateway.model.decisions import new_traceparent
from gateway.model.placement import served_here
from gateway.model.read_model import RunView
from streams.clock import now_ms
from streams.core.domain import (
    CancelRun,
    Event,
    MessageAccepted,
    RejectReason,
    RunAccepted,
    RunCancelled,
    RunRejected,
    ThreadState,
)
from streams.core.ids import run_id_for

__all__ = ["cancel_run", "create_run", "get_run", "join_run", "join_stream", "list_runs",
           "stream_run", "wait_run"]


def _check_unsupported(body: dict[str, Any]) -> None:
    for name in ("interrupt_before", "interrupt_after"):
        if body.get(name):
            raise Problem(422, "unsupported", f"'{name}' is not supported by this server",
                          field=name)
    assistant_id = body.get("assistant_id")
    if assistant_id is not None and (not isinstance(assistant_id, str) or
                                     assistant_id not in ASSISTANT_NAMES):
        raise Problem(404, "not-found", "no such assistant")


def _input_text(body: dict[str, Any]) -> str:
    raw = body.get("input")
    messages = raw.get("messages") if isinstance(raw, dict) else None
    if isinstance(messages, dict):
        messages = [messages]
    texts = [_text(m) for m in messages or [] if isinstance(m, dict) and
             (m.get("role") in ("user", "human") or m.get("type") == "human")]
    if texts and not is_text(texts[-1]):
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


async def _resume_command(request: web.Request,
                          body: dict[str, Any]) -> tuple[ThreadState, str, int] | None:
    """A `command.resume`: resume the thread's interrupted run; the thread, the run id
    and the number of the interrupt resumed. None without a command."""
    command = body.get("command")
    if not command:
        return None
    if not isinstance(command, dict) or "resume" not in command or set(command) != {"resume"}:
        raise Problem(422, "unsupported", "of 'command' only 'resume' is supported (not "
                      "'goto' nor 'update')", field="command")
    if body.get("input") is not None:
        raise Problem(422, "invalid-body", "'command' and 'input' are exclusive", field="input")
    if wanted_checkpoint(body) is not None:
        raise Problem(422, "invalid-body", "'command' and a checkpoint are exclusive (a "
                      "resume continues the interrupted run)", field="checkpoint_id")
    state = await own_thread(request)
    run_id, pending = interrupted_run(state), pending_interrupt(state)
    if run_id is None or pending is None:
        raise Problem(409, "run-not-interrupted", "the thread has no interrupted run to "
                      f"resume (it is {thread_status(state)})", thread_status=thread_status(state))
    value = command["resume"]
    if isinstance(value, dict) and list(value) == [pending[1]["id"]]:
        value = value[pending[1]["id"]]  # resume by interrupt id
    number = resumed_interrupts(state, run_id) + 1
    await resume(request, state, run_id, value, "interrupted", field="command")
    return state, run_id, number


async def _start(request: web.Request, body: dict[str, Any]) -> tuple[ThreadState, str]:
    """Post the run's user message (as POST /v1/.../user_message does), or with a
    checkpoint, regenerate or edit from it (`checkpoints.run_from_checkpoint`): the
    thread, run id."""
    checkpoint = wanted_checkpoint(body)
    text = None if checkpoint is not None and body.get("input") is None else _input_text(body)
    strategy = rest.multitask_strategy(body.get("multitask_strategy") or "reject")
    lg_id = request.match_info["thread_id"]
    state = await find_thread(request, lg_id)
    if state is None:
        if body.get("if_not_exists") != "create" or checkpoint is not None:
            raise Problem(404, "not-found", "no such thread")
        state = await create_lg_thread(request, lg_id)
    if checkpoint is not None:
        run_id = await run_from_checkpoint(request, state, checkpoint, text, strategy)
        if run_id is not None:
            return state, run_id
    assert text is not None  # a checkpoint without input never posts
    event, message_id = await rest.submit_user_message(request, state, text, None, field="input",
                                                      strategy=strategy)
    _check_accepted(event)
    return state, run_id_for(state.thread_id, message_id)


def _check_accepted(event: Event | None) -> None:
    if event is None or isinstance(event, MessageAccepted | RunAccepted):
        return  # None: the decision is slow; the command is queued and will run
    if isinstance(event, RunRejected):
        if event.reason == RejectReason.CONFLICT:
            raise Problem(409, "run-active", "another run is active on the thread (and the "
                          "multitask_strategy is 'reject', or the queue is full)",
                          active_run_id=event.existing_run_id)
        raise Problem(422, "invalid-input", event.detail)
    raise Problem(500, "internal", f"unexpected decision {type(event).__name__}")


async def create_run(request: web.Request) -> web.Response:
    """POST /threads/{thread_id}/runs: a background run (or a resumed one)."""
    body = await read_json_body(request, required=False)
    _check_unsupported(body)
    resumed = await _resume_command(request, body)
    state, run_id = resumed[:2] if resumed else await _start(request, body)
    lg_id = request.match_info["thread_id"]
    headers = links(run_id, lg_id)
    run = run_json(state, run_id, None, now_ms())
    run["status"] = "pending"
    run["multitask_strategy"] = body.get("multitask_strategy") or "reject"
    return web.json_response(run, headers=headers)


async def stream_run(request: web.Request) -> web.StreamResponse:
    """POST /threads/{thread_id}/runs/stream"""
    body = await read_json_body(request, required=False)
    try:
        modes = modes_from(body.get("stream_mode"))
    except ValueError as exc:
        raise Problem(422, "invalid-body", str(exc), field="stream_mode") from exc
    _check_unsupported(body)
    resumed = await _resume_command(request, body)
    if resumed is not None:
        state, run_id, number = resumed
        return await stream_run_events(request, state, run_id, modes, None, resumed=number,
                                       after_interrupt=number)
    state, run_id = await _start(request, body)
    return await stream_run_events(request, state, run_id, modes, None)


@served_here
async def join_stream(request: web.Request) -> web.StreamResponse:
    """GET /threads/{thread_id}/runs/{run_id}/stream (Last-Event-ID resumes)."""
    state = await own_thread(request)
    run_id = request.match_info["run_id"]
    run = await own_run(request, state, run_id)
    try:
        modes = modes_from(modes_from_query(request.query.getall("stream_mode", [])))
    except ValueError as exc:
        raise Problem(422, "invalid-body", str(exc), field="stream_mode") from exc
    state = await _fresh(request, state)
    return await stream_run_events(request, state, run_id, modes,
                                   request.headers.get("Last-Event-ID"), _resumed(state, run))


async def _fresh(request: web.Request, state: ThreadState) -> ThreadState:
    # Read to the partition's end first: a join right after a resume must not take
    # the resumed interrupt for a pending one (and end the stream there).
    return await request.config_dict[READ_MODEL].thread(request[TENANT], state.thread_id,
                                                fresh=True) or state


def _resumed(state: ThreadState, run: RunView) -> int | None:
    """How many of the run's interrupts were resumed: a later one ends its stream (None,
    for an ended run: none does)."""
    return None if run.terminal else resumed_interrupts(state, run.run_id)


async def own_run(request: web.Request, state: ThreadState, run_id: str) -> RunView:
    run = await request.config_dict[READ_MODEL].run(request[TENANT], run_id)
    if run is None or run.state.thread_id != state.thread_id:
        raise Problem(404, "not-found", "no such run on this thread")
    return run


async def wait_run(request: web.Request) -> web.Response:
    """POST /threads/{thread_id}/runs/wait: the thread's values once the run ended."""
    body = await read_json_body(request, required=False)
    _check_unsupported(body)
    resumed = await _resume_command(request, body)
    state, run_id = resumed[:2] if resumed else await _start(request, body)
    headers = links(run_id, request.match_info["thread_id"])
    headers["Location"] = headers["Content-Location"] + "/join"
    return web.json_response(await wait_for_run(request, state, run_id,
                                                resumed[2] if resumed else 0), headers=headers)


async def join_run(request: web.Request) -> web.Response:
    """GET /threads/{thread_id}/runs/{run_id}/join"""
    state = await own_thread(request)
    run = await own_run(request, state, request.match_info["run_id"])
    state = await _fresh(request, state)
    return web.json_response(await wait_for_run(request, state, run.run_id,
                                                _resumed(state, run)))


async def get_run(request: web.Request) -> web.Response:
    """GET /threads/{thread_id}/runs/{run_id}"""
    state = await own_thread(request)
    run = await own_run(request, state, request.match_info["run_id"])
    return web.json_response(run_json(state, run.run_id, run.status, run.accepted_at_ms))


async def list_runs(request: web.Request) -> web.Response:
    """GET /threads/{thread_id}/runs?limit&offset: newest first, from the user messages."""
    state = await own_thread(request)
    limit = int_field(request.query.get("limit"), "limit", 10, MAX_PAGE)
    offset = int_field(request.query.get("offset"), "offset", 0, MAX_OFFSET)
    read_model = request.config_dict[READ_MODEL]
    runs: list[dict[str, Any]] = []
    before = END_SEQ
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
    state = await own_thread(request)
    run_id = request.match_info["run_id"]
    action = request.query.get("action", "interrupt")
    if action != "interrupt":
        raise Problem(422, "unsupported", f"cancel action '{action}' is not supported yet; "
                      "only 'interrupt' is", field="action")
    run = await own_run(request, state, run_id)
    if run.terminal:
        raise Problem(409, "run-finished", "the run already ended",
                      run_status=run.status.value if run.status else None)
    tenant = request[TENANT]
    request.config_dict[READ_MODEL].note_write(state.thread_id)
    event = await request.config_dict[BUS].decide(
        CancelRun(state.thread_id, tenant, run_id, "cancelled by the client", now_ms()), tenant,
        new_traceparent(request.headers.get("traceparent")), watch_run=run_id)
    if event is not None and not isinstance(event, RunCancelled):
        raise Problem(409, "run-finished", "the run ended before it could be cancelled")
    if request.query.get("wait") in ("1", "true"):
        await wait_for_run(request, state, run_id)
    return web.Response(status=202)
