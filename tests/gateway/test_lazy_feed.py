"""The stream feed decodes no part of a thread nobody watches, and a late subscriber
still gets the very events (ids, data) an eager feed made (`gateway.live.feed`).

No Kafka: records are fed to `StreamFeed.ingest` as the consumer would hand them.
The reference is the eager path: one `RunTracker` over every record in order and
`make_events` for each admitted one, which is what the feed did for every record
before, and what a replay from a run's start does.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import ConsumerRecord
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from gateway.kafka import Offsets
from gateway.live.feed import StreamFeed, Subscriber
from gateway.live.sse import Position, RunState, RunTracker, SseEvent, make_events
from gateway.model.read_model import ReadModel
from streams.config import Settings
from streams.core.domain import AssistantMessage
from streams.core.records import (
    MessageEnd,
    MessageStart,
    RunLifecycle,
    StepOutput,
    StreamOutput,
    TextDelta,
    TextEnd,
    TextStart,
)
from streams.wire import Codec, EnvelopeMeta, payload_header, stream_headers

SETTINGS = Settings.from_env({})
T0_MS = 1_764_608_170_000


class CountingCodec(Codec):
    """A codec that counts what it decodes, by the record's thread (read from the
    value itself, so the count needs no decode of its own)."""

    def __init__(self) -> None:
        super().__init__()
        self.thread_of: dict[bytes, str] = {}
        self.decoded: list[tuple[str, str]] = []  # (thread, payload type)
        self.events: list[tuple[str, str]] = []  # (thread, lifecycle event) of those decoded

    def decode_stream(self, data: bytes) -> tuple[EnvelopeMeta, StreamOutput]:
        """Decode, and count it."""
        meta, output = super().decode_stream(data)
        self.decoded.append((meta.thread_id, type(output.payload).__name__))
        if isinstance(output.payload, RunLifecycle):
            self.events.append((meta.thread_id, output.payload.event))
        return meta, output

    def lifecycle_decoded(self, thread: str) -> list[str]:
        """The events of the thread's lifecycle records decoded, in order."""
        return [event for t, event in self.events if t == thread]

    def parts_decoded(self, thread: str) -> int:
        """How many of the thread's records other than lifecycle ones were decoded."""
        return sum(1 for t, kind in self.decoded if t == thread and kind != "RunLifecycle")


class _ReadModel:
    def __init__(self) -> None:
        self.ended: list[tuple[str, str]] = []

    def note_ended(self, thread_id: str, run_id: str) -> None:
        self.ended.append((thread_id, run_id))


@dataclass
class Stream:
    """Records of several threads in the order the feed reads them, and the events the
    eager path makes of each."""

    feed: StreamFeed
    codec: CountingCodec
    records: list[tuple[int, ConsumerRecord[bytes, bytes], EnvelopeMeta, StreamOutput]] = \
        field(default_factory=list)
    offsets: dict[int, int] = field(default_factory=dict)

    def add(self, thread: str, output: StreamOutput, header: bool | str = True) -> None:
        """Append a record of `thread` with the processor's headers; with `header`
        False, none (an older writer); "payload", the payload header only (a writer
        from before the lifecycle header)."""
        partition = self.feed.partition_of(thread)
        offset = self.offsets.get(partition, 0)
        self.offsets[partition] = offset + 1
        meta = EnvelopeMeta(f"env-{len(self.records)}", thread, "tenant",
                            T0_MS + 37 * len(self.records))
        value = self.codec.encode_stream(output, meta)
        record = ConsumerRecord("stream", partition, offset, meta.produced_at_ms, 0,
                                thread.encode(), value, None, len(thread), len(value),
                                [payload_header(output.payload)] if header == "payload"
                                else stream_headers(output.payload) if header else [])
        self.records.append((partition, record, meta, output))


def _feed(window_events: int = 2_000, max_windows: int = 20_000) -> tuple[StreamFeed, CountingCodec]:
    codec = CountingCodec()
    feed = StreamFeed(SETTINGS, cast(ReadModel, _ReadModel()), cast(Offsets, None),
                      window_events=window_events, max_windows=max_windows, codec=codec)
    return feed, codec


