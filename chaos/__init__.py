"""The chaos program: `python -m chaos` (and `make chaos`).

    stack   its own broker, two processors, two workers, two gateways as processes
    load    threads posting through the gateways, SSE watchers that reconnect
    kills   the seeded SIGKILL schedule, restarts, recovery times
    audit   pure checks of what the clients saw against the topics and the API
    topic_audit  pure checks of what exactly-once adds: every record once, none aborted
    read    the transactional topics after the run, read_committed and read_uncommitted
    run     one run: start, load and kill, drain, collect, audit
    sse     HTTP with fail-over between gateways; the SSE frame reader

See docs/chaos.md.
"""
