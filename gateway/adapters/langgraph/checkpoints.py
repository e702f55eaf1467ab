"""LangGraph checkpoints over a thread's tree of messages (docs/branches.md): the
state, the history, and where a run from a checkpoint goes.

A checkpoint is a position in the tree: the state just after one stored message, on
the path from the root to it. Its `checkpoint_id` is that message's seq + 1, so "0"
is the empty thread (the root) and a thread that never branched has the checkpoint
ids it always had (`get_state` answered its message count). A checkpoint's parent is
its message's parent in the tree; its values are the path up to it (the newest
`VALUES_CAP` messages). An id at a rolled-back message reads as the message before
it on its line, as the tree itself reads a missing record.

The history is the current branch's checkpoints, newest first (or, with
`checkpoint.checkpoint_id`, that checkpoint's own branch): walked through the parent
links lazily, so a page costs its `limit` plus one `VALUES_CAP` of records.

A run from a checkpoint (`checkpoint_id`, or `checkpoint: {checkpoint_id}`):
- no input, at a user message: its answer again (a regenerate, keyed by the
  request's Idempotency-Key, else a fresh one);
- input, at the current branch's newest message: a post, as without a checkpoint;
- input, at the parent of a user message (on the current branch, else on another):
  an edit of that message (a sibling with the same parent, on a new branch that
  becomes current);
- anything else: 422 `checkpoint-unsupported`, saying what to send instead.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from functools import partial
from itertools import islice
from typing import Any

from aiohttp import web

from gateway.adapters.langgraph import threads
from gateway.adapters.langgraph.threads import own_thread, values_view
from gateway.adapters.langgraph.views import conversation, lg_message, state_tasks, thread_json
from gateway.api import branches as native_branches
from gateway.api import rest
from gateway.http.auth import TENANT
from gateway.http.plumbing import END_SEQ, int_field, read_json_body
from gateway.http.problems import Problem
from gateway.keys import READ_MODEL
from gateway.live.sse import iso_ms
from gateway.model.read_model import ReadModel
from streams.core.branches import ROOT, branch_path, head_of
from streams.core.domain import MultitaskStrategy, ThreadState
from streams.core.ids import idempotent_message_id_for, run_id_for
from streams.core.records import MessageRecord

__all__ = ["MAX_HISTORY", "checkpoint_id", "get_history", "get_state", "get_state_at",
           "post_state_at", "run_from_checkpoint", "wanted_checkpoint"]

MAX_HISTORY = 100  # checkpoints in one history page


def checkpoint_id(seq: int) -> str:
    """The id of the checkpoint just after message `seq` (ROOT: "0", the empty thread)."""
    return str(seq + 1)


def _path(read_model: ReadModel, state: ThreadState, seq: int) -> Iterator[int]:
    """The stored messages from `seq` up to the root, newest first, read lazily."""
    return branch_path(seq, partial(read_model.store.link, state.thread_id))


def _seq_of(read_model: ReadModel, state: ThreadState, raw: object, field: str) -> int:
    """The message a checkpoint id names (ROOT for "0"): 404 if the thread has none."""
    if not isinstance(raw, str) or not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise Problem(422, "invalid-body", f"'{field}' must be a checkpoint id of this "
                      "thread (get_history)", field=field)
    seq = int(raw) - 1
    if seq >= state.message_count:
        raise Problem(404, "no-such-checkpoint", "the thread has no such checkpoint",
                      checkpoint_id=raw)
    return next(_path(read_model, state, seq), ROOT)


def wanted_checkpoint(body: dict[str, Any]) -> str | None:
    """The checkpoint id a run's body starts from (`checkpoint_id`, or `checkpoint`'s),
    or None."""
    checkpoint = body.get("checkpoint")
    if checkpoint is not None and not isinstance(checkpoint, dict):
        raise Problem(422, "invalid-body", "'checkpoint' must be an object", field="checkpoint")
    if checkpoint and checkpoint.get("checkpoint_ns"):
        raise Problem(422, "unsupported", "subgraph checkpoints ('checkpoint_ns') are not "
                      "supported by this server", field="checkpoint")
    found = body.get("checkpoint_id") or (checkpoint or {}).get("checkpoint_id")
    if found is not None and not isinstance(found, str):
        raise Problem(422, "invalid-body", "'checkpoint_id' must be a string",
                      field="checkpoint_id")
    return found or None


def _head(read_model: ReadModel, state: ThreadState) -> tuple[int, int | None]:
    """The current branch's newest stored message (ROOT if none) and its parent (None
    for the root)."""
    newest = list(islice(_path(read_model, state, head_of(state)), 2))
    if not newest:
        return ROOT, None
    return newest[0], newest[1] if len(newest) > 1 else ROOT


def _checkpoint(view: dict[str, Any], seq: int | None) -> dict[str, Any] | None:
    return None if seq is None else {"thread_id": view["thread_id"], "checkpoint_ns": "",
                                     "checkpoint_id": checkpoint_id(seq)}


async def get_state(request: web.Request) -> web.Response:
    """GET /threads/{thread_id}/state[?before=seq]: the current branch's newest
    messages, bounded, at its newest checkpoint."""
    state = await own_thread(request)
    before = request.query.get("before")
    if before is not None and not (before.isascii() and before.isdigit() and
                                   int(before) < END_SEQ):
        raise Problem(400, "bad-cursor", "'before' is the messages_before of a state")
    return web.json_response(await _current(request, state, None if before is None else
                                            int(before)))


async def _current(request: web.Request, state: ThreadState,
                   before: int | None = None) -> dict[str, Any]:
    values, older = await values_view(request, state, None, before)
    view = thread_json(state, values)
    tasks = state_tasks(state)
    seq, parent = _head(request.config_dict[READ_MODEL], state)
    return {"values": values, "next": [] if state.active_run is None else ["agent"],
            "tasks": tasks, "interrupts": [i for t in tasks for i in t["interrupts"]],
            "checkpoint": _checkpoint(view, seq), "parent_checkpoint": _checkpoint(view, parent),
            "created_at": view["updated_at"],
            "metadata": {"messages_before": older, "message_count": state.message_count,
                         **view["metadata"]}}


def _past(state: ThreadState, path: list[MessageRecord], more: bool, at: int) -> dict[str, Any]:
    """The state at checkpoint `path[at]` (path: newest first, older ones past it if
    `more`, else the root)."""
    shown = list(reversed(path[at:at + threads.VALUES_CAP]))
    queued = {q.message_id for q in state.queued}
    values = {"messages": [lg_message(r) for r in conversation(shown, queued)]}
    view = thread_json(state, values)
    record = path[at] if at < len(path) else None
    older = shown[0].seq if record is not None and (at + len(shown) < len(path) or more) \
        else None
    parent = None if record is None else path[at + 1].seq if at + 1 < len(path) else ROOT
    source = {"source": "input", "step": -1} if record is None else {
        "source": "input" if record.message.role == "user" else "loop",
        "seq": record.seq, "run_id": record.message.run_id}  # no step count: not walked
    return {"values": values,
            "next": ["agent"] if record is not None and record.message.role == "user" else [],
            "tasks": [], "interrupts": [],
            "checkpoint": _checkpoint(view, ROOT if record is None else record.seq),
            "parent_checkpoint": _checkpoint(view, parent),
            "created_at": iso_ms(record.message.created_at_ms if record is not None
                                 else state.created_at_ms),
            "metadata": {"messages_before": older, **source, **view["metadata"]}}


def _records(read_model: ReadModel, state: ThreadState, seq: int,
             count: int) -> tuple[list[MessageRecord], bool]:
    """The newest `count` records of the path ending at `seq`, newest first, and
    whether the path goes on past them."""
    seqs = list(islice(_path(read_model, state, seq), count + 1))
    return read_model.store.messages_at(state.thread_id, seqs[:count]), len(seqs) > count


async def get_history(request: web.Request) -> web.Response:
    """POST /threads/{thread_id}/history {limit?, before?, checkpoint?}: the current
    branch's checkpoints (or those of `checkpoint`'s branch, from it), newest first."""
    state = await own_thread(request)
    body = await read_json_body(request, required=False)
    limit = int_field(body.get("limit"), "limit", 10, MAX_HISTORY)
    read_model = request.config_dict[READ_MODEL]
    start = wanted_checkpoint({"checkpoint": body.get("checkpoint")})
    before = body.get("before")
    if isinstance(before, dict):
        before = before.get("checkpoint_id")
    if before is not None:  # the checkpoints older than `before`, on its branch
        seq = _seq_of(read_model, state, before, "before")
        seq = next(islice(_path(read_model, state, seq), 1, 2), ROOT) if seq > ROOT \
            else ROOT - 1
    elif start is not None:
        seq = _seq_of(read_model, state, start, "checkpoint")
    else:
        seq = _head(read_model, state)[0]
        # The newest checkpoint is the thread's state now (its tasks, interrupts, next).
        if limit and seq > ROOT:
            first = await _current(request, state)
            path, more = _records(read_model, state, seq, limit + threads.VALUES_CAP)
            found = [first] + [_past(state, path, more, at)
                               for at in range(1, min(limit, len(path) + (not more)))]
            return web.json_response(found)
    if seq < ROOT:
        return web.json_response([])
    path, more = _records(read_model, state, seq, limit + threads.VALUES_CAP)
    count = min(limit, len(path) + (not more))  # the root's checkpoint once reached
    return web.json_response([_past(state, path, more, at) for at in range(count)])


async def _state_at(request: web.Request, raw: object, field: str) -> web.Response:
    state = await own_thread(request)
    read_model = request.config_dict[READ_MODEL]
    seq = _seq_of(read_model, state, raw, field)
    if seq == _head(read_model, state)[0]:
        return web.json_response(await _current(request, state))
    path, more = _records(read_model, state, seq, threads.VALUES_CAP + 1)
    return web.json_response(_past(state, path, more, 0))


async def get_state_at(request: web.Request) -> web.Response:
    """GET /threads/{thread_id}/state/{checkpoint_id}: the state at that checkpoint."""
    return await _state_at(request, request.match_info["checkpoint_id"], "checkpoint_id")


async def post_state_at(request: web.Request) -> web.Response:
    """POST /threads/{thread_id}/state/checkpoint {checkpoint: {checkpoint_id}}"""
    body = await read_json_body(request, required=True)
    raw = wanted_checkpoint({"checkpoint": body.get("checkpoint")})
    if raw is None:
        raise Problem(422, "invalid-body", "'checkpoint.checkpoint_id' is required",
                      field="checkpoint")
    return await _state_at(request, raw, "checkpoint")


def _child_on(path: Iterator[int], seq: int) -> int | None:
    """The message after `seq` on a path (newest first), or None if `seq` is its newest
    or not on it. A path's seqs fall toward the root, so it is read down to `seq` only."""
    child = None
    for on_path in path:
        if on_path <= seq:
            return child if on_path == seq else None
        child = on_path
    return child if seq == ROOT else None


