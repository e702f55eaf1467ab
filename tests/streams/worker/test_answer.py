"""An execution's answer records, without Kafka or an agent: coalescing and numbering."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streams.core.domain import Citation, Step
from streams.core.records import (
    CitationsOutput,
    MessageEnd,
    MessageStart,
    StepOutput,
    StreamOutput,
    TextDelta,
    TextEnd,
    TextStart,
)
from streams.worker.answer import Answer


def _answer(coalesce_s: float = 0.005, budget: int = 1 << 20) -> Answer:
    return Answer("r-1", 2, "a-1", "e1", coalesce_s, budget)


def _shape(outputs: list[StreamOutput]) -> list[tuple[str, int, object]]:
    return [(o.part_id, o.seq, o.payload) for o in outputs]


def test_a_whole_answer_is_numbered_in_order() -> None:
    """Shows a whole answer's records: one seq order across message, text, step and citation parts."""
    answer = _answer()
    out = answer.start()
    out += answer.add_text("Hel", now=0.0)
    out += answer.add_text("lo", now=0.001)
    out += answer.close_text()
    out += answer.add_step(Step("tool", "search", "{}"))
    out += answer.add_text("!", now=1.0)
    answer.add_citations((Citation("https://x", "x"),))
    out += answer.end()
    assert _shape(out) == [
        ("e1:message", 0, MessageStart("assistant")),
        ("e1:text:0", 1, TextStart()),
        ("e1:text:0", 2, TextDelta("Hello")),
        ("e1:text:0", 3, TextEnd("Hello")),
        ("e1:step:0", 4, StepOutput("tool", "search", "{}")),
        ("e1:text:1", 5, TextStart()),
        ("e1:text:1", 6, TextDelta("!")),
        ("e1:text:1", 7, TextEnd("!")),
        ("e1:citations", 8, CitationsOutput((Citation("https://x", "x"),))),
        ("e1:message", 9, MessageEnd("stop")),
    ]
    assert all((o.run_id, o.attempt, o.message_id) == ("r-1", 2, "a-1") for o in out)
    assert answer.text == "Hello!" and answer.steps == [Step("tool", "search", "{}")]


def test_deltas_wait_for_the_coalescing_window() -> None:
    """Shows text deltas are held until the coalescing window has passed, then sent as one."""
    answer = _answer(coalesce_s=0.01)
    answer.start()
    assert [o.payload for o in answer.add_text("a", now=0.0)] == [TextStart()]
    assert answer.flush_at == 0.01
    assert answer.add_text("b", now=0.005) == []
    assert [o.payload for o in answer.add_text("c", now=0.01)] == [TextDelta("abc")]
    assert answer.flush_at is None
    answer.add_text("d", now=0.02)
    assert [o.payload for o in answer.flush()] == [TextDelta("d")]  # the timer fired
    assert answer.flush() == []


def test_no_coalescing_sends_each_chunk() -> None:
    """Shows with no coalescing window each chunk is sent as its own delta at once."""
    answer = _answer(coalesce_s=0.0)
    answer.start()
    assert [o.payload for o in answer.add_text("a", now=5.0)] == [TextStart(), TextDelta("a")]
    assert [o.payload for o in answer.add_text("b", now=5.0)] == [TextDelta("b")]


def test_held_deltas_wait_past_their_window_until_released() -> None:
    """Shows a held chunk is kept pending though its window has passed, and the next
    unheld one (or a flush) sends everything pending as one delta."""
    answer = _answer(coalesce_s=0.0)
    answer.start()
    assert [o.payload for o in answer.add_text("a", now=1.0, hold=True)] == [TextStart()]
    assert answer.add_text("b", now=2.0, hold=True) == []
    assert answer.flush_at == 1.0  # due since the first pending chunk
    assert [o.payload for o in answer.add_text("c", now=3.0)] == [TextDelta("abc")]
    answer.add_text("d", now=4.0, hold=True)
    assert [o.payload for o in answer.close_text()] == [TextDelta("d"), TextEnd("abcd")]


def test_the_budget_counts_utf8_bytes() -> None:
    """Shows the output budget counts UTF-8 bytes, not characters."""
    answer = _answer(budget=4)
    assert answer.spend("é")  # 2 bytes
    assert answer.spend("ab")
    assert not answer.spend("c")


def test_an_error_ends_the_message_after_what_was_sent() -> None:
    """Shows an error ends the message with "error" right after the records already sent, in seq order."""
    answer = _answer()
    out = answer.start() + answer.add_text("x", now=0.0) + answer.end_with_error()
    assert [o.seq for o in out] == [0, 1, 2]
    assert out[-1].payload == MessageEnd("error") and out[-1].part_id == "e1:message"


@given(st.lists(st.tuples(st.text(min_size=1, max_size=5), st.floats(0, 0.02)), max_size=30),
       st.floats(0, 0.01))
def test_deltas_carry_every_chunk_once_in_order(chunks: list[tuple[str, float]],
                                                coalesce_s: float) -> None:
    """Shows the deltas carry every chunk once, in order, with no empty delta, whatever the timing."""
    answer = _answer(coalesce_s=coalesce_s)
    out = answer.start()
    now = 0.0
    for text, step in chunks:
        now += step
        out += answer.add_text(text, now)
    out += answer.end()
    deltas = "".join(o.payload.delta for o in out if isinstance(o.payload, TextDelta))
    assert deltas == "".join(t for t, _ in chunks) == answer.text
    assert [o.seq for o in out] == list(range(len(out)))
    assert all(o.payload.delta for o in out if isinstance(o.payload, TextDelta))
