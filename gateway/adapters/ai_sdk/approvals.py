"""The AI SDK's tool approval, the pure part: approval ids, and the approval answer a
`useChat` client sends back.

An interrupt raised inside a tool is shown as the SDK's tool approval
(`gateway.adapters.ai_sdk.ui_stream`): the `tool-approval-request` of the run's n-th
interrupt carries `approval_id(run_id, n)`. The client answers with
`addToolApprovalResponse({id, approved, reason})`, which puts the tool part in
`approval-responded` with `approval: {id, approved, reason}`; with `sendAutomaticallyWhen:
lastAssistantMessageIsCompleteWithApprovalResponses` the SDK then posts the chat again,
its last message being that assistant message. `approval_in` reads the answer out of it;
`Approval.value` is what the tool's `interrupt()` returns.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gateway.http.problems import Problem
from streams.core.journal import INTERRUPT, JournalEntry

__all__ = ["APPROVAL_SEPARATOR", "Approval", "answers", "approval_id", "approval_in",
           "parse_approval_id"]

APPROVAL_SEPARATOR = ":interrupt:"  # approval ids: <run id>:interrupt:<n>
MAX_REASON_CHARS = 2000
MAX_RUN_ID_CHARS = 200  # run ids are uuids: anything longer is not one


def approval_id(run_id: str, number: int) -> str:
    """The approval id of the run's `number`th interrupt (from 1): the same on every
    replay of the run."""
    return f"{run_id}{APPROVAL_SEPARATOR}{number}"


def parse_approval_id(raw: str) -> tuple[str, int] | None:
    """(run id, interrupt number) of an `approval_id`, or None if it is not one."""
    run_id, separator, number = raw.rpartition(APPROVAL_SEPARATOR)
    if not separator or not 0 < len(run_id) <= MAX_RUN_ID_CHARS or not run_id.isprintable() \
            or not number.isascii() or not number.isdigit() or len(number) > 9 or int(number) < 1:
        return None
    return run_id, int(number)


@dataclass(frozen=True, slots=True)
class Approval:
    """A client's answer to an approval request."""

    approval_id: str
    run_id: str
    number: int  # the run's interrupt it answers (from 1)
    tool_call_id: str
    approved: bool
    reason: str | None

    @property
    def value(self) -> dict[str, Any]:
        """The resume value: what the tool's `interrupt()` returns."""
        return {"approved": self.approved, "reason": self.reason}


def _is_tool_part(part: object) -> bool:
    return isinstance(part, dict) and isinstance(part.get("type"), str) and (
        part["type"] == "dynamic-tool" or part["type"].startswith("tool-"))


def approval_in(message: dict[str, Any]) -> Approval:
    """The approval answer in the chat's last message (an assistant message): its newest
    tool part in state `approval-responded`. 422 if there is none or it is malformed."""
    parts = message.get("parts")
    answered = [p for p in parts if _is_tool_part(p) and p.get("state") == "approval-responded"] \
        if isinstance(parts, list) else []
    if not answered:
        raise Problem(422, "invalid-body", "the last message is the assistant's, so it must "
                      "hold a tool part in state 'approval-responded' (an answered approval)",
                      field="messages")
    part = answered[-1]
    approval = part.get("approval")
    if not isinstance(approval, dict) or not isinstance(approval.get("id"), str) or \
            not isinstance(approval.get("approved"), bool):
        raise Problem(422, "invalid-body", "the answered tool part's 'approval' must be "
                      "{id: string, approved: boolean, reason?: string}", field="messages")
    reason = approval.get("reason")
    if reason is not None and (not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS):
        raise Problem(422, "invalid-body", f"'approval.reason' must be a string of at most "
                      f"{MAX_REASON_CHARS} characters", field="messages")
    parsed = parse_approval_id(approval["id"])
    if parsed is None:
        raise Problem(422, "invalid-body", "'approval.id' is not an approval id of this "
                      "gateway (<run id>:interrupt:<n>)", field="messages")
    call_id = part.get("toolCallId")
    return Approval(approval["id"], parsed[0], parsed[1],
                    call_id if isinstance(call_id, str) else "", approval["approved"], reason)


def answers(journal: Iterable[JournalEntry]) -> list[Any]:
    """The values the run's interrupts were answered with, in order (the journal's
    interrupt entries; an unreadable one is None)."""
    values: list[Any] = []
    for entry in journal:
        if entry.kind == INTERRUPT:
            try:
                values.append(json.loads(entry.output_json))
            except ValueError:
                values.append(None)
    return values
