"""Branches (issue #30): does a thread with 50 branches cost more per turn than a
straight thread of the same length? And what does a branch cost in bytes?

The method of `bench.growth`, on one stack (`threadline processor` and `threadline
gateway`, no worker: the bench reports each run completed itself, so the figures are
the decision path's alone). Threads are prepared with commands produced straight to
Kafka, pipelined: a *straight* thread is 2,000 turns (a post and its run's
completion each); a *branched* one is the same 2,000 turns with a fork every 40:
alternately a `RegenerateAnswer` of the newest question (its run completed: a second
answer beside the first) and an `EditMessage` of it (a sibling question and its
answer), each moving the current branch, so it ends with 50 branches beside the
first, its current branch still 2,000 turns long. Then, round by round and
alternating the order:

* *CPU*: a burst of five turns on each of the straight and then (or first) the
  branched threads, produced while the processor is stopped (SIGSTOP), its CPU from
  SIGCONT until its group's committed offset passes the last command;
* *latency*: one `POST /v1/threads/{id}/user_message` a side, timed until its 202,
  then the run completed and its decision awaited.

*Bytes per branch*: the branched threads' newest state and message records against
the straight ones', read back from the `threads` and `messages` topics, per branch.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import aiohttp
from confluent_kafka import Consumer, TopicPartition

from bench.common import Figure, load_text, median, percentile
from bench.growth import (
    QUESTION,
    TENANT,
    TURNS_EACH,
    Commands,
    burst_cpu,
    post_message,
    same_partition_threads,
    wait_ready,
)
from bench.stack import AUTH, Stack, new_stack
from streams.core.domain import CreateThread, EditMessage, RegenerateAnswer
from streams.core.history import parse_message_key
from streams.core.ids import regenerate_run_id_for, run_id_for

BENCH = "branches"
TURNS = 2_000
BRANCHES = 50
THREADS = 3  # threads a side
CPU_ROUNDS = 10
POST_ROUNDS = 30
WARMUP_POSTS = 3
STRAIGHT, BRANCHED = f"straight, {TURNS:,} turns", f"{BRANCHES} branches, {TURNS:,} turns"


def prepare(kafka: Commands, thread: str, branches: int) -> None:
    """`TURNS` turns on `thread`, with a fork of the newest question every
    TURNS // branches turns (none if `branches` is 0), regenerate and edit in turn."""
    every = TURNS // branches if branches else 0
    now = int(time.time() * 1000)
    for i in range(TURNS):
        kafka.turns(thread, i, 1)
        if every and i % every == every - 1:
            if (i // every) % 2 == 0:
                key = f"again-{i}"
                kafka.send(RegenerateAnswer(thread, TENANT, f"m-{i}", key, now))
                kafka.complete(thread, regenerate_run_id_for(thread, key), now)
            else:
                kafka.send(EditMessage(thread, TENANT, f"m-{i}", f"e-{i}", QUESTION + " (edited)",
                                       None, now))
                kafka.complete(thread, run_id_for(thread, f"e-{i}"), now)


def branch_count(stack: Stack, thread: str) -> int:
    """The thread's branches as the gateway reads them (GET /v1/threads/{id})."""
    request = urllib.request.Request(f"{stack.base}/v1/threads/{thread}", headers=AUTH)
    with urllib.request.urlopen(request, timeout=30) as response:
        return int(json.loads(response.read())["branch_count"])


def stored_bytes(stack: Stack, threads: set[str]) -> tuple[dict[str, int], dict[str, int]]:
    """Per thread: the bytes of its newest state record and of its newest message
    records (one per seq), read back from the topics."""
    settings = stack.settings
    consumer = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": "bench-branches",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "log_level": 0})
    state: dict[str, int] = {}
    messages: dict[tuple[str, int], int] = {}
    try:
        for topic in (settings.topics.threads, settings.topics.messages):
            parts = consumer.list_topics(topic, timeout=30).topics[topic].partitions
            ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                    for p in parts}
            consumer.assign([TopicPartition(topic, p, 0) for p in parts])
            left = {p for p, end in ends.items() if end > 0}
            while left:
                for msg in consumer.consume(1000, 0.5):
                    if msg.error() is not None:
                        continue
                    key, size = msg.key() or b"", len(msg.value() or b"")
                    if topic == settings.topics.threads:
                        if key.decode() in threads:
                            state[key.decode()] = size
                    else:
                        thread, seq = parse_message_key(key)
                        if thread in threads and msg.value() is None:  # a tombstone
                            messages.pop((thread, seq), None)
                        elif thread in threads:
                            messages[(thread, seq)] = size
                # The position, not the last record: a transaction's marker ends a partition.
                left = {tp.partition for tp in consumer.position(
                    [TopicPartition(topic, p) for p in left]) if tp.offset < ends[tp.partition]}
            consumer.unassign()
    finally:
        consumer.close()
    totals = dict.fromkeys(threads, 0)
    for (thread, _), size in messages.items():
        totals[thread] += size
    return state, totals