def _eager(stream: Stream) -> tuple[list[list[SseEvent]], list[bool], RunTracker]:
    """Per record: its events on the eager path, and whether its run was unknown."""
    tracker = RunTracker()
    made, unknown = [], []
    for partition, record, meta, output in stream.records:
        state = tracker.admit(meta.thread_id, record.offset, output)
        unknown.append(state is None and tracker.unknown)
        made.append([] if state is None else make_events(
            stream.feed.tokens, partition, record.offset, state.start, meta, output))
    return made, unknown, tracker


# --- records ----------------------------------------------------------------------------

def _part(run: str, attempt: int, part: str, seq: int, payload: object) -> StreamOutput:
    return StreamOutput(run, attempt, f"answer-{run}", part, seq, payload)  # type: ignore[arg-type]


def _life(run: str, event: str, attempt: int = 0) -> StreamOutput:
    message = AssistantMessage(f"answer-{run}", "the answer") if event == "run_completed" else None
    return _part(run, attempt, "lifecycle", 0, RunLifecycle(event, "user-1", "", message))


def _run(run: str, deltas: int, end: str | None = "run_completed") -> list[StreamOutput]:
    """A run as the processor and one worker write it."""
    out = [_life(run, "run_accepted"), _life(run, "attempt_dispatched", 1),
           _life(run, "execution_started", 1), _part(run, 1, "X:message", 0, MessageStart("assistant")),
           _part(run, 1, "X:text:0", 1, TextStart())]
    out += [_part(run, 1, "X:text:0", 2 + i, TextDelta(f"w{i} ")) for i in range(deltas)]
    out += [_part(run, 1, "X:text:0", 2 + deltas, TextEnd("all")),
            _part(run, 1, "X:message", 3 + deltas, MessageEnd("stop"))]
    return out + ([_life(run, end, 1)] if end else [])


def _interleave(stream: Stream, runs: dict[str, list[StreamOutput]]) -> None:
    queues = {thread: list(outputs) for thread, outputs in runs.items()}
    while any(queues.values()):
        for thread, queue in queues.items():
            if queue:
                stream.add(thread, queue.pop(0))


def _ingest(feed: StreamFeed, records: Iterable[tuple[int, ConsumerRecord[bytes, bytes],
                                                      EnvelopeMeta, StreamOutput]]) -> None:
    for partition, record, _meta, _output in records:
        feed.ingest(partition, record)


def _facts(state: RunState | None) -> tuple[str, int, bool] | None:
    """What requests ask of a run: its thread, its start and whether it ended (not the
    filter's place, nor the attempts it saw)."""
    return None if state is None else (state.thread_id, state.start, state.terminal)


def _of(thread: str, made: list[list[SseEvent]], stream: Stream, upto: int | None = None,
        after: Position = (-1, -1), run: str | None = None) -> list[SseEvent]:
    return [e for (_, _, meta, _), events in zip(stream.records[:upto], made[:upto], strict=True)
            if meta.thread_id == thread for e in events
            if e.position > after and run in (None, e.run_id)]


# --- decoding ---------------------------------------------------------------------------

