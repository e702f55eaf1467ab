"""How long one processor transaction takes, by the transactional producer's retry
backoff (issue #22): begin, produce to two topics, send the input offsets, commit,
back to back as the table loop does at a low rate. Each setting runs in turn,
round after round, on one broker, so the figures are side by side.

    python -m bench.txn_backoff [--rounds 2] [--transactions 150]

A transaction begun right after the previous commit meets the coordinator still
completing it (CONCURRENT_TRANSACTIONS) and is retried after the backoff; this shows
what the backoff costs. Prints; writes nothing.
"""

from __future__ import annotations

import argparse
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from bench.common import broker, load_text, percentile

SETTINGS: dict[str, dict[str, int]] = {
    "10 ms, doubling to 1 s (before)": {"retry.backoff.ms": 10},
    "2 ms, doubling to 50 ms (the default)": {"retry.backoff.ms": 2, "retry.backoff.max.ms": 50},
    "2 ms flat": {"retry.backoff.ms": 2, "retry.backoff.max.ms": 2},
}
WARMUP = 20


def transactions(bootstrap: str, topics: tuple[str, str, str], backoff: dict[str, int],
                 count: int) -> list[float]:
    """`count` transactions in a row; each one's milliseconds."""
    source, out, mirror = topics
    producer = Producer({"bootstrap.servers": bootstrap, "log_level": 3,
                         "transactional.id": f"bench-{uuid.uuid4().hex[:8]}",
                         "enable.idempotence": True, "linger.ms": 0,
                         "transaction.timeout.ms": 10_000, **backoff})
    producer.init_transactions(30)
    group = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                      "log_level": 3})
    took: list[float] = []
    for i in range(WARMUP + count):
        start = time.perf_counter()
        producer.begin_transaction()
        producer.produce(out, b"x" * 200, key=b"k%d" % (i % 4))
        producer.produce(mirror, b"y" * 200, key=b"k%d" % (i % 4))
        producer.send_offsets_to_transaction([TopicPartition(source, 0, i)],
                                             group.consumer_group_metadata(), 10)
        producer.commit_transaction(10)
        took.append((time.perf_counter() - start) * 1e3)
    group.close()
    return took[WARMUP:]


def main() -> None:
    """Run each setting in turn, `--rounds` times, and print the percentiles."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--transactions", type=int, default=150)
    args = parser.parse_args()
    with broker() as bootstrap:
        prefix = f"txb{uuid.uuid4().hex[:6]}."
        names = (f"{prefix}in", f"{prefix}out", f"{prefix}mirror")
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.create_topics([NewTopic(t, 4, 1) for t in names]).values():
            future.result()
        for rnd in range(1, args.rounds + 1):
            for label, backoff in SETTINGS.items():
                took = transactions(bootstrap, names, backoff, args.transactions)
                print(f"round {rnd}, {label}: p50 {percentile(took, 50):.1f} ms, "
                      f"p90 {percentile(took, 90):.1f} ms, max {max(took):.1f} ms "
                      f"(load {load_text()})", flush=True)


if __name__ == "__main__":
    main()
