"""The Vercel AI SDK's chat endpoints (`useChat` with `DefaultChatTransport`).

* `POST /v1/ai/chat` `{id, messages, trigger, messageId}`: `id` is the chat; its
  thread is `chat_thread_id(tenant, id)`, so chat ids are namespaced per tenant and a
  new one creates the thread. Only the newest user message is read (the history is
  ours); its `id` is its idempotency key (or the `Idempotency-Key` header, which
  wins), so a resend is answered with the original run and the same key with other
  text gets `422`, as on `POST /v1/threads/{id}/user_message`; a post while a run is
  active gets `409`. The answer is the run as the UI message stream
  (`gateway.adapters.ai_sdk.ui_stream`), which ends early at a tool's approval request.
  When the last message is the assistant's, the post is the SDK's answer to a tool
  approval (`gateway.adapters.ai_sdk.approvals`): it resumes the interrupted run with
  `{"approved", "reason"}` once (a repeat, or a concurrent twin, finds it answered and
  resumes nothing; another answer to it while the run goes on is `409`) and streams
  what follows the interrupt. `409` if the chat's runs do not wait on that approval.
  Branches (docs/branches.md): a user message whose id the chat holds already (its
  own, or the UI id it was posted with), sent with other text (or with its own, when
  the current branch left it: an edit back), is an edit (`sendMessage
  ({text, messageId})`): a new message on a new branch from the old one's parent, its
  key the Idempotency-Key header or one made from the UI id and the text, so a resend
  runs once. `trigger: "regenerate-message"` (`regenerate()`) answers the last user
  message again on a new branch (`_regenerate`).
* `GET /v1/ai/chat/{chat_id}/stream`: the transport's reconnect. The active run,
  replayed from its start out of Kafka and then live (to its end, or to a tool approval
  not answered yet), or `204` when none is active.
* `POST /v1/ai/chat/{chat_id}/cancel`: cancels the active run (the SDK's `stop()`
  only aborts the fetch; a closed connection never cancels a run).
* `GET /v1/ai/chat/{chat_id}/messages`: the current branch's messages as `UIMessage`s.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from collections.abc import Sequence
from functools import partial
from typing import Any

from aiohttp import web

from gateway.adapters.ai_sdk.approvals import Approval, answers, approval_in
from gateway.adapters.ai_sdk.ui_stream import (
    DONE,
    UI_STREAM_HEADERS,
    UiMessageStream,
    chunk_frame,
    ui_message,
)
from gateway.api import branches, rest
from gateway.api.interrupts import resume
from gateway.http.auth import TENANT
from gateway.http.plumbing import END_SEQ, query_limit, read_json_body
from gateway.http.problems import Problem
from gateway.keys import BUS, READ_MODEL
from gateway.live.run_stream import Gone
from gateway.live.sse import SseEvent
from gateway.live.streaming import serve_run
from gateway.model.branches import path_oldest_first
from gateway.model.decisions import new_traceparent
from gateway.model.placement import served_here
from gateway.model.read_model import RunView
from streams.clock import now_ms
from streams.core.branches import head_of
from streams.core.domain import CreateThread, MultitaskStrategy, ThreadCreated, ThreadState
from streams.core.ids import idempotent_message_id_for, run_id_for
from streams.core.records import MessageRecord

__all__ = ["UiFraming", "cancel_chat", "chat", "chat_messages", "chat_thread_id", "resume_chat"]

# The resumes this gateway is deciding, by (thread, run, interrupt number): a second
# post of the same approval waits for the first one's decision.
RESUMING = web.AppKey("ai_sdk_resuming", dict)

# Fixed forever: changing it moves every chat to a new thread.
_CHAT_NAMESPACE = uuid.UUID("8f3b1a52-6f0e-4c1e-9d53-41d1c0a7e2b4")
MAX_CHAT_ID_CHARS = 255
TITLE_CHARS = 80
RUN_WAIT_S = 10.0  # how long a post waits for its run to reach the read model


def chat_thread_id(tenant: str, chat_id: str) -> str:
    """The thread of a tenant's chat: another tenant's same chat id is another thread."""
    return str(uuid.uuid5(_CHAT_NAMESPACE, f"{len(tenant)}:{tenant}:{chat_id}"))


class UiFraming:
    """`gateway.live.streaming.Framing` for the UI message stream: one per connection
    (`UiMessageStream`'s arguments)."""

    headers = UI_STREAM_HEADERS

    def __init__(self, *, resumed: int | None = 0, answers: Sequence[Any] = (),
                 after_interrupt: int = 0) -> None:
        self.stream = UiMessageStream(resumed=resumed, answers=answers,
                                      after_interrupt=after_interrupt)

    @property
    def finished(self) -> bool:
        """Whether `[DONE]` went out (at a tool approval request, before the run's end)."""
        return self.stream.finished

    def encode(self, events: list[SseEvent]) -> bytes:
        """The frames of the chunks these events map to."""
        frames = []
        for event in events:
            fields = {} if event.terminal else json.loads(event.data)
            frames += [chunk_frame(c) for c in self.stream.chunks(event.name, fields)]
        return b"".join(frames)

    def gone(self, gone: Gone) -> bytes:
        """An `error` chunk: the run left the stream topic; its message is stored."""
        self.stream.finished = True
        return chunk_frame({"type": "error", "errorText": (
            "this run's stream is no longer retained; its message is in GET "
            f"/v1/threads/{gone.thread_id}/messages")}) + chunk_frame(DONE)


def _chat_id(raw: object) -> str:
    if not isinstance(raw, str) or not 1 <= len(raw) <= MAX_CHAT_ID_CHARS or \
            not raw.isprintable():
        raise Problem(422, "invalid-body", f"'id' must be 1 to {MAX_CHAT_ID_CHARS} printable "
                      "characters", field="id")
    return raw


def _newest_user_message(messages: object) -> tuple[str, str]:
    """(id, text) of the last message, which must be the user's."""
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        raise Problem(422, "invalid-body", "'messages' must end with the user's message",
                      field="messages")
    last: dict[str, Any] = messages[-1]
    if last.get("role") != "user":
        raise Problem(422, "invalid-body", "the last message must be the user's",
                      field="messages")
    parts = last.get("parts")
    if not isinstance(parts, list):
        raise Problem(422, "invalid-body", "the user message has no 'parts'", field="messages")
    text = "".join(p["text"] for p in parts
                   if isinstance(p, dict) and p.get("type") == "text"
                   and isinstance(p.get("text"), str))
    message_id = last.get("id")
    return (message_id if isinstance(message_id, str) else ""), text


async def _thread(request: web.Request, chat_id: str) -> ThreadState | None:
    return await request.config_dict[READ_MODEL].thread(request[TENANT],
                                                chat_thread_id(request[TENANT], chat_id))


async def _create(request: web.Request, chat_id: str, title: str) -> ThreadState:
    tenant = request[TENANT]
    thread_id = chat_thread_id(tenant, chat_id)
    read_model = request.config_dict[READ_MODEL]
    read_model.note_write(thread_id)
    event = await request.config_dict[BUS].decide(CreateThread(thread_id, tenant, title[:TITLE_CHARS],
                                                       now_ms()),
                                          tenant, new_traceparent(request.headers.get("traceparent")))
    if isinstance(event, ThreadCreated):  # decided: no need to wait for the read model
        return ThreadState(thread_id=thread_id, tenant=tenant, title=event.title,
                           created_at_ms=event.at_ms)
    # A thread created meanwhile (two first posts) decides nothing: the wait times
    # out and the read below finds it.
    state = await read_model.thread(tenant, thread_id, fresh=True)
    if state is None:
        raise Problem(503, "pending", "the chat's thread is being created; retry shortly",
                      headers={"Retry-After": "2"})
    return state


async def _run(request: web.Request, run_id: str) -> RunView:
    deadline = time.monotonic() + RUN_WAIT_S
    while (run := await request.config_dict[READ_MODEL].run(request[TENANT], run_id)) is None:
        if time.monotonic() > deadline:
            raise Problem(503, "pending", "the message is queued; GET .../stream resumes its "
                          "run", headers={"Retry-After": "2"}, run_id=run_id)
        await asyncio.sleep(0.1)
    return run


async def chat(request: web.Request) -> web.StreamResponse:
    """POST /v1/ai/chat: post the newest user message, answer with its run's stream; or
    answer a tool approval (the last message is the assistant's), and stream what
    follows it."""
    body = await read_json_body(request, required=True)  # the same body rules as /v1
    chat_id = _chat_id(body.get("id"))
    trigger = body.get("trigger", "submit-message")
    if trigger not in ("submit-message", "regenerate-message"):
        raise Problem(422, "unsupported-trigger", "'trigger' must be 'submit-message' or "
                      "'regenerate-message'", field="trigger")
    messages = body.get("messages")
    if trigger == "regenerate-message":
        return await _regenerate(request, chat_id, body)
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict) and \
            messages[-1].get("role") == "assistant":
        return await _approve(request, chat_id, approval_in(messages[-1]))
    ui_id, text = _newest_user_message(messages)
    state = await _thread(request, chat_id)
    if state is None:
        if not text.strip():
            raise Problem(422, "invalid-input", "the user message has no text", field="messages")
        state = await _create(request, chat_id, text)
    stored = _stored_user_message(request, state, ui_id)
    # An edit: other text, or the same text as a message the current branch left (an
    # edit back to it); a message on the current branch with its own text is a resend.
    if stored is not None and (stored.message.text != text
                               or stored.seq not in _current_path(request, state)):
        run_id = await _edit(request, state, stored.message.message_id, ui_id, text)
    else:
        key = request.headers.get("Idempotency-Key") or ui_id or None
        event, message_id = await rest.submit_user_message(request, state, text, key)
        if event is None:
            run_id = run_id_for(state.thread_id, message_id)
        else:
            run_id, _ = rest.decided_run(event, state.thread_id, message_id)
    run = await _run(request, run_id)
    return await serve_run(request, run, _framing(run.state, run))