def test_parts_of_threads_nobody_watches_are_not_decoded_until_someone_does() -> None:
    """Only lifecycle records and the watched thread's parts are decoded; a thread's first
    subscriber gets its whole window, event for event as the eager path made it."""
    feed, codec = _feed()
    stream = Stream(feed, codec)
    for i in range(5):
        stream.add(f"th-{i}", _life(f"r{i}", "run_accepted"))
    sub, _, _ = feed.subscribe("th-0")
    _interleave(stream, {f"th-{i}": _run(f"r{i}", 30)[1:] for i in range(5)})
    _ingest(feed, stream.records)
    made, _, tracker = _eager(stream)
    for i in range(1, 5):
        assert codec.parts_decoded(f"th-{i}") == 0, i
        # Of its lifecycle records, only the run's start and end (the attempt and the
        # execution stay raw too).
        assert codec.lifecycle_decoded(f"th-{i}") == ["run_accepted", "run_completed"], i
    assert codec.parts_decoded("th-0") == 34  # every part of the watched thread, once
    assert list(sub.pending) == _of("th-0", made, stream)
    # What requests ask of runs is current without anyone watching.
    assert _facts(feed.run("r3")) == _facts(tracker.runs["r3"]) != _facts(None)
    assert cast(_ReadModel, feed.read_model).ended == [(f"th-{i}", f"r{i}") for i in range(5)]
    # A late subscriber: its window is made now, from the raw records, once.
    late, snapshot, covered = feed.subscribe("th-3")
    assert covered == (0, -1) and snapshot == _of("th-3", made, stream)
    assert codec.parts_decoded("th-3") == 34
    feed.subscribe("th-3")
    assert codec.parts_decoded("th-3") == 34 and not late.pending


def test_a_window_sheds_whole_runs_of_an_unwatched_thread_undecoded() -> None:
    """Past its bound, an unwatched window drops ended runs without decoding them, and
    what it keeps is still the eager events after its coverage."""
    feed, codec = _feed(window_events=25)
    stream = Stream(feed, codec)
    for r in range(6):
        for output in _run(f"r{r}", 4, end=("run_completed", "run_failed", "run_cancelled")[r % 3]):
            stream.add("th", output)
    _ingest(feed, stream.records)
    assert codec.parts_decoded("th") == 0
    made, _, _ = _eager(stream)
    _sub, snapshot, covered = feed.subscribe("th")
    assert covered > (0, -1) and snapshot == _of("th", made, stream, after=covered)
    last_start = 5 * len(_run("r", 4))
    assert stream.records[last_start][3].run_id == "r5" and covered <= (last_start, -1)


def test_a_run_still_open_where_another_ends_is_not_shed_undecoded() -> None:
    """Two runs of a thread overlap: where the first ends, the second is open, so its
    parts leaving the window are learned (its execution), not skipped."""
    feed, codec = _feed(window_events=12)
    stream = Stream(feed, codec)
    for output in [_life("A", "run_accepted"), _life("A", "attempt_dispatched", 1),
                   _part("A", 1, "X:message", 0, MessageStart("assistant")),
                   _life("B", "run_accepted"), _life("B", "attempt_dispatched", 1),
                   _part("B", 1, "Y:message", 0, MessageStart("assistant")),
                   _life("A", "run_completed", 1),
                   *[_part("B", 1, "Y:text:0", seq, TextDelta(f"y{seq}")) for seq in range(1, 9)],
                   _life("B", "run_completed", 1)]:
        stream.add("th", output)
    _ingest(feed, stream.records)
    made, _, _ = _eager(stream)
    _sub, snapshot, covered = feed.subscribe("th")
    assert snapshot == _of("th", made, stream, after=covered)
    assert [e.name for e in snapshot].count("text_delta") == 8


def test_a_run_longer_than_the_window_is_learned_as_it_leaves() -> None:
    """A run open past the window's end is the one case where a part leaving an
    unwatched window is decoded: its later events need the state it builds."""
    feed, codec = _feed(window_events=10)
    stream = Stream(feed, codec)
    outputs = _run("long", 40, end=None)
    # A superseded execution half way: its later parts must stay filtered out.
    outputs[20:20] = [_part("long", 1, "Y:message", 0, MessageStart("assistant")),
                      _part("long", 1, "Y:text:0", 1, TextDelta("from Y"))]
    outputs += [_life("long", "run_completed", 1)]
    for output in outputs:
        stream.add("th", output)
    _ingest(feed, stream.records)
    made, _, _ = _eager(stream)
    assert 0 < codec.parts_decoded("th") < len(outputs)
    _sub, snapshot, covered = feed.subscribe("th")
    assert snapshot == _of("th", made, stream, after=covered) and snapshot[-1].name == "done"
    assert all("from X" not in e.data.decode() for e in snapshot)


