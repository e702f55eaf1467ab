"""The testing kit itself: the process wrapper's marker waits, SIGKILL and restart,
the SSE parser's reading of frames, and the wait for a stream to open."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from streams.testing.process import ChildProcess, role_args
from streams.testing.sse import SseEvent, SseParser, until_opened

SLEEPER = ["-c", "import os, time; print('ready', os.getpid(), flush=True); time.sleep(600)"]


def test_a_child_is_waited_for_by_marker_killed_and_restarted(tmp_path: Path) -> None:
    """A child is waited for by its log marker, killed with SIGKILL and restarted with a new pid."""
    child = ChildProcess("sleeper", SLEEPER, {}, tmp_path / "sleeper.log").start()
    try:
        child.wait_for_log("ready")
        first = child.pid
        assert f"ready {first}" in child.output()
        child.kill9()
        assert child.exited() == -signal.SIGKILL
        child.restart().wait_for_log(f"ready {child.pid}")  # this start's marker, not the last one's
        assert child.pid != first and child.alive() and child.starts == 2
        assert f"ready {first}" not in child.output()
    finally:
        child.stop()
    assert not child.alive()


def test_a_child_that_exits_before_its_marker_fails_the_wait_at_once(tmp_path: Path) -> None:
    """Waiting for a marker fails at once when the child exits without writing it."""
    child = ChildProcess("quitter", ["-c", "print('bye')"], {}, tmp_path / "quitter.log").start()
    with pytest.raises(AssertionError, match="exited"):
        child.wait_for_log("ready", timeout=60)


def test_a_file_is_waited_for_while_its_writer_works(tmp_path: Path) -> None:
    """A port file is waited for as long as its writer uses CPU (here 3 s of it, twice
    the 1.5 s without progress the wait allows), not for a fixed time."""
    port = tmp_path / "port"
    busy = ("import sys, time\nend = time.process_time() + 3.0\n"
            "while time.process_time() < end: pass\n"
            "open(sys.argv[1], 'w').write('4242')\ntime.sleep(600)")
    child = ChildProcess("busy", ["-c", busy, str(port)], {}, tmp_path / "busy.log").start()
    try:
        assert child.wait_for_file(port, timeout=1.5) == "4242"
    finally:
        child.stop()


def test_a_file_wait_fails_at_once_on_exit_and_on_an_idle_writer(tmp_path: Path) -> None:
    """A writer that exits without writing fails the wait at once; one that sits idle
    fails it once it used no CPU for the timeout."""
    quitter = ChildProcess("quitter", ["-c", "print('bye')"], {}, tmp_path / "q.log").start()
    with pytest.raises(AssertionError, match="exited"):
        quitter.wait_for_file(tmp_path / "never", timeout=60)
    sleeper = ChildProcess("sleeper", SLEEPER, {}, tmp_path / "s.log").start()
    try:
        sleeper.wait_for_log("ready")
        with pytest.raises(AssertionError, match="no progress"):
            sleeper.wait_for_file(tmp_path / "never", timeout=0.5)
    finally:
        sleeper.stop()


def test_roles_run_by_module_name() -> None:
    """A role runs by module: the gateway as its own, the others through streams.cli."""
    assert role_args("gateway") == ["-m", "gateway"]
    assert role_args("processor") == ["-m", "streams.cli", "processor"]


def test_sse_frames_are_read_as_an_event_source_reads_them() -> None:
    """SSE frames are parsed as an EventSource does: comments skipped, id, event, multi-line data."""
    parser = SseParser()
    lines = [b": keepalive\n", b"retry: 1000\n", b"\n", b"id: 7\n", b"event: delta\n",
             b"data: {\"a\":\n", b"data: 1}\r\n", b"\n", b"data:plain\n", b"\n"]
    events = [e for e in map(parser.feed, lines) if e is not None]
    assert events == [SseEvent("7", "delta", "{\"a\":\n1}"), SseEvent(None, "message", "plain")]
    assert events[0].json == {"a": 1}


async def test_the_wait_for_a_stream_to_open_ends_when_it_opens() -> None:
    """`until_opened` returns once the reader sets its event, the reader still running."""
    opened, go_on = asyncio.Event(), asyncio.Event()

    async def reader() -> str:
        opened.set()
        await go_on.wait()
        return "read"

    task = asyncio.create_task(reader())
    await until_opened(opened, task)
    assert opened.is_set() and not task.done()
    go_on.set()
    assert await task == "read"


@pytest.mark.parametrize("ending", ["refused", "returned"])
async def test_the_wait_for_a_stream_to_open_fails_at_once_when_the_reader_ends(
        ending: str) -> None:
    """A reader that ends before it opens (an assertion on a refused request, or a
    return) fails the wait with how it ended, instead of leaving it waiting forever."""
    opened = asyncio.Event()

    async def reader() -> str:
        await asyncio.sleep(0)
        assert ending != "refused", "503: no gateway serves this thread now"
        return "nothing"

    with pytest.raises(AssertionError, match="ended before it opened") as failure:
        await until_opened(opened, asyncio.create_task(reader()))
    assert ("503" if ending == "refused" else "'nothing'") in str(failure.value) + \
        str(failure.value.__cause__)
