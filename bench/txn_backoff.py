"""How long one processor transaction takes, and where (issue #22): begin, produce
to the output topics, send the input offsets, commit, as the table loop does at a
low rate, back to back or 5 ms apart. Each setting runs in turn, round after round,
in alternating order, on one broker, so the figures are side by side.

    python -m bench.txn_backoff [--rounds 4] [--transactions 100] [--topics 5]

Settings: the transactional producer's retry backoff and its linger. A transaction
begun right after the previous commit meets the coordinator still completing it
(CONCURRENT_TRANSACTIONS: the markers and the log's `CompleteCommit`) and is retried
after the backoff; a linger holds the produced records that long before the first
produce request, and the commit waits for them. The processor writes up to five
topics in a transaction (events, stream, threads, dispatch, messages): `--topics 5`.
Prints; writes nothing.
"""

from __future__ import annotations

import argparse
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from bench.common import broker, load_text, percentile

SETTINGS: dict[str, dict[str, int]] = {
    "backoff 10 ms doubling to 1 s, linger 2 (before)": {"retry.backoff.ms": 10, "linger.ms": 2},
    "backoff 2 ms doubling to 50 ms, linger 2 (before)": {
        "retry.backoff.ms": 2, "retry.backoff.max.ms": 50, "linger.ms": 2},
    "backoff 2 ms doubling to 50 ms, linger 0 (the default)": {
        "retry.backoff.ms": 2, "retry.backoff.max.ms": 50, "linger.ms": 0},
    "backoff 2 ms flat, linger 0": {"retry.backoff.ms": 2, "retry.backoff.max.ms": 2,
                                    "linger.ms": 0},
}
PHASES = ("produce", "send_offsets", "commit", "total")
WARMUP = 20


def transactions(bootstrap: str, source: str, outputs: list[str], config: dict[str, int],
                 count: int, gap_s: float) -> dict[str, list[float]]:
    """`count` transactions in a row, `gap_s` apart; each phase's milliseconds."""
    producer = Producer({"bootstrap.servers": bootstrap, "log_level": 3,
                         "transactional.id": f"bench-{uuid.uuid4().hex[:8]}",
                         "enable.idempotence": True, "transaction.timeout.ms": 10_000,
                         **config})
    producer.init_transactions(30)
    group = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                      "log_level": 3})
    took: dict[str, list[float]] = {phase: [] for phase in PHASES}
    for i in range(WARMUP + count):
        if gap_s:
            time.sleep(gap_s)
        start = time.perf_counter()
        producer.begin_transaction()
        for topic in outputs:
            producer.produce(topic, b"x" * 300, key=b"k%d" % (i % 4))
        produced = time.perf_counter()
        producer.send_offsets_to_transaction([TopicPartition(source, 0, i)],
                                             group.consumer_group_metadata(), 10)
        sent = time.perf_counter()
        producer.commit_transaction(10)
        end = time.perf_counter()
        if i >= WARMUP:
            for phase, ms in zip(PHASES, (produced - start, sent - produced, end - sent,
                                          end - start), strict=True):
                took[phase].append(ms * 1e3)
    group.close()
    producer.flush(10)
    return took


def main() -> None:
    """Run each setting in turn, `--rounds` times, and print the percentiles."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--transactions", type=int, default=100)
    parser.add_argument("--topics", type=int, default=5, help="output topics per transaction")
    args = parser.parse_args()
    with broker() as bootstrap:
        prefix = f"txb{uuid.uuid4().hex[:6]}."
        source = f"{prefix}in"
        outputs = [f"{prefix}out{n}" for n in range(args.topics)]
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.create_topics([NewTopic(t, 4, 1)
                                           for t in (source, *outputs)]).values():
            future.result()
        labels = list(SETTINGS)
        for rnd in range(1, args.rounds + 1):
            for label in labels if rnd % 2 else labels[::-1]:
                for gap_s in (0.0, 0.005):
                    took = transactions(bootstrap, source, outputs, SETTINGS[label],
                                        args.transactions, gap_s)
                    phases = ", ".join(f"{phase} {percentile(took[phase], 50):.1f}"
                                       for phase in PHASES)
                    print(f"round {rnd}, {label}, {'back to back' if not gap_s else '5 ms apart'}:"
                          f" p50 ms {phases}; total p90 {percentile(took['total'], 90):.1f}"
                          f" (load {load_text()})", flush=True)


if __name__ == "__main__":
    main()
