"""The LangGraph Platform API's JSON objects, made from Threadline's state: pure.

Threads: a LangGraph client may choose a thread's id (`threads.create(thread_id=...)`).
Ids are per tenant, so the thread Threadline stores is `internal_thread_id(tenant, id)`,
a uuid5 of both, and its title holds the client's id (so `lg_thread_id` can give it
back, after checking that the uuid5 matches). Two tenants may use the same id: they
get two threads, and nothing tells either that the other exists. A thread made over
`/v1` keeps its own id on this API.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from typing import Any, Final

from gateway.adapters.langgraph.events import GRAPH_ID, NODE, ai_message, human_message, lg_interrupt, task_id
from gateway.live.sse import iso_ms
from streams.core.domain import RunStatus, ThreadState
from streams.core.journal import INTERRUPT
from streams.core.records import MessageRecord

__all__ = ["ASSISTANT_ID", "MAX_THREAD_ID_CHARS", "assistant", "conversation",
           "internal_thread_id", "interrupted_run", "lg_message", "lg_thread_id", "pending_interrupt",
           "resumed_interrupts", "run_json", "run_status", "state_tasks", "thread_json",
           "thread_status"]

ASSISTANT_ID: Final = str(uuid.uuid5(uuid.NAMESPACE_URL, "https://threadline.dev/assistants/agent"))
_THREADS: Final = uuid.uuid5(uuid.NAMESPACE_URL, "https://threadline.dev/langgraph/threads")
MAX_THREAD_ID_CHARS: Final = 200

_STATUS: Final = {
    RunStatus.DISPATCHED: "pending", RunStatus.RETRY_WAIT: "pending",
    RunStatus.RUNNING: "running", RunStatus.COMPLETED: "success",
    RunStatus.FAILED: "error", RunStatus.CANCELLED: "interrupted",
}


def internal_thread_id(tenant: str, lg_id: str) -> str:
    """The Threadline thread behind the tenant's LangGraph thread id."""
    return str(uuid.uuid5(_THREADS, f"{len(tenant)}:{tenant}:{lg_id}"))


def lg_thread_id(state: ThreadState) -> str:
    """The id a LangGraph client knows the thread by."""
    if internal_thread_id(state.tenant, state.title) == state.thread_id:
        return state.title
    return state.thread_id


def run_status(status: RunStatus | None, interrupted: bool = False) -> str:
    """A Threadline run status as a LangGraph run status (`interrupted` while it waits)."""
    if interrupted:
        return "interrupted"
    return "pending" if status is None else _STATUS[status]


def interrupted_run(state: ThreadState) -> str | None:
    """The id of the thread's active run if it waits for a human's resume."""
    run = state.active_run
    return run.run_id if run is not None and run.awaiting_resume else None


def resumed_interrupts(state: ThreadState, run_id: str) -> int:
    """How many interrupts of the thread's active run `run_id` were resumed (0 if it is
    not the active run)."""
    run = state.active_run
    if run is None or run.run_id != run_id:
        return 0
    return sum(1 for entry in run.journal if entry.kind == INTERRUPT)


def pending_interrupt(state: ThreadState) -> tuple[str, dict[str, Any]] | None:
    """The interrupt the thread's active run waits on: its task id and the Interrupt."""
    run = state.active_run
    if run is None or run.interrupt_json is None:
        return None
    number = resumed_interrupts(state, run.run_id) + 1
    return task_id(run.run_id, number), lg_interrupt(run.run_id, number, run.interrupt_json)


def state_tasks(state: ThreadState) -> list[dict[str, Any]]:
    """A ThreadState's `tasks`: the one task waiting on an interrupt, if any."""
    pending = pending_interrupt(state)
    if pending is None:
        return []
    return [{"id": pending[0], "name": NODE, "path": [], "error": None,
             "interrupts": [pending[1]], "checkpoint": None, "state": None, "result": None}]


def thread_status(state: ThreadState) -> str:
    """idle, busy (a run is active), interrupted (it waits for a human) or error (the
    last run failed)."""
    if state.active_run is not None:
        return "interrupted" if state.active_run.awaiting_resume else "busy"
    if state.import_parts_left:  # a copy still coming in: runs are refused (409)
        return "busy"
    if state.last_run is not None and state.last_run.status == RunStatus.FAILED:
        return "error"
    return "idle"


def assistant(created_ms: int = 0) -> dict[str, Any]:
    """The one assistant: the configured agent."""
    at = iso_ms(created_ms)
    return {"assistant_id": ASSISTANT_ID, "graph_id": GRAPH_ID, "name": GRAPH_ID,
            "description": "the agent Threadline's workers run", "config": {}, "context": {},
            "metadata": {"created_by": "system"}, "version": 1, "created_at": at,
            "updated_at": at}


def _metadata() -> dict[str, Any]:
    return {"graph_id": GRAPH_ID, "assistant_id": ASSISTANT_ID}


def lg_message(record: MessageRecord) -> dict[str, Any]:
    """A stored message as a LangChain message dict."""
    m = record.message
    if m.role == "user":
        return human_message(m.message_id, m.text)
    message = ai_message(m.message_id, m.text,
                         steps=[{"kind": s.kind, "name": s.name, "payload_json": s.payload_json}
                                for s in m.steps] or None,
                         citations=[{"url": c.url, "title": c.title} for c in m.citations] or None)
    if record.run_status is RunStatus.CANCELLED:  # an interrupted run's partial answer
        message["response_metadata"]["finish_reason"] = "interrupted"
        message["additional_kwargs"]["threadline_partial"] = True
    return message


def conversation(records: Sequence[MessageRecord],
                 queued: Collection[str]) -> list[MessageRecord]:
    """The records as a LangGraph thread shows them: a question still queued (enqueue)
    is left out, as LangGraph adds a run's input when the run starts; each answer
    follows its own question, where the history stores a question queued meanwhile
    (by seq) before the answer of the run it waited for."""
    asked = {r.message.run_id: r.seq for r in records if r.message.role == "user"}
    shown = [r for r in records if not (r.message.role == "user" and r.message.message_id
                                        in queued)]
    return sorted(shown, key=lambda r: (asked.get(r.message.run_id, r.seq),
                                        0 if r.message.role == "user" else 1, r.seq))


def thread_json(state: ThreadState, values: dict[str, Any] | None) -> dict[str, Any]:
    """A LangGraph Thread."""
    return {"thread_id": lg_thread_id(state), "created_at": iso_ms(state.created_at_ms),
            "updated_at": iso_ms(state.updated_at_ms or state.created_at_ms),
            "metadata": _metadata(), "status": thread_status(state),
            "values": values if values is not None else {},
            "interrupts": {t["id"]: t["interrupts"] for t in state_tasks(state)}}


def run_json(state: ThreadState, run_id: str, status: RunStatus | None,
             created_ms: int) -> dict[str, Any]:
    """A LangGraph Run."""
    at = iso_ms(created_ms or state.updated_at_ms or state.created_at_ms)
    waits = interrupted_run(state) == run_id
    return {"run_id": run_id, "thread_id": lg_thread_id(state), "assistant_id": ASSISTANT_ID,
            "created_at": at, "updated_at": at, "status": run_status(status, waits),
            "metadata": {}, "multitask_strategy": None, "kwargs": {}}  # not stored per run
