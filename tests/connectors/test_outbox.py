"""The pure core of the connector: ids, planning, transitions, the Avro records."""

from __future__ import annotations

import json

import pytest

from streams.connectors.audit import AuditKind, ConnectorAudit
from streams.connectors.ids import (
    ChatAddress,
    address_of,
    message_id_for,
    message_ref_of,
    thread_id_for,
)
from streams.connectors.outbox import (
    ANSWER,
    ANSWER_FINAL,
    NOTICE_CONFLICT,
    PLACEHOLDER_TEXT,
    REACTION_DONE,
    REACTION_FAILED,
    WEBHOOK,
    ChatOutbox,
    OutboxKind,
    OutboxStatus,
    Sinks,
    coalescable_update,
    heads,
    mark_delivered,
    mark_delivering,
    mark_failed,
    plan,
    prune,
)
from streams.core.domain import (
    AssistantMessage,
    Event,
    RejectReason,
    RunAccepted,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunRejected,
)
from streams.core.ids import outbox_id_for
from streams.wire import DecodeError
from streams.wire.connector import decode_audit, decode_outbox, encode_audit, encode_outbox
from streams.wire.schemas import CONNECTOR_SCHEMA_DIR

THREAD = "slack:T1:C1:1700000000.000100"
ASKED = message_id_for("T1", "C1", "1700000000.000200")
CHAT = Sinks(chat=True, webhook=False)
BOTH = Sinks(chat=True, webhook=True)


def _given(events: list[Event], sinks: Sinks = CHAT) -> ChatOutbox | None:
    outbox = None
    for n, event in enumerate(events):
        outbox = plan(outbox, event, "slack:T1", sinks, 1_000 + n) or outbox
    return outbox


def _accepted(run: str = "r1", message_id: str = ASKED, thread: str = THREAD) -> RunAccepted:
    return RunAccepted(thread, run, "wf", message_id, 10)


def _completed(run: str = "r1", text: str = "the answer", thread: str = THREAD) -> RunCompleted:
    return RunCompleted(thread, run, 1, AssistantMessage("a1", text), 20)


# --- ids ------------------------------------------------------------------------------------


def test_a_thread_id_is_its_chat_address_and_back() -> None:
    """A chat address and its thread id map to each other."""
    for address in (ChatAddress("T1", "C1", "1700000000.000100"), ChatAddress("T1", "D9", None)):
        assert address_of(thread_id_for(address)) == address
    assert thread_id_for(ChatAddress("T1", "D9", None)) == "slack:T1:D9"


@pytest.mark.parametrize("thread_id", [
    "a2d4c7e0-0000-4000-8000-000000000000", "slack:T1", "slack:T1:C1:1.1:9", "slack:t1:C1",
    "slack:T1:C1:notats", "slack:T1:C:1", "slack::C1",
])
def test_other_thread_ids_have_no_chat_address(thread_id: str) -> None:
    """Thread ids that are not well-formed chat addresses have none."""
    assert address_of(thread_id) is None


def test_message_ids_name_the_chat_message_and_refuse_anything_else() -> None:
    """A chat message id names its team, channel and ts; other ids name none."""
    ref = message_ref_of(message_id_for("T1", "C1", "1700000000.000200"))
    assert ref is not None and (ref.team, ref.channel, ref.ts) == ("T1", "C1", "1700000000.000200")
    assert message_ref_of("8d0c7c1e-9b0e-4f57-a3a4-2c1f0f1f6a11") is None
    with pytest.raises(ValueError):
        message_id_for("T1", "C1:X", "1.2")


def test_outbox_ids_are_stable_and_differ_by_role_and_trigger() -> None:
    """Outbox ids are the same each time and differ for each role and trigger."""
    assert outbox_id_for("r1", ANSWER) == outbox_id_for("r1", ANSWER)
    ids = {outbox_id_for("r1", ANSWER), outbox_id_for("r1", ANSWER_FINAL),
           outbox_id_for("r2", ANSWER), outbox_id_for("r1:x", "y"), outbox_id_for("r1", "x:y")}
    assert len(ids) == 5


# --- plan -------------------------------------------------------------------------------------


def test_an_accepted_run_of_a_chat_message_posts_a_placeholder_in_its_thread() -> None:
    """A run of a chat message first plans a placeholder post in its chat thread."""
    outbox = _given([_accepted()])
    assert outbox is not None
    (e,) = outbox.entries
    assert (e.kind, e.role, e.text, e.status) == (OutboxKind.CHAT_POST, ANSWER, PLACEHOLDER_TEXT,
                                                  OutboxStatus.PENDING)
    assert (e.channel, e.thread_ts, e.target_ts) == ("C1", "1700000000.000100", "1700000000.000200")
    assert e.outbox_id == outbox_id_for("r1", ANSWER)


