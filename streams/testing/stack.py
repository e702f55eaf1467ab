"""Starting a Threadline stack for a test, the chaos program or a benchmark: a Kafka
broker, a fresh topic prefix, the topics, role processes, and a wait until the
gateway says it is healthy."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp

from streams.config import Settings
from streams.devtools.broker import EmbeddedKafka
from streams.kafka.clients import librdkafka_config
from streams.kafka.topics import ensure_topics
from streams.testing.process import RoleProcess, wait_for

__all__ = ["SUITE_TOPIC_STALL_S", "broker_bootstrap", "fresh_env", "running_roles", "start_roles",
           "unique_prefix", "wait_for_group", "wait_healthy", "wait_healthy_async"]


SUITE_TOPIC_STALL_S = "90"  # THREADLINE_TOPIC_STALL_S of test stacks (streams/kafka/topics.py)


@contextmanager
def broker_bootstrap(folder: Path, *, docker: bool = False, remove: bool = False) -> Iterator[str]:
    """A broker's bootstrap address: `KAFKA_BOOTSTRAP_SERVERS` if set; else (with `docker`)
    a testcontainers Kafka when a Docker engine answers; else the embedded broker with
    its data in `folder` (removed afterwards with `remove`)."""
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        yield os.environ["KAFKA_BOOTSTRAP_SERVERS"]
        return
    if docker and _docker_answers():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer("apache/kafka:3.9.1").with_kraft() as kafka:
            yield kafka.get_bootstrap_server()
        return
    broker = EmbeddedKafka(folder, port=0)
    broker.start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()
        if remove:
            shutil.rmtree(folder, ignore_errors=True)


def _docker_answers() -> bool:
    if os.environ.get("THREADLINE_NO_DOCKER"):
        return False
    try:
        import docker

        docker.from_env(timeout=2).ping()
        return True
    except Exception:
        return False


def unique_prefix(letter: str, digits: int = 10) -> str:
    """A topic prefix no other run uses: `letter`, random hex digits, a dot."""
    return f"{letter}{uuid.uuid4().hex[:digits]}."


def fresh_env(bootstrap: str, folder: Path, *, prefix: str | None = None, partitions: int = 4,
              **extra: str) -> dict[str, str]:
    """The environment of one stack: the broker, a fresh topic prefix, its data folder,
    short timeouts (the session timeout is the shipped default); `extra` settings on top."""
    return {
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "THREADLINE_TOPIC_PREFIX": prefix or unique_prefix("t"),
        "THREADLINE_PARTITIONS": str(partitions),
        "THREADLINE_DATA_DIR": str(folder / "data"),
        # Brokers on a shared, loaded test machine can go long without getting anywhere
        # (GC, a starved JVM): the topic waits fail after this long without progress.
        "THREADLINE_TOPIC_STALL_S": SUITE_TOPIC_STALL_S,
        **extra,
    }


def start_roles(env: Mapping[str, str], folder: Path, roles: Iterable[str],
                **options: Any) -> list[RoleProcess]:
    """Create the topics of `env`, then start each role as a process logging to
    `folder`/<role>.log."""
    ensure_topics(Settings.from_env(env))
    return [RoleProcess(role, env, folder / f"{role}.log", **options).start() for role in roles]


@contextmanager
def running_roles(env: Mapping[str, str], folder: Path, roles: Iterable[str],
                  **options: Any) -> Iterator[list[RoleProcess]]:
    """`start_roles`, and every role stopped (the last started first) on the way out."""
    procs: list[RoleProcess] = []
    try:
        procs = start_roles(env, folder, roles, **options)
        yield procs
    finally:
        for proc in reversed(procs):
            proc.stop()


def wait_healthy(url: str, timeout: float = 90) -> None:
    """Wait until GET `url` (a gateway's /healthz) answers 200, while it makes progress:
    fail once `timeout` seconds went by without an answer not seen before (a
    component up, a group member more, the read model further along)."""
    seen: set[bytes] = set()
    since = time.monotonic()
    body = b""
    while time.monotonic() - since < timeout:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
                body = response.read()
        except urllib.error.HTTPError as exc:  # 503: not yet, and why
            body = exc.read()
        except (urllib.error.URLError, OSError) as exc:
            body = str(exc).encode()
        if body not in seen:
            seen.add(body)
            since = time.monotonic()
        time.sleep(0.3)
    raise AssertionError(f"{url} not healthy, no progress in {timeout}s: {body.decode(errors='replace')}")


async def wait_healthy_async(session: aiohttp.ClientSession, url: str, timeout: float = 90) -> None:
    """Wait until GET `url` (a gateway's /healthz) answers 200, without blocking the
    loop, while it makes progress (see `wait_healthy`)."""
    seen: set[str] = set()
    since = time.monotonic()
    body: Any = None
    while time.monotonic() - since < timeout:
        try:
            async with session.get(url) as response:
                body = await response.json()
                if response.status == 200:
                    return
        except aiohttp.ClientError as exc:
            body = str(exc)
        if repr(body) not in seen:
            seen.add(repr(body))
            since = time.monotonic()
        await asyncio.sleep(0.3)
    raise AssertionError(f"gateway not healthy, no progress in {timeout}s: {body}")


def wait_for_group(settings: Settings, group: str, members: int, timeout: float = 60) -> None:
    """Wait until consumer group `group` is stable with `members` members, while it
    makes progress: fail once its description (state, members, their assignments)
    showed nothing not seen before for `timeout` seconds."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(librdkafka_config(settings, log_level=0))
    last: list[object] = [None]

    def ready() -> bool:
        try:
            found = admin.describe_consumer_groups([group], request_timeout=5)[group].result()
        except Exception as exc:
            last[0] = type(exc).__name__
            return False
        last[0] = (found.state.name, sorted(
            (m.member_id, sorted((tp.topic, tp.partition) for tp in m.assignment.topic_partitions))
            for m in found.members))
        return len(found.members) == members and found.state.name == "STABLE"

    try:
        wait_for(ready, timeout, interval=0.3, progress=lambda: last[0])
    except AssertionError:
        raise AssertionError(f"group {group}: not stable with {members} members, no progress in "
                             f"{timeout}s; last seen {last[0]}") from None