def _stored_user_message(request: web.Request, state: ThreadState,
                         ui_id: str) -> MessageRecord | None:
    """The thread's user message a UI message id names: its own id, or the id it was
    posted with (`submit_user_message` makes the message id from the key); or None."""
    if not ui_id:
        return None
    store = request.config_dict[READ_MODEL].store
    for message_id in (ui_id, idempotent_message_id_for(request[TENANT], state.thread_id, ui_id)):
        seq = store.message_seq(state.thread_id, message_id)
        record = None if seq is None else store.message(state.thread_id, seq)
        if record is not None and record.message.role == "user":
            return record
    return None


async def _edit(request: web.Request, state: ThreadState, message_id: str, ui_id: str,
                text: str) -> str:
    """Edit the stored user message to `text`: the run of the new message."""
    digest = hashlib.sha256(text.encode()).hexdigest()[:32]
    key = request.headers.get("Idempotency-Key") or f"ai-sdk-edit:{ui_id}:{digest}"
    new_id = idempotent_message_id_for(request[TENANT], state.thread_id, key)
    event = await branches.edit(request, state, message_id, text, new_id, key,
                                MultitaskStrategy.REJECT, field="messages")
    if event is None:
        return run_id_for(state.thread_id, new_id)
    return rest.decided_run(event, state.thread_id, new_id)[0]