def test_an_unwatched_threads_run_facts_are_current() -> None:
    """Start, end and the active run come from lifecycle records as they are read."""
    feed, codec = _feed()
    stream = Stream(feed, codec)
    for output in _run("r1", 3, end=None):
        stream.add("th", output)
    _ingest(feed, stream.records)
    assert feed.active_run("th") == ("r1", 0)
    state = feed.run("r1")
    assert state is not None and not state.terminal
    stream.records.clear()
    stream.add("th", _life("r1", "run_cancelled", 1))
    _ingest(feed, stream.records)
    assert feed.active_run("th") is None and state.terminal
    assert codec.parts_decoded("th") == 0


def test_another_threads_run_id_is_refused_quietly_when_made_late() -> None:
    """A part naming a run of another thread is dropped as the eager filter drops it,
    even when the other thread's run_accepted was not looked at yet."""
    feed, codec = _feed()
    stream = Stream(feed, codec)
    stream.add("other", _life("theirs", "run_accepted"))
    stream.add("th", _life("mine", "run_accepted"))
    stream.add("th", _part("theirs", 1, "X:message", 0, MessageStart("assistant")))
    stream.add("th", _part("mine", 0, "X:message", 0, MessageStart("assistant")))
    _ingest(feed, stream.records)
    made, unknown, _ = _eager(stream)
    assert not any(unknown)
    _sub, snapshot, covered = feed.subscribe("th")
    assert covered == (0, -1) and snapshot == _of("th", made, stream)


class _Consumer:
    def __init__(self, batches: list[dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]]) -> None:
        self.batches = batches

    async def getmany(self, timeout_ms: int = 0, max_records: int = 0) -> \
            dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]:
        return self.batches.pop(0)


async def test_write_lag_counts_the_records_of_watched_threads() -> None:
    """The write lag (metric and /healthz) is measured over records someone was sent."""
    feed, codec = _feed()
    stream = Stream(feed, codec)
    _interleave(stream, {"watched": _run("r1", 3), "nobody": _run("r2", 5)})
    feed.subscribe("watched")
    batch: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]] = {}
    for partition, record, _meta, _output in stream.records:
        batch.setdefault(TopicPartition("stream", partition), []).append(record)
    feed._consumer_ = cast(AIOKafkaConsumer, _Consumer([batch]))
    await feed._step()
    lag = cast(dict[str, Any], feed.stats()["write_lag_ms"])
    assert lag["records"] == len(_run("r1", 3))


# --- any stream, any subscriber -----------------------------------------------------------

THREADS = ("th-a", "th-b", "th-c")
LIFECYCLE = ("run_accepted", "run_accepted", "attempt_dispatched", "retry_scheduled",
             "run_completed", "run_failed", "run_cancelled", "step_recorded",
             "execution_started", "interrupt")
PARTS: tuple[Any, ...] = (MessageStart("assistant"), TextStart(), TextDelta("d"), TextDelta("e"),
                          TextDelta("f"), TextEnd("t"), MessageEnd("stop"),
                          StepOutput("tool_call", "search", "{}"))


@st.composite
def _records(draw: st.DrawFn) -> list[tuple[str, StreamOutput, bool | str]]:
    """Arbitrary records (the filter must agree on any order): lifecycle events and
    parts of a few runs per thread, attempts, executions and seqs from small sets."""
    out = []
    for _ in range(draw(st.integers(0, 80))):
        thread = draw(st.sampled_from(THREADS))
        run = f"{thread}-r{draw(st.integers(0, 2))}"
        attempt = draw(st.integers(0, 3))
        if draw(st.integers(0, 4)) == 0:
            output = _life(run, draw(st.sampled_from(LIFECYCLE)), attempt)
        else:
            execution = draw(st.sampled_from("XYZ"))
            payload = draw(st.sampled_from(PARTS))
            part = "message" if isinstance(payload, MessageStart | MessageEnd) else "text:0"
            output = _part(run, attempt, f"{execution}:{part}", draw(st.integers(0, 6)), payload)
        # Some without headers, some without the lifecycle header (older writers).
        kind = draw(st.integers(0, 9))
        header: bool | str = False if kind == 0 else "payload" if kind == 1 else True
        out.append((thread, output, header))
    return out


