"""Live streams: a thread's or a run's events, replayed from Kafka, then live.

    run_stream  the one in-process stream API every protocol serves from
    feed        the one stream-topic consumer per process, per-thread windows,
                subscribers
    replay      short-lived per-request reads of positions older than the window
    sse         pure: frames, the superseded-execution filter (RunTracker)
    tokens      pure: event ids as signed resume tokens; the one place a client's
                is read
    streaming   the native SSE endpoints, and the SSE writer (`serve`, `Framing`)
"""
