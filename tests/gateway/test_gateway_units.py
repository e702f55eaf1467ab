"""The gateway's pure parts: event ids, the superseded-execution filter, redaction, ids."""

from __future__ import annotations

import base64
import json
import time

import pytest

from gateway.http.auth import redact
from gateway.kafka import partition_for
from gateway.live.feed import Subscriber
from gateway.live.sse import RunTracker, SseEvent, iso_ms, make_events
from gateway.live.tokens import BadEventId, EventId, ResumeTokens, derived_key
from gateway.model import read_model
from gateway.model.read_model import remember
from streams.config import Settings
from streams.core.domain import AssistantMessage
from streams.core.ids import idempotent_message_id_for
from streams.core.records import MessageEnd, MessageStart, RunLifecycle, StreamOutput, TextDelta
from streams.wire import new_meta

RUN = "run-1"
TOKENS = ResumeTokens([b"test key"])


def _out(attempt: int, part: str, seq: int, payload: object) -> StreamOutput:
    return StreamOutput(RUN, attempt, "answer-1", part, seq, payload)  # type: ignore[arg-type]


def _life(event: str, attempt: int = 0) -> StreamOutput:
    message = AssistantMessage("answer-1", "hi") if event == "run_completed" else None
    return _out(attempt, "lifecycle", 0, RunLifecycle(event, "user-1", "", message))


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def test_event_ids_round_trip_and_reject_garbage() -> None:
    """A signed event id verifies back to its position; malformed ones are refused."""
    run = "5f0e8a2c-0000-4000-8000-000000000000"
    token = TOKENS.sign("th", 3, 1234, 1, 1200, run)
    assert "=" not in token and TOKENS.verify(token, "th") == EventId(3, 1234, 1, 1200, run)
    assert EventId(3, 1234, 1, 1200, run).position == (1234, 1)
    text = base64.urlsafe_b64decode(token + "==").decode()
    mac = text.split(".")[5]
    for garbage in ["", "not base64 !", _b64("v2.1.2.3.4.r"), _b64("v1.1.2.0.1.r"),
                    _b64(f"v2.1.-2.0.4.{mac}.r"), _b64(f"v2.1.2.0.4.{mac}.r/../x"),
                    _b64(f"v2.1.2.0.9.{mac}.r"), "x" * 600]:
        with pytest.raises(BadEventId):
            TOKENS.verify(garbage, "th")


def test_a_token_verifies_only_unchanged_for_its_thread_and_with_a_known_key() -> None:
    """A token is refused if altered, used on another thread or signed with an unknown key; keys rotate."""
    token = TOKENS.sign("th", 3, 1234, 1, 1200, RUN)
    fields = base64.urlsafe_b64decode(token + "==").decode().split(".")
    for index, value in [(1, "4"), (2, "1233"), (3, "0"), (4, "0"), (6, "run-2")]:
        forged = _b64(".".join([*fields[:index], value, *fields[index + 1:]]))
        with pytest.raises(BadEventId):
            TOKENS.verify(forged, "th")
    with pytest.raises(BadEventId):
        TOKENS.verify(token, "another-thread")
    # Rotation: the new key signs, both verify; a gateway without the old key refuses.
    rotated = ResumeTokens([b"new key", b"test key"])
    assert rotated.verify(token, "th") == TOKENS.verify(token, "th")
    with pytest.raises(BadEventId):
        TOKENS.verify(rotated.sign("th", 3, 5, 0, 5, RUN), "th")
    with pytest.raises(BadEventId):
        ResumeTokens([b"new key"]).verify(token, "th")


def test_the_default_key_is_shared_by_a_deployment_and_no_one_else() -> None:
    """The derived token key depends on the API keys and prefix only; configured keys override it."""
    keys = {"key-a": "tenant-a", "key-b": "tenant-b"}
    assert derived_key(keys, "p.") == derived_key(dict(reversed(keys.items())), "p.")
    assert derived_key(keys, "p.") != derived_key(keys, "q.")
    assert derived_key(keys, "p.") != derived_key({"key-a": "tenant-a"}, "p.")
    configured = Settings.from_env({"THREADLINE_RESUME_TOKEN_KEYS": "new, old",
                                    "THREADLINE_API_KEYS": "k=t"})
    assert configured.gateway.limits.resume_token_keys == ("new", "old")
    token = ResumeTokens([b"old"]).sign("th", 0, 1, 0, 1, RUN)
    assert ResumeTokens.from_settings(configured).verify(token, "th").offset == 1