async def _post_rounds(stack: Stack, kafka: Commands, straight: list[str], branched: list[str]) \
        -> tuple[list[float], list[float]]:
    """One post a side a round, the order alternating."""
    latencies: tuple[list[float], list[float]] = ([], [])
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        for r in range(POST_ROUNDS + WARMUP_POSTS):
            sides = [(straight[r % len(straight)], latencies[0]),
                     (branched[r % len(branched)], latencies[1])]
            for thread, out in sides if r % 2 == 0 else sides[::-1]:
                elapsed, run_id, _ = await post_message(session, stack, thread)
                kafka.complete(thread, run_id)
                kafka.decided()
                if r >= WARMUP_POSTS:
                    out.append(elapsed)
    return latencies


def run(bootstrap: str) -> list[Figure]:
    """Processor CPU per command, POST -> 202 and bytes per branch: 50 branches against none."""
    stack = new_stack(bootstrap).start(["processor", "gateway"])
    kafka = Commands(stack.settings)
    partitions = stack.settings.partitions
    try:
        kafka.ready()
        asyncio.run(wait_ready(stack))
        straight = list(same_partition_threads("straight", partitions, THREADS))
        branched = list(same_partition_threads("branched", partitions, THREADS))
        now = int(time.time() * 1000)
        t0 = time.monotonic()
        for thread in [*straight, *branched]:
            kafka.send(CreateThread(thread, TENANT, "branches", now))
        for a, b in zip(straight, branched, strict=True):
            prepare(kafka, a, 0)
            prepare(kafka, b, BRANCHES)
        kafka.decided(900)
        counts = [branch_count(stack, t) for t in branched]
        print(f"  prepared {THREADS} + {THREADS} threads of {TURNS:,} turns in "
              f"{time.monotonic() - t0:.1f} s; branches {counts}", flush=True)
        if any(c != BRANCHES + 1 for c in counts):
            raise RuntimeError(f"a branched thread has {counts} branches, not {BRANCHES + 1}")
        pid = stack.children["processor"].pid
        load_cpu = load_text()
        cpu: tuple[list[float], list[float]] = ([], [])
        for r in range(CPU_ROUNDS):
            first = TURNS + r * TURNS_EACH
            sides = [(straight, cpu[0]), (branched, cpu[1])]
            for threads, out in sides if r % 2 == 0 else sides[::-1]:
                out.append(burst_cpu(kafka, pid, threads, first))
            print(f"  [{r + 1}/{CPU_ROUNDS}] CPU µs/cmd straight {cpu[0][-1]:.0f}, branched "
                  f"{cpu[1][-1]:.0f}  (load {load_text()})", flush=True)
        load_post = load_text()
        posts = asyncio.run(_post_rounds(stack, kafka, straight, branched))
        print(f"  POST -> 202 p50 straight {median(posts[0]):.1f} ms, branched "
              f"{median(posts[1]):.1f} ms  (load {load_text()})", flush=True)
        states, messages = stored_bytes(stack, {*straight, *branched})
    finally:
        kafka.close()
        stack.stop()
    state_per_branch = (median([states[t] for t in branched])
                        - median([states[t] for t in straight])) / BRANCHES
    messages_per_branch = (median([messages[t] for t in branched])
                           - median([messages[t] for t in straight])) / BRANCHES
    ratios = [b / a for a, b in zip(cpu[0], cpu[1], strict=True)]
    by_round = " | ".join(f"{a:.0f}/{b:.0f}" for a, b in zip(cpu[0], cpu[1], strict=True))
    figures = []
    for case, side, posts_ms in ((STRAIGHT, cpu[0], posts[0]), (BRANCHED, cpu[1], posts[1])):
        values = {"CPU µs/cmd": median(side), "POST p50 ms": median(posts_ms),
                  "POST p99 ms": percentile(posts_ms, 99), "posts": len(posts_ms)}
        figures.append(Figure(BENCH, case, values, None if case == STRAIGHT else STRAIGHT,
                              {"processor": median(side)}, f"{load_cpu} / {load_post}"))
    figures[1].values["x CPU µs/cmd"] = median(ratios)
    figures[1].values["x POST p50"] = median(posts[1]) / median(posts[0])
    figures[1].values["state bytes per branch"] = state_per_branch
    figures[1].values["message bytes per branch"] = messages_per_branch
    figures[1].note = (
        f"CPU µs/cmd by round (straight / branched): {by_round}; a burst is {TURNS_EACH} turns "
        f"on each of {THREADS} threads ({2 * TURNS_EACH * THREADS} commands), turns "
        f"{TURNS + 1:,}-{TURNS + CPU_ROUNDS * TURNS_EACH:,}; a branch is half regenerates "
        f"(one more answer record) and half edits (a question and its answer); newest state "
        f"record: straight {median([states[t] for t in straight]):.0f} B, branched "
        f"{median([states[t] for t in branched]):.0f} B; stored messages: straight "
        f"{median([messages[t] for t in straight]):,.0f} B, branched "
        f"{median([messages[t] for t in branched]):,.0f} B")
    return figures


if __name__ == "__main__":
    from bench.common import broker

    with broker() as bootstrap:
        for figure in run(bootstrap):
            print(figure.case, figure.values, figure.note)
