"""Decisions go back to the gateway that asked (issue #26's "a command's decision
reaches the gateway that asked without every gateway decoding every event"): two
command buses on the real stack, each with its own reply id; each decodes its own
decisions and every gateway's run starts and ends, and hands the others' on by
thread and kind without decoding them."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from gateway.model.decisions import CommandBus, new_traceparent
from streams.clock import now_ms
from streams.core.domain import CreateThread, Event, PostUserMessage, RunCompleted, ThreadCreated
from streams.wire import Codec, EnvelopeMeta
from tests.gateway.conftest import Stack

pytestmark = pytest.mark.kafka


class _CountingCodec(Codec):
    """A codec that counts the events it decodes, by kind."""

    def __init__(self) -> None:
        super().__init__()
        self.decoded: Counter[str] = Counter()

    def decode_event(self, data: bytes) -> tuple[EnvelopeMeta, Any]:
        """Decode, and count the kind."""
        meta, event = super().decode_event(data)
        self.decoded[type(event).__name__] += 1
        return meta, event


async def test_a_gateway_decodes_its_own_decisions_and_runs_and_skips_the_rest(stack: Stack) -> None:
    """Bus `theirs` creates a thread and runs a message on it: bus `ours` decodes
    only the run's start and end of it, and is told of the rest by thread and kind;
    bus `theirs` decodes its decisions. A creation through `ours` is decoded by it."""
    ours_codec, theirs_codec = _CountingCodec(), _CountingCodec()
    ours, theirs = CommandBus(stack.settings, ours_codec), CommandBus(stack.settings, theirs_codec)
    undecoded: list[tuple[str, bytes]] = []
    ended = asyncio.Event()
    ours.on_undecoded = lambda thread, kind: undecoded.append((thread, kind))
    ours.on_event = lambda event: ended.set() if isinstance(event, RunCompleted) else None
    await ours.start()
    await theirs.start()
    try:
        assert ours.reply_id != theirs.reply_id
        thread = f"replies-{now_ms()}"
        created = await theirs.decide(CreateThread(thread, "tenant-a", "t", now_ms()),
                                      "tenant-a", new_traceparent())
        assert isinstance(created, ThreadCreated)
        accepted: Event | None = await theirs.decide(
            PostUserMessage(thread, "tenant-a", "m1", "hello", None, now_ms()), "tenant-a",
            new_traceparent())
        assert accepted is not None and type(accepted).__name__ != "RunRejected", accepted
        await ended.wait()  # ours decoded the run's end: every decision before it was read

        kinds = {kind for t, kind in undecoded if t == thread}
        assert {b"ThreadCreated", b"MessageAccepted", b"AttemptDispatched"} <= kinds
        assert ours_codec.decoded.keys() == {"RunAccepted", "RunCompleted"}
        assert theirs_codec.decoded["ThreadCreated"] == 1
        assert theirs_codec.decoded["MessageAccepted"] == 1

        mine = await ours.decide(CreateThread(f"{thread}-b", "tenant-a", "t", now_ms()),
                                 "tenant-a", new_traceparent())
        assert isinstance(mine, ThreadCreated) and ours_codec.decoded["ThreadCreated"] == 1
    finally:
        await ours.stop()
        await theirs.stop()