def test_a_terminal_record_makes_two_events_with_consecutive_ids() -> None:
    """A run's final record makes its lifecycle event and a done event, at consecutive positions."""
    meta = new_meta("th", "tenant", 1)
    events = make_events(TOKENS, 2, 40, 30, meta, _life("run_completed", 1))
    assert [e.name for e in events] == ["run_completed", "done"]
    assert [e.position for e in events] == [(40, 0), (40, 1)]
    frame = events[1].frame.decode()
    assert frame.endswith("event: done\ndata: [DONE]\n\n")
    first = events[0].frame.decode().splitlines()
    assert TOKENS.verify(first[0].removeprefix("id: "), "th") == EventId(2, 40, 0, 30, RUN)
    data = json.loads(first[2].removeprefix("data: "))
    assert data["message"]["text"] == "hi" and data["run_id"] == RUN and data["thread_id"] == "th"
    # The reference contract's fields: the message id, the event's own id, the record's time.
    assert data["id"] == data["message_id"] and data["seq"] == first[0].removeprefix("id: ")
    assert data["ts"] == iso_ms(meta.produced_at_ms) and data["ts"].endswith("Z")


def test_iso_ms_is_utc_with_milliseconds() -> None:
    """Record times are ISO 8601 UTC with milliseconds."""
    assert iso_ms(0) == "1970-01-01T00:00:00.000Z"
    assert iso_ms(1_764_608_170_123) == "2025-12-01T16:56:10.123Z"


def test_the_filter_drops_superseded_executions_attempts_and_late_output() -> None:
    """The run tracker drops repeats, superseded executions, ended attempts and output after the end."""
    tracker = RunTracker()
    records = [
        (_out(1, "A:text:0", 1, TextDelta("before the run is known")), False),
        (_life("run_accepted"), True),
        (_life("attempt_dispatched", 1), True),
        (_out(1, "A:message", 0, MessageStart("assistant")), True),
        (_out(1, "A:text:0", 1, TextDelta("a1")), True),
        (_out(1, "A:text:0", 1, TextDelta("a1 repeated")), False),
        (_out(1, "B:message", 0, MessageStart("assistant")), True),  # a re-run of attempt 1
        (_out(1, "A:text:0", 2, TextDelta("a2 from the old execution")), False),
        (_out(1, "B:text:0", 1, TextDelta("b1")), True),
        (_life("retry_scheduled", 1), True),
        (_out(1, "B:text:0", 2, TextDelta("b2 after its attempt failed")), False),
        (_out(1, "Z:message", 0, MessageStart("assistant")), False),  # attempt 1 is over
        (_life("attempt_dispatched", 2), True),
        (_out(2, "C:message", 0, MessageStart("assistant")), True),
        (_out(2, "C:text:0", 1, TextDelta("c1")), True),
        (_out(2, "C:message", 2, MessageEnd("stop")), True),
        (_life("run_completed", 2), True),
        (_out(2, "C:text:0", 3, TextDelta("after the end")), False),
    ]
    for offset, (record, admitted) in enumerate(records):
        state = tracker.admit("th", offset, record)
        assert (state is not None) == admitted, (offset, record)
    assert tracker.runs[RUN].start == 1 and tracker.runs[RUN].terminal
    # A tracker that starts reading at the run's start decides the same way.
    again = RunTracker()
    assert [again.admit("th", o, r) is not None for o, (r, _) in enumerate(records)][1:] == \
        [admitted for _, admitted in records][1:]


def test_unknown_runs_are_flagged_and_another_threads_run_id_is_refused() -> None:
    """Output of an unseen run is flagged unknown; a run id on another thread is refused."""
    tracker = RunTracker()
    assert tracker.admit("th", 0, _out(1, "A:message", 0, MessageStart("assistant"))) is None
    assert tracker.unknown
    tracker.admit("th", 1, _life("run_accepted"))
    assert tracker.admit("other", 2, _life("attempt_dispatched", 1)) is None
    assert not tracker.unknown


def test_access_tokens_are_redacted_from_logged_paths() -> None:
    """access_token values in logged URLs are replaced by [redacted], in any case."""
    assert redact("/v1/runs/r/events?access_token=sekret&x=1") == \
        "/v1/runs/r/events?access_token=[redacted]&x=1"
    assert redact("/v1/threads/t/stream?a=1&ACCESS_TOKEN=k") == \
        "/v1/threads/t/stream?a=1&ACCESS_TOKEN=[redacted]"
    assert "sekret" not in redact("/x?access_token=sekret")


def test_idempotency_keys_name_messages_per_tenant_and_thread() -> None:
    """A key gives the same message id every time, and another one for another tenant, thread or key."""
    one = idempotent_message_id_for("tenant", "thread", "key")
    assert one == idempotent_message_id_for("tenant", "thread", "key")
    assert len({one, idempotent_message_id_for("tenant2", "thread", "key"),
                idempotent_message_id_for("tenant", "thread2", "key"),
                idempotent_message_id_for("tenant", "thread", "key2")}) == 4


