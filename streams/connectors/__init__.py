"""Connectors: Threadline where people talk (a Slack workspace) and where systems listen
(a webhook), with the promises of Threadline's own API. See docs/connectors.md.

Inbound, at least once and durable first: a signed chat event becomes a turn on
the commands topic (acks=all) before the chat is answered 200; a redelivery
derives the same message id and the processor decides it once.

Outbound, exactly once through an outbox: every post, edit, reaction and webhook
is first an entry of the thread's outbox (a compacted topic keyed by thread id),
written in a Kafka transaction with the input offsets; it is fenced (`delivering`)
in a transaction before each call and marked `delivered` after; a post found
without a result is reconciled against the chat's history (message metadata
carries the outbox id) before it is made again.

Modules, pure first:

    ids            chat address <-> thread id, chat message <-> message id, outbox ids
    outbox         the outbox entries, `plan` (events in, entries out), transitions
    slack_events   Slack request signatures and turns
    audit          the audit record (its Avro bytes: streams.wire.connector)
    calls          call outcomes and a blocking HTTP helper
    slack_api      the Slack Web API subset
    webhook        the webhook sink and its signature
    delivery       choosing, making and recording calls (no Kafka)
    relay          the consumer group and its transactions
    inbound        the aiohttp Events API endpoint
    topics         the outbox and audit topics
    role           `threadline connector`
"""