def _current_path(request: web.Request, state: ThreadState) -> list[int]:
    store = request.config_dict[READ_MODEL].store
    return path_oldest_first(head_of(state), partial(store.link, state.thread_id))


async def _regenerate(request: web.Request, chat_id: str, body: dict[str, Any]) -> \
        web.StreamResponse:
    """`regenerate()`: answer the last user message of the current branch again, on a
    new branch from it, and stream the new answer.

    The key is the Idempotency-Key header, else made from what is regenerated: the
    answer `messageId` names (the SDK's `regenerate({messageId})`), else the answer
    that now follows the question on the current branch (each regenerate replaces
    it, so a second click regenerates again, while a resend of the same request
    before its answer became current runs once)."""
    state = await _thread(request, chat_id)
    if state is None:
        raise Problem(404, "not-found", "no such chat")
    ui_id, _ = _newest_user_message(body.get("messages"))
    store = request.config_dict[READ_MODEL].store
    path = _current_path(request, state)
    stored = _stored_user_message(request, state, ui_id)
    seq = stored.seq if stored is not None and stored.seq in path else None
    if seq is None:  # the UI's id names another branch's message: the current question
        seq = next((s for s in reversed(path) if (r := store.message(state.thread_id, s))
                    is not None and r.message.role == "user"), None)
    if seq is None:
        raise Problem(422, "invalid-input", "the chat has no user message to answer again",
                      field="messages")
    key = request.headers.get("Idempotency-Key")
    named = body.get("messageId")
    if key is None and isinstance(named, str) and named and named != ui_id:
        key = f"ai-sdk-regenerate:{named}"
    if key is None:
        after = path[path.index(seq) + 1:]
        answer = store.message(state.thread_id, after[0]) if after else None
        key = f"ai-sdk-regenerate:{answer.message.message_id}" if answer is not None else \
            f"ai-sdk-regenerate:{seq}:{path[-1]}"
    run_id, _, _ = await branches.regenerate_answer(request, state, seq, key,
                                                    MultitaskStrategy.REJECT)
    run = await _run(request, run_id)
    return await serve_run(request, run, _framing(run.state, run))


def _answered(state: ThreadState, run_id: str) -> list[Any] | None:
    """The values the run's interrupts were answered with so far, in order, while it is
    the thread's active run; None if it is not."""
    active = state.active_run
    if active is None or active.run_id != run_id:
        return None
    return answers(active.journal)