def test_partitioning_matches_kafkas_murmur2() -> None:
    """Threads go to the partition Kafka's default murmur2 partitioner picks."""
    # Values from the Java client's Utils.murmur2 (via kafka-python's test vectors).
    from aiokafka.partitioner import murmur2

    assert murmur2(b"21") & 0xFFFFFFFF == -973932308 & 0xFFFFFFFF
    assert partition_for("21", 12) == (-973932308 & 0x7FFFFFFF) % 12
    assert {partition_for(f"th-{i}", 4) for i in range(50)} == {0, 1, 2, 3}


async def test_a_subscriber_that_falls_behind_is_closed_not_buffered_forever() -> None:
    """A subscriber whose queue passes its limit is closed; a run's subscriber queues only that run."""
    meta = new_meta("th", "tenant", 1)
    events = [e for offset in range(4) for e in make_events(
        TOKENS, 0, offset, 0, meta, _out(1, "A:text:0", offset, TextDelta("x")))]
    sub = Subscriber("th", None, limit=3)
    for event in events[:3]:
        sub.push(event)
    assert sub.closed is None and list(sub.pending) == events[:3]
    await sub.wait(1)  # something queued: no wait
    sub.pending.clear()  # taken by its stream's catch-up
    await sub.wait(0.01)  # nothing queued: waits out the timeout
    for event in events:
        sub.push(event)
    assert sub.closed == "overflow"
    only_run = Subscriber("th", "another-run", limit=3)
    only_run.push(events[0])
    assert not only_run.pending


async def test_an_attached_subscriber_writes_once_per_flush_queued_events_first() -> None:
    """An attached subscriber writes queued events first, then one batch per flush."""
    meta = new_meta("th", "tenant", 1)
    events = [e for offset in range(6) for e in make_events(
        TOKENS, 0, offset, 0, meta, _out(1, "A:text:0", offset, TextDelta("x")))]
    sub = Subscriber("th", None, limit=10)
    assert sub.push(events[0]) is False  # not attached: queued, its handler woken
    written: list[list[SseEvent]] = []
    room = [True]

    def sink(batch: list[SseEvent]) -> bool:
        written.append(batch)
        return room[0]

    sub.attach(sink)
    assert written == [[events[0]]] and not sub.pending
    assert sub.push(events[1]) is True  # the first since the flush: the feed notes it
    assert sub.push(events[2]) is False
    assert len(written) == 1
    sub.flush()
    assert written[-1] == [events[1], events[2]] and not sub.pending and sub.closed is None
    room[0] = False  # the client stopped reading: closed, it resumes with Last-Event-ID
    sub.push(events[3])
    sub.flush()
    assert sub.closed == "overflow"
    assert sub.push(events[4]) is False
    sub.flush()
    assert len(written) == 3
    await sub.wait(5)  # a closed subscriber does not wait

    def broken(batch: list[SseEvent]) -> bool:
        raise ConnectionResetError("gone")

    other = Subscriber("th", None, limit=10)
    other.attach(broken)
    other.push(events[5])
    other.flush()  # does not raise into the feed: the subscriber is closed instead
    assert other.closed == "overflow"


def test_the_aiohttp_internals_the_live_path_writes_through_are_there() -> None:
    """The aiohttp internals the live write path relies on still exist."""
    # gateway.live.streaming._Writer.write_now writes with aiohttp's payload writer's own
    # framing; an aiohttp upgrade that moves it must fail here, not in production.
    from aiohttp.http_writer import StreamWriter
    from aiohttp.web import StreamResponse

    assert callable(StreamWriter._write_chunked_payload) and callable(StreamWriter._write)
    assert isinstance(StreamWriter.transport, property)
    assert StreamResponse()._payload_writer is None  # set by prepare()


def test_recent_write_marks_drop_only_the_expired_and_stay_bounded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A mark set again moves to the back; expired marks go from the front on the next
    set, unexpired ones stay; past MARKS_KEPT the oldest goes."""
    now = time.monotonic()
    marks: dict[str, float] = {}
    remember(marks, "old", now - 3600, float)  # expired as it is set: dropped at once
    assert marks == {}
    remember(marks, "a", now + 3600, float)
    remember(marks, "b", now + 3600, float)
    remember(marks, "a", now + 3601, float)
    assert list(marks) == ["b", "a"]
    marks = {"x": now - 3600, "y": now - 1800, "z": now + 3600}  # two expired at the front
    remember(marks, "w", now + 3600, float)
    assert list(marks) == ["z", "w"]
    monkeypatch.setattr(read_model, "MARKS_KEPT", 3)
    for key in "pqrs":
        remember(marks, key, now + 3600, float)
    assert list(marks) == ["q", "r", "s"]
