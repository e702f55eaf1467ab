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

from gateway.langgraph_events import GRAPH_ID, ai_message, human_message
from gateway.sse import iso_ms
from streams.domain import RunStatus, ThreadState
from streams.records import MessageRecord

__all__ = ["ASSISTANT_ID", "MAX_THREAD_ID_CHARS", "assistant", "conversation",
           "internal_thread_id", "lg_message", "lg_thread_id", "run_json", "run_status", "thread_json",
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


def run_status(status: RunStatus | None) -> str:
    """A Threadline run status as a LangGraph run status."""
    return "pending" if status is None else _STATUS[status]


def thread_status(state: ThreadState) -> str:
    """idle, busy (a run is active) or error (the last run failed)."""
    if state.active_run is not None:
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
            "values": values if values is not None else {}, "interrupts": {}}


def run_json(state: ThreadState, run_id: str, status: RunStatus | None,
             created_ms: int) -> dict[str, Any]:
    """A LangGraph Run."""
    at = iso_ms(created_ms or state.updated_at_ms or state.created_at_ms)
    return {"run_id": run_id, "thread_id": lg_thread_id(state), "assistant_id": ASSISTANT_ID,
            "created_at": at, "updated_at": at, "status": run_status(status),
            "metadata": {}, "multitask_strategy": None, "kwargs": {}}  # not stored per run