def _child(read_model: ReadModel, state: ThreadState, seq: int, head: int) -> int | None:
    """A message whose parent is `seq`: on the current branch if it has one, else on
    the first other branch that does (any will do: an edit's sibling has the same
    parent)."""
    for newest in (head, *state.tip_seqs):
        child = _child_on(_path(read_model, state, newest), seq)
        if child is not None:
            return child
    return None


def _unsupported(detail: str, raw: str) -> Problem:
    return Problem(422, "checkpoint-unsupported", detail, field="checkpoint_id",
                   checkpoint_id=raw)


async def run_from_checkpoint(request: web.Request, state: ThreadState, raw: str,
                              text: str | None, strategy: MultitaskStrategy) -> str | None:
    """Start the run a body with checkpoint `raw` asks for (module docstring): its run
    id, or None when it is a plain post (the checkpoint is the current branch's newest)."""
    read_model = request.config_dict[READ_MODEL]
    seq = _seq_of(read_model, state, raw, "checkpoint_id")
    record = None if seq == ROOT else read_model.store.message(state.thread_id, seq)
    key = rest.idempotency_key(request)
    if text is None:
        if record is None or record.message.role != "user":
            raise _unsupported("a run from a checkpoint without input answers its user "
                               "message again: this checkpoint is not at a user message "
                               "(send input to continue from it)", raw)
        run_id, _, _ = await native_branches.regenerate_answer(
            request, state, seq, key or str(uuid.uuid4()), strategy)
        return run_id
    head = _head(read_model, state)[0]
    if seq == head:
        return None
    child = _child(read_model, state, seq, head)
    if child is None:
        raise _unsupported("the checkpoint is the newest message of a branch that is not "
                           "current: make that branch current (POST /v1/threads/{id}/"
                           "branches/current) and run without a checkpoint", raw)
    edited = read_model.store.message(state.thread_id, child)
    if edited is None or edited.message.role != "user":
        raise _unsupported("input from this checkpoint would follow a user message with "
                           "another: send no input to answer it again, or start from the "
                           "checkpoint before it to edit it", raw)
    new_id = idempotent_message_id_for(request[TENANT], state.thread_id, key) if key \
        else str(uuid.uuid4())
    event = await native_branches.edit(request, state, edited.message.message_id, text, new_id,
                                       key, strategy, field="input")
    if event is None:
        return run_id_for(state.thread_id, new_id)
    return rest.decided_run(event, state.thread_id, new_id)[0]
