"""A running Threadline stack for connector tests: the processor, a worker, connector
instances and the chat double, on one topic prefix of the session broker."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from streams.config import Settings
from streams.connectors.ids import message_id_for
from streams.connectors.outbox import ANSWER, ChatOutbox
from streams.connectors.topics import ensure_connector_topics, outbox_topic
from streams.core.domain import Event, RunAccepted, RunCompleted
from streams.core.ids import outbox_id_for, run_id_for
from streams.devtools.broker import free_port
from streams.testing.process import RoleProcess, logs_of, wait_for
from streams.testing.stack import fresh_env, wait_for_group
from streams.wire import Codec
from streams.wire.connector import decode_outbox
from tests.connectors.chat_double import SIGNING_SECRET, TEAM, ChatDouble
from tests.kafka_helpers import read_topic

CODEC = Codec()  # single-object records, as the roles write them without a registry

FAST = {"THREADLINE_AGENT_TOKENS_PER_S": "0", "THREADLINE_AGENT_WORDS": "6"}
BOT_TOKEN = "xoxb-test"


@dataclass
class Stack:
    """A connector test stack: environment, chat double, processor, worker and connectors by name."""
    env: dict[str, str]
    tmp: Path
    double: ChatDouble
    processor: RoleProcess | None = None
    worker: RoleProcess | None = None
    connectors: dict[str, RoleProcess] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def settings(self) -> Settings:
        """The stack's settings, read from its environment."""
        return Settings.from_env(self.env)

    def connector_env(self, name: str, **extra: str) -> dict[str, str]:
        """Environment of connector `name`: its own data folder, instance id and HTTP port."""
        port = self.ports.setdefault(name, free_port())
        return {**self.env, "THREADLINE_DATA_DIR": str(self.tmp / name),
                "THREADLINE_INSTANCE_ID": name, "THREADLINE_CONNECTOR_HTTP_PORT": str(port),
                **extra}

    def start_connector(self, name: str, **extra: str) -> RoleProcess:
        """Start connector `name` as a process and wait until its /stats answers."""
        proc = RoleProcess("connector", self.connector_env(name, **extra),
                           self.tmp / f"{name}.log").start()
        self.connectors[name] = proc
        wait_for(lambda: self.stats(name) is not None, 30, 0.1, progress=logs_of(proc.log))
        return proc

    def url(self, name: str) -> str:
        """The Slack events URL of connector `name`."""
        return f"http://127.0.0.1:{self.ports[name]}/slack/events"

    def stats(self, name: str) -> dict[str, int] | None:
        """Counters from connector `name`'s /stats, or None if it does not answer."""
        try:
            with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                    f"http://127.0.0.1:{self.ports[name]}/stats", timeout=2) as response:
                data: dict[str, int] = json.loads(response.read())
                return data
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def say(self, name: str, channel: str, text: str, **kwargs: Any) -> tuple[dict[str, Any], list[int]]:
        """A person writes in `channel`; the event is delivered to connector `name`."""
        payload = self.double.user_message(channel, text, **kwargs)
        return payload, self.double.deliver(self.url(name), payload)

    def marker_turn(self, name: str, channel: str, thread_ts: str | None = None,
                    timeout: float = 30) -> str:
        """A later turn, told to connector `name` and answered: a marker. The relay
        reads a thread's events in order and delivers its lanes in order, so once the
        marker's answer is posted, whatever an earlier event of the thread caused
        has been done (instead of sleeping and hoping it would have been)."""
        payload, statuses = self.say(name, channel, "marker", thread_ts=thread_ts)
        assert statuses[-1] == 200, statuses
        run = run_of(payload, thread_of(payload))
        answer = outbox_id_for(run, ANSWER)
        wait_until(lambda: any(p.outbox_id == answer and p.text.startswith("You said: marker.")
                               for p in self.double.bot_posts(channel)), timeout, "the marker", self)
        return run

    def wait_for_group(self, members: int, timeout: float = 40) -> None:
        """Wait until the connector consumer group is stable with `members` members,
        while its description keeps changing (`wait_for_group`)."""
        wait_for_group(self.settings, f"{self.settings.topic_prefix}connector", members, timeout)

    def events(self, until: Callable[[list[Event]], bool], timeout: float = 60) -> list[Event]:
        """Decoded records of the events topic, read from the start until `until` holds."""
        return read_topic(self.settings, self.settings.topics.events,
                          lambda b: CODEC.decode_event(b)[1], until=until, timeout=timeout)

    def outboxes(self) -> dict[str, ChatOutbox]:
        """The newest committed outbox of every thread, read to the end of the topic."""
        topic = outbox_topic(self.settings)
        consumer = Consumer({"bootstrap.servers": self.settings.bootstrap, "log_level": 3,
                             "group.id": f"outbox-{uuid.uuid4()}", "enable.auto.commit": False,
                             "isolation.level": "read_committed", "enable.partition.eof": True})
        partitions = range(self.settings.partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        found: dict[str, ChatOutbox] = {}
        todo, since = set(partitions), time.monotonic()
        try:
            while todo:  # to the end of every partition; a stalled read fails, not a partial one
                assert time.monotonic() - since < 30, f"outbox topic: no record in 30s, {todo} unread"
                for msg in consumer.consume(500, timeout=0.2):
                    since = time.monotonic()
                    error = msg.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            todo.discard(msg.partition() or 0)
                        continue
                    outbox = decode_outbox(msg.value() or b"")
                    found[outbox.thread_id] = outbox
        finally:
            consumer.close()
        return found

    def logs(self) -> str:
        """The tail of every process's log, for a failure message."""
        procs = {"processor": self.processor, "worker": self.worker, **self.connectors}
        return "\n".join(f"--- {n}\n{p.tail(25)}" for n, p in procs.items() if p is not None)

    def progress(self) -> tuple[int, ...]:
        """What changes while the stack is doing something: the size of every
        process's log and the chat double's posts and held calls."""
        procs = [self.processor, self.worker, *self.connectors.values()]
        sizes = logs_of(*(p.log for p in procs if p is not None))()
        return (*sizes, len(self.double.bot_posts()), sum(self.double.waiting.values()))

    def stop(self) -> None:
        """Stop the connectors, the worker, then the processor."""
        for proc in [*self.connectors.values(), self.worker, self.processor]:
            if proc is not None:
                proc.stop()


def run_of(payload: dict[str, Any], thread_id: str) -> str:
    """The run a message event starts."""
    event = payload["event"]
    return run_id_for(thread_id, message_id_for(TEAM, event["channel"], event["ts"]))


def thread_of(payload: dict[str, Any]) -> str:
    """The thread id of a Slack message event: its channel and thread ts (or its own ts)."""
    event = payload["event"]
    return f"slack:{TEAM}:{event['channel']}:{event.get('thread_ts') or event['ts']}"


def completed(runs: set[str]) -> Callable[[list[Event]], bool]:
    """An `until` for the events topic: every run in `runs` has completed."""
    return lambda events: {e.run_id for e in events if isinstance(e, RunCompleted)} >= runs


def accepted_runs(events: list[Event]) -> list[str]:
    """Ids of the accepted runs among `events`, in order."""
    return [e.run_id for e in events if isinstance(e, RunAccepted)]


@contextmanager
def running_stack(kafka_bootstrap: str, tmp: Path, *, double: ChatDouble | None = None,
                  **env: str) -> Iterator[Stack]:
    """The processor and a worker on a fresh prefix, the chat double, no connector yet."""
    double = (double or ChatDouble()).start()
    base = {**fresh_env(kafka_bootstrap, tmp), "THREADLINE_DATA_DIR": str(tmp / "processor"),
            "THREADLINE_SLACK_SIGNING_SECRET": SIGNING_SECRET,
            "THREADLINE_SLACK_BOT_TOKEN": BOT_TOKEN, "THREADLINE_SLACK_API_URL": double.api_url,
            **FAST, **env}
    stack = Stack(base, tmp, double)
    ensure_connector_topics(stack.settings, 86_400_000)
    try:
        stack.processor = RoleProcess("processor", base, tmp / "processor.log").start()
        stack.worker = RoleProcess("worker", {**base, "THREADLINE_DATA_DIR": str(tmp / "worker"),
                                              "THREADLINE_INSTANCE_ID": "w1"},
                                   tmp / "worker.log").start()
        yield stack
    finally:
        stack.stop()
        double.stop()


def unique_channel() -> str:
    """A fresh random Slack channel id."""
    return "C" + uuid.uuid4().hex[:9].upper()


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, stack: Stack) -> Any:
    """Poll `predicate` until it is truthy and return it, while the stack makes
    progress: fail with the stack's logs once `timeout` seconds pass in which no
    process wrote to its log and the chat double saw no new post or call. A loaded
    machine slows a wait down; only a stack that stopped moving fails it."""
    try:
        return wait_for(predicate, timeout, progress=stack.progress)
    except AssertionError:
        raise AssertionError(f"{what}: no progress in {timeout}s\n{stack.logs()}") from None