def test_runs_that_are_not_the_chats_cause_no_chat_entries() -> None:
    """Runs of messages not from the chat plan no chat entries."""
    assert _given([_accepted(message_id="m-from-the-api")]) is None
    assert _given([_accepted(thread="th-1"), _completed(thread="th-1")]) is None


def test_a_completed_run_edits_the_placeholder_and_reacts() -> None:
    """A completed run plans an edit of the placeholder and a check-mark reaction."""
    outbox = _given([_accepted(), _completed()])
    assert outbox is not None
    post, edit, reaction = outbox.entries
    assert (edit.kind, edit.role, edit.text, edit.target_outbox_id) == (
        OutboxKind.CHAT_UPDATE, ANSWER_FINAL, "the answer", post.outbox_id)
    assert (reaction.kind, reaction.role, reaction.text, reaction.target_ts) == (
        OutboxKind.CHAT_REACTION, REACTION_DONE, "white_check_mark", "1700000000.000200")


def test_a_completed_run_without_a_placeholder_posts_the_answer_itself() -> None:
    """A completed run with no placeholder planned posts the answer directly."""
    outbox = _given([_completed()])
    assert outbox is not None
    (post,) = outbox.entries
    assert (post.kind, post.outbox_id, post.text) == (OutboxKind.CHAT_POST, outbox_id_for("r1", ANSWER),
                                                      "the answer")


def test_failed_and_cancelled_runs_edit_the_placeholder_into_a_notice() -> None:
    """Failed and cancelled runs turn the placeholder into a notice."""
    failed = _given([_accepted(), RunFailed(THREAD, "r1", 2, "boom", 30)])
    assert failed is not None
    _, edit, reaction = failed.entries
    assert "could not answer" in edit.text and "boom" in edit.text
    assert (reaction.role, reaction.text) == (REACTION_FAILED, "x")
    cancelled = _given([_accepted(), RunCancelled(THREAD, "r1", "user asked", 30)])
    assert cancelled is not None
    assert [e.kind for e in cancelled.entries] == [OutboxKind.CHAT_POST, OutboxKind.CHAT_UPDATE]


def test_a_conflict_gets_a_notice_and_a_duplicate_gets_nothing() -> None:
    """A message refused for a conflict gets a notice; a duplicate gets nothing."""
    conflict = RunRejected(THREAD, ASKED, RejectReason.CONFLICT, "busy", "r0", 10)
    outbox = _given([conflict])
    assert outbox is not None
    (notice,) = outbox.entries
    assert (notice.role, notice.outbox_id) == (NOTICE_CONFLICT, outbox_id_for(ASKED, NOTICE_CONFLICT))
    assert "send it again" in notice.text
    duplicate = RunRejected(THREAD, ASKED, RejectReason.DUPLICATE, "again", "r0", 10)
    assert _given([duplicate]) is None


def test_an_event_seen_again_plans_nothing_new() -> None:
    """An event planned once plans nothing when seen again."""
    outbox = _given([_accepted(), _completed()], BOTH)
    assert outbox is not None
    assert plan(outbox, _completed(), "slack:T1", BOTH, 99) is None
    assert plan(outbox, _accepted(), "slack:T1", BOTH, 99) is None


def test_the_webhook_gets_every_completed_run_with_a_deterministic_body() -> None:
    """Every completed run plans one webhook POST whose body is the same each time."""
    outbox = plan(None, _completed(thread="th-1"), "acme", Sinks(chat=True, webhook=True), 5)
    assert outbox is not None
    (hook,) = outbox.entries
    assert (hook.kind, hook.outbox_id) == (OutboxKind.WEBHOOK_POST, outbox_id_for("r1", WEBHOOK))
    body = json.loads(hook.text)
    assert body == {"type": "run.completed", "thread_id": "th-1", "tenant": "acme", "run_id": "r1",
                    "attempt": 1, "completed_at_ms": 20,
                    "message": {"message_id": "a1", "text": "the answer", "citations": []}}
    again = plan(None, _completed(thread="th-1"), "acme", Sinks(chat=False, webhook=True), 77)
    assert again is not None and again.entries[0].text == hook.text


# --- delivery order and transitions -----------------------------------------------------------


