"""The connector's metrics, read from what it already keeps at each scrape.

The connector counts its calls in `ConnectorStats` (also served as JSON at
`GET /stats`) and holds its committed outboxes in the relay's tables; this collector
turns both into Prometheus families when scraped, so the relay's path is unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import REGISTRY, Collector

from streams.connectors.outbox import OutboxStatus
from streams.connectors.relay import Relay
from streams.connectors.stats import ConnectorStats

__all__ = ["ConnectorCollector", "observe_connector"]

POST_RESULTS = {"delivered": "delivered", "refused": "refused", "retries": "retried",
                "rate_limited": "rate_limited", "not_sent": "not_sent"}
INBOUND = {"inbound_accepted": "accepted", "inbound_ignored": "ignored",
           "inbound_refused": "refused", "inbound_failed": "failed"}


class ConnectorCollector(Collector):
    """Prometheus families of one connector process."""

    def __init__(self, stats: ConnectorStats, relay: Relay) -> None:
        self.stats, self.relay = stats, relay

    def collect(self) -> Iterator[Metric]:
        """The families, from a snapshot of the counters and the outbox tables."""
        counts = self.stats.snapshot()
        posts = CounterMetricFamily("threadline_connector_posts",
                                    "Chat posts and webhook calls, by result", labels=["result"])
        for name, result in POST_RESULTS.items():
            posts.add_metric([result], counts[name])
        yield posts
        yield CounterMetricFamily("threadline_connector_calls", "Chat and webhook calls made",
                                  value=counts["calls"])
        reconciled = CounterMetricFamily(
            "threadline_connector_reconciliations",
            "Posts in doubt reconciled against the chat: found (adopted) or not found",
            labels=["result"])
        reconciled.add_metric(["adopted"], counts["adopted"])
        reconciled.add_metric(["not_found"], counts["reconciled_not_found"])
        yield reconciled
        yield CounterMetricFamily("threadline_connector_fenced_writes",
                                  "Transactions refused for a stale generation (this instance was deposed)",
                                  value=counts["fenced"])
        yield CounterMetricFamily("threadline_connector_transaction_aborts", "Transactions aborted",
                                  value=counts["aborted"])
        inbound = CounterMetricFamily("threadline_connector_inbound_events",
                                      "Chat events received, by result", labels=["result"])
        for name, result in INBOUND.items():
            inbound.add_metric([result], counts[name])
        yield inbound
        yield self._outbox()

    def _outbox(self) -> GaugeMetricFamily:
        held = dict.fromkeys((s.value for s in OutboxStatus), 0)
        # Read from the scrape's thread while the relay runs: copy, and skip a table that
        # changed under the copy (the next scrape sees it).
        for table in list(self.relay.tables.values()):
            try:
                outboxes = list(table.values())
            except RuntimeError:
                continue
            for outbox in outboxes:
                for entry in outbox.entries:
                    held[entry.status.value] += 1
        family = GaugeMetricFamily("threadline_connector_outbox_entries",
                                   "Outbox entries held, by status", labels=["status"])
        for status, count in held.items():
            family.add_metric([status], count)
        return family


def observe_connector(stats: ConnectorStats, relay: Relay) -> None:
    """Serve the connector's families from the default registry (once per process)."""
    REGISTRY.register(ConnectorCollector(stats, relay))
