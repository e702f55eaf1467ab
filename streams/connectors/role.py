"""`threadline connector`: the inbound endpoint and the outbound relay in one process.

The relay runs on its own thread (blocking confluent-kafka and HTTP calls, as
the processor does); the inbound endpoint is an aiohttp app on the main thread's
event loop. SIGTERM or SIGINT stops both; a relay that dies (a fatal Kafka
error, such as a newer instance with the same transactional id) ends the
process with status 1, and a restart recovers everything from Kafka.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading

from aiohttp import web

from streams.config import Settings
from streams.connectors.config import ConnectorConfig, instance_id_for
from streams.connectors.delivery import Calls
from streams.connectors.http_client import HttpClient
from streams.connectors.inbound import create_inbound_app
from streams.connectors.relay import Relay
from streams.connectors.slack_api import SlackApi
from streams.connectors.stats import ConnectorStats
from streams.connectors.topics import ensure_connector_topics
from streams.connectors.webhook import WebhookSink
from streams.observability.connector import observe_connector
from streams.wire import Codec

__all__ = ["run_connector"]

log = logging.getLogger("threadline.connector")


def run_connector(settings: Settings) -> int:
    """The `threadline connector` role: relay outbox calls and serve Slack events until stopped."""
    config = ConnectorConfig.from_env(settings)
    instance_id = instance_id_for(settings)
    ensure_connector_topics(settings, config.audit_retention_ms)
    stats = ConnectorStats()
    chat = SlackApi(config.slack_api_url, config.bot_token, config.call_timeout_s,
                    HttpClient(config.concurrency)) if config.chat_enabled else None
    webhook = WebhookSink(config.webhook_url, config.webhook_secret, config.call_timeout_s,
                          HttpClient(config.concurrency)) if config.webhook_enabled else None
    codec = Codec.from_settings(settings)  # one for the relay and the inbound endpoint
    relay = Relay(settings, config, stats, instance_id, Calls(config, stats, chat, webhook), codec)
    observe_connector(stats, relay)  # Prometheus families (docs/operations.md)
    if not config.signing_secret:
        log.warning("THREADLINE_SLACK_SIGNING_SECRET is unset: every chat event is refused")
    stop = threading.Event()
    failed = threading.Event()

    def relay_main() -> None:
        try:
            relay.run(stop)
        except BaseException:
            log.exception("the relay stopped")
            failed.set()
        finally:
            stop.set()

    thread = threading.Thread(target=relay_main, name="relay")
    thread.start()
    try:
        asyncio.run(_serve(settings, config, stats, instance_id, codec, stop))
    finally:
        stop.set()
        thread.join(30)
    return 1 if failed.is_set() else 0


async def _serve(settings: Settings, config: ConnectorConfig, stats: ConnectorStats,
                 instance_id: str, codec: Codec, stop: threading.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = web.AppRunner(create_inbound_app(settings, config, stats, instance_id, codec),
                           access_log=None)
    await runner.setup()
    await web.TCPSite(runner, config.http_host, config.http_port).start()
    log.info("connector %s: Slack events on http://%s:%d/slack/events", instance_id,
             config.http_host, config.http_port)
    try:
        while not stop.is_set():
            await asyncio.sleep(0.1)
    finally:
        await runner.cleanup()