def _framing(state: ThreadState, run: RunView, after_interrupt: int = 0) -> UiFraming:
    """The UI framing of the run (`state`: its thread, read after `run`): it ends at a
    tool's interrupt that is not answered yet; an ended run's all are."""
    answered = _answered(state, run.run_id)
    if answered is None and run.terminal:
        return UiFraming(resumed=None, after_interrupt=after_interrupt)
    return UiFraming(resumed=len(answered or ()), answers=answered or (),
                     after_interrupt=after_interrupt)


async def _approve(request: web.Request, chat_id: str, approval: Approval) -> \
        web.StreamResponse:
    """Resume the run with the approval (once: a repeat finds it answered) and stream
    what follows that interrupt."""
    tenant, read_model = request[TENANT], request.config_dict[READ_MODEL]
    state = await _thread(request, chat_id)
    if state is None:
        raise Problem(404, "not-found", "no such chat")
    run = await read_model.run(tenant, approval.run_id)
    if run is None or run.state.thread_id != state.thread_id:
        raise Problem(409, "run-not-interrupted", "the approval names no run of this chat",
                      run_status="unknown")
    state = await read_model.thread(tenant, state.thread_id, fresh=True) or state
    answered, active = _answered(state, run.run_id), state.active_run
    if answered is not None and active is not None:  # the run is active
        if approval.number > len(answered) + 1 or (approval.number == len(answered) + 1
                                                   and not active.awaiting_resume):
            raise Problem(409, "run-not-interrupted", "the run does not wait on this approval "
                          f"(it has answered {len(answered)} interrupts)",
                          run_status=active.shown_status)
        if approval.number <= len(answered):
            if answered[approval.number - 1] != approval.value:
                raise Problem(409, "approval-answered", "this approval was answered already, "
                              "with another answer", answer=answered[approval.number - 1])
        else:
            await _resume_once(request, state, approval)
            state = await read_model.thread(tenant, state.thread_id, fresh=True) or state
    return await serve_run(request, run, _framing(state, run, approval.number))


async def _resume_once(request: web.Request, state: ThreadState, approval: Approval) -> None:
    """`resume` the interrupt; a concurrent post of the same approval to this gateway
    waits for the first one's decision instead of deciding again."""
    pending = request.app[RESUMING]
    key = (state.thread_id, approval.run_id, approval.number)
    task = pending.get(key)
    if task is None:
        task = asyncio.ensure_future(resume(request, state, approval.run_id, approval.value,
                                            "interrupted", field="messages"))
        pending[key] = task
        task.add_done_callback(lambda _: pending.pop(key, None))
    try:
        await asyncio.shield(task)
    except Problem as problem:
        if problem.status != 409:
            raise
        # Resumed meanwhile, or the run ended first: its stream shows which.


@served_here
async def resume_chat(request: web.Request) -> web.StreamResponse:
    """GET /v1/ai/chat/{chat_id}/stream: the active run from its start, or 204."""
    state = await _thread(request, request.match_info["chat_id"])
    if state is None or state.active_run is None:
        return web.Response(status=204)
    run = await request.config_dict[READ_MODEL].run(request[TENANT], state.active_run.run_id)
    if run is None or run.terminal:
        return web.Response(status=204)
    state = await request.config_dict[READ_MODEL].thread(request[TENANT], state.thread_id,
                                                         fresh=True) or state
    return await serve_run(request, run, _framing(state, run))


async def cancel_chat(request: web.Request) -> web.Response:
    """POST /v1/ai/chat/{chat_id}/cancel: cancel the active run (409 if none)."""
    state = await _thread(request, request.match_info["chat_id"])
    if state is None:
        raise Problem(404, "not-found", "no such chat")
    if state.active_run is None:
        raise Problem(409, "no-active-run", "the chat has no active run")
    return await rest.cancel(request, state, state.active_run.run_id, "stopped by the user")


async def chat_messages(request: web.Request) -> web.Response:
    """GET /v1/ai/chat/{chat_id}/messages?limit=: the newest stored messages, oldest
    first, as `UIMessage`s (an unknown chat has none)."""
    limit = query_limit(request, rest.MESSAGES_PAGE, rest.MAX_MESSAGES_PAGE)
    state = await _thread(request, request.match_info["chat_id"])
    if state is None:
        return web.json_response({"messages": []})
    read_model = request.config_dict[READ_MODEL]
    page = read_model.current_messages(state, before=END_SEQ, limit=limit)
    return web.json_response({"thread_id": state.thread_id,
                              "messages": [ui_message(r) for r in page.records]})