def test_lanes_deliver_in_order_and_a_pending_edit_is_coalesced_into_its_post() -> None:
    """Each lane delivers in order, and a pending edit is folded into its pending post."""
    outbox = _given([_accepted(), _completed()], BOTH)
    assert outbox is not None
    post, edit, _, hook = outbox.entries
    assert heads(outbox) == [post, hook]
    assert coalescable_update(outbox, post) == edit
    fenced = mark_delivering(outbox, post.outbox_id, 50)
    assert coalescable_update(fenced, fenced.entries[0]) is None  # only a pending post coalesces
    delivered = mark_delivered(fenced, post.outbox_id, "1.5", False, 60)
    assert heads(delivered)[0] == edit
    assert delivered.entries[0].result_ts == "1.5"


def test_transitions_count_attempts_and_never_reopen_a_done_entry() -> None:
    """Fencing counts attempts, and a delivered or failed entry never changes again."""
    outbox = _given([_accepted()])
    assert outbox is not None
    oid = outbox.entries[0].outbox_id
    twice = mark_delivering(mark_delivering(outbox, oid, 5), oid, 7)
    e = twice.entries[0]
    assert (e.status, e.attempts, e.fenced_at_ms) == (OutboxStatus.DELIVERING, 2, 7)
    done = mark_delivered(twice, oid, "9.9", True, 8)
    assert done.entries[0].adopted and done.entries[0].status is OutboxStatus.DELIVERED
    assert mark_failed(done, oid, "late", 9) == done
    assert mark_delivered(done, oid, "1.1", False, 9) == done


def test_prune_keeps_what_is_still_needed() -> None:
    """Pruning keeps the newest finished entries and any still needed."""
    outbox = _given([_accepted()])
    assert outbox is not None
    placeholder = outbox.entries[0].outbox_id
    outbox = mark_delivered(outbox, placeholder, "1.0", False, 5)
    for n in range(30):  # many notices while the run is active
        rejected = RunRejected(THREAD, message_id_for("T1", "C1", f"1700000001.{n:06d}"),
                               RejectReason.CONFLICT, "busy", "r1", 10)
        outbox = plan(outbox, rejected, "slack:T1", CHAT, 10) or outbox
        outbox = mark_delivered(outbox, outbox.entries[-1].outbox_id, f"2.{n}", False, 11)
    kept = prune(outbox, keep=4)
    assert kept.get(placeholder) is not None, "the open placeholder was pruned"
    assert kept.entries[1:] == outbox.entries[-3:]  # and the newest others, four in all
    ended = _completed()
    finished = plan(kept, ended, "slack:T1", CHAT, 12)
    assert finished is not None and finished.entries[-2].target_outbox_id == placeholder


# --- Avro --------------------------------------------------------------------------------------


def test_outbox_and_audit_records_round_trip_and_garbage_is_a_decode_error() -> None:
    """Outbox and audit records round-trip; garbage or the wrong record is a DecodeError."""
    outbox = _given([_accepted(), _completed()], BOTH)
    assert outbox is not None
    outbox = mark_delivered(mark_delivering(outbox, outbox.entries[0].outbox_id, 3),
                            outbox.entries[0].outbox_id, "1.2", True, 4)
    assert decode_outbox(encode_outbox(outbox)) == outbox
    audit = ConnectorAudit("a1", THREAD, AuditKind.ADOPTED, "o1", "c1", "{}", 5)
    assert decode_audit(encode_audit(audit)) == audit
    for bad in (b"", b"junk", encode_audit(audit), encode_outbox(outbox)[:-3]):
        with pytest.raises(DecodeError):
            decode_outbox(bad)


def test_connector_schemas_follow_the_contracts_conventions() -> None:
    """The connector's schema files follow the contract's naming, doc and null-default rules."""
    files = sorted(CONNECTOR_SCHEMA_DIR.glob("*.avsc"))
    assert {p.stem for p in files} == {
        "threadline.ChatOutbox", "threadline.OutboxEntry", "threadline.OutboxKind",
        "threadline.OutboxStatus", "threadline.ConnectorAudit", "threadline.AuditKind"}
    for path in files:
        schema = json.loads(path.read_text())
        assert f"{schema['namespace']}.{schema['name']}" == path.stem and schema.get("doc")
        for f in schema.get("fields", []):
            if isinstance(f["type"], list) and "null" in f["type"]:
                assert f["type"][0] == "null" and f["default"] is None, (path.name, f)
    kinds = json.loads((CONNECTOR_SCHEMA_DIR / "threadline.OutboxKind.avsc").read_text())
    assert kinds["symbols"] == [k.value for k in OutboxKind]
    statuses = json.loads((CONNECTOR_SCHEMA_DIR / "threadline.OutboxStatus.avsc").read_text())
    assert statuses["symbols"] == [s.value for s in OutboxStatus]
    audit_kinds = json.loads((CONNECTOR_SCHEMA_DIR / "threadline.AuditKind.avsc").read_text())
    assert audit_kinds["symbols"] == [k.value for k in AuditKind]