@dataclass
class _Watch:
    thread: str
    run: str | None
    at: int  # subscribes after this many records
    until: int  # unsubscribes after this many
    sub: Subscriber | None = None
    snapshot: list[SseEvent] = field(default_factory=list)
    covered: Position = (-1, -1)


@hsettings(max_examples=300, database=None)
@given(records=_records(), data=st.data(),
       window_events=st.sampled_from([1, 3, 6, 2_000]), max_windows=st.sampled_from([1, 2, 100]))
def test_subscribers_get_the_eager_events_wherever_they_join(
        records: list[tuple[str, StreamOutput, bool | str]], data: st.DataObject, window_events: int,
        max_windows: int) -> None:
    """Whatever the records and whenever a subscriber comes and goes: its snapshot is the
    eager path's events of its thread (or run) after the coverage it is given, its queue
    the eager events that followed, and it is closed where the eager feed closed it.
    Without trimming or eviction the coverage and the run facts are the eager feed's."""
    feed, codec = _feed(window_events, max_windows)
    stream = Stream(feed, codec)
    for thread, output, header in records:
        stream.add(thread, output, header)
    made, unknown, tracker = _eager(stream)
    count = len(records)
    watches = []
    for _ in range(data.draw(st.integers(0, 4), "watchers")):
        at = data.draw(st.integers(0, count), "at")
        thread = data.draw(st.sampled_from(THREADS), "thread")
        run = data.draw(st.sampled_from([None, f"{thread}-r0", f"{thread}-r1"]), "run")
        watches.append(_Watch(thread, run, at, data.draw(st.integers(at, count + 1), "until")))
    roomy = window_events > count and max_windows > len(THREADS)
    covered_eager = dict.fromkeys(THREADS, (0, -1))
    active_eager: dict[str, str | None] = dict.fromkeys(THREADS)
    for index in range(count + 1):
        for watch in watches:
            if watch.at == index:
                watch.sub, watch.snapshot, watch.covered = feed.subscribe(watch.thread, watch.run)
                expected = _of(watch.thread, made, stream, upto=index, after=watch.covered,
                               run=watch.run)
                assert watch.snapshot == expected, (index, watch)
                if roomy:
                    assert watch.covered == covered_eager[watch.thread]
            if watch.until == index and watch.sub is not None:
                feed.unsubscribe(watch.sub)
        if index == count:
            break
        partition, record, meta, output = stream.records[index]
        feed.ingest(partition, record)
        if unknown[index]:
            covered_eager[meta.thread_id] = (record.offset + 1, -1)
        state = tracker.runs.get(output.run_id)
        if made[index] and isinstance(output.payload, RunLifecycle) and state is not None:
            if output.payload.event == "run_accepted":
                active_eager[meta.thread_id] = output.run_id
            elif state.terminal and active_eager[meta.thread_id] == output.run_id:
                active_eager[meta.thread_id] = None
    for watch in watches:
        if watch.sub is None:
            continue
        stop = min(watch.until, count)
        closing = [i for i in range(watch.at, stop) if unknown[i]
                   and stream.records[i][2].thread_id == watch.thread
                   and watch.run in (None, stream.records[i][3].run_id)]
        end = closing[0] if closing else stop
        live = [e for i in range(watch.at, end) if stream.records[i][2].thread_id == watch.thread
                for e in made[i] if watch.run in (None, e.run_id)]
        assert list(watch.sub.pending) == live, watch
        assert (watch.sub.closed == "unknown run") == bool(closing), watch
    for run, state in tracker.runs.items():
        assert _facts(feed.run(run)) == _facts(state), run
    if roomy:
        for thread in THREADS:
            expected_run = active_eager[thread]
            state = tracker.runs.get(expected_run) if expected_run else None
            assert feed.active_run(thread) == (None if state is None else (expected_run, state.start))
