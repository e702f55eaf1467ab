"""A restore and a transaction left open on the changelog, on a real broker.

A deposed writer's open transaction hides every record committed after it from
read_committed readers until it ends. A restore that read only to it lost the new
owner's own commits (chaos seed 3105), so a restore waits for it to end.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from streams.config import Settings
from streams.kafka.clients import librdkafka_config, table_producer_config
from streams.kafka.restore import ChangelogReader, restore_tables
from streams.kafka.state_store import PartitionStore, TableStores
from streams.testing.process import wait_for

pytestmark = pytest.mark.kafka


def _producer(settings: Settings, transactional_id: str) -> Producer:
    producer = Producer(table_producer_config(settings, transactional_id,
                                              transactional_id=transactional_id, linger_ms=0))
    producer.init_transactions(30)
    return producer


def _apply(store: PartitionStore, key: bytes, value: bytes | None, offset: int) -> None:
    if value is None:
        store.delete(key, offset)
    else:
        store.put(key, value, offset)


def test_a_restore_waits_for_a_deposed_writers_open_transaction_and_misses_no_commit(
        settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Shows: a deposed writer's transaction is open on the changelog, and the new
    owner committed a row after it. The owner's own store (its checkpoint past the
    open transaction) and a fresh store both restore only once the transaction has
    ended, and both hold the row; the owner's store is not wiped. Reading only to the
    last stable offset, the owner's store was wiped and both came back without it."""
    caplog.set_level(logging.INFO, "threadline.kafka.restore")
    topic = f"{settings.topic_prefix}restore-open"
    admin = AdminClient(librdkafka_config(settings))
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result()
    deposed = _producer(settings, f"{settings.topic_prefix}deposed")
    deposed.begin_transaction()
    deposed.produce(topic, b"never", b"thread-1", partition=0)
    assert deposed.flush(30) == 0  # on the broker, its transaction open
    owner = _producer(settings, f"{settings.topic_prefix}owner")
    owner.begin_transaction()
    written: list[int | None] = []
    owner.produce(topic, b"row", b"thread-2", partition=0,
                  on_delivery=lambda _err, msg: written.append(msg.offset()))
    owner.commit_transaction(30)
    assert written == [1]  # after the open transaction's record

    own = TableStores(tmp_path / "own", "t")
    store = own.open(0)
    store.put(b"thread-2", b"row", 1)
    store.commit()  # the owner's store: checkpoint 2, past the open transaction (0)
    assert store.checkpoint == 2
    own.close(0)
    fresh = TableStores(tmp_path / "fresh", "t")
    restored: dict[str, dict[bytes, bytes]] = {}

    def restore(name: str, tables: TableStores) -> None:
        with ChangelogReader(settings, f"{settings.topic_prefix}restore-{name}") as reader:
            stores = restore_tables(reader, tables, topic, [0], _apply)
        restored[name] = dict(stores[0].items())

    threads = [threading.Thread(target=restore, args=args) for args in
               (("own", own), ("fresh", fresh))]
    for thread in threads:
        thread.start()
    def said() -> tuple[str, ...]:
        """What the restores logged so far, each line once: a wait that repeats its
        warning is no progress."""
        return tuple(sorted({r.getMessage() for r in caplog.records}))

    wait_for(lambda: len(restored) == 2 or sum(
        "waiting for transactions open at [0]@0" in r.getMessage() for r in caplog.records) >= 2,
        timeout=60, progress=said)
    assert not restored  # both wait (not: both restored, without the row)
    deposed.abort_transaction(30)  # what its restart, a fence or the coordinator does
    wait_for(lambda: not any(thread.is_alive() for thread in threads),
             timeout=60, progress=lambda: (said(), len(restored)))
    assert restored == {"own": {b"thread-2": b"row"}, "fresh": {b"thread-2": b"row"}}
    assert "changelog records from 2" in caplog.text  # the owner's store went on from its checkpoint
    assert own.open(0).checkpoint >= 2
    own.close_all()
    fresh.close_all()
