"""The pure core: the rules of a thread, with no I/O.

    domain      commands, events, `ThreadState`, `Policy`, the run statuses
    thread      the decider: `decide(state, command, policy, known) -> events`,
                `evolve(state, event, policy) -> state`, the deadlines
    history     which message records an event writes, the message keys, the
                agent's context window
    branches    the history as a tree: heads, branch tips, parent links, the path
                a run answers from
    forks       regenerate, edit and switch branch, called by `thread`
    copies      a thread copied into a new one in parts (CopyThread, ImportHistory),
                called by `thread`
    keys        idempotency keys: fingerprints, expiry, the bounded map
    lifecycle   the lifecycle names on the wire, the records the processor mirrors,
                and `RunFate`, the one fold of what happened to a run
    journal     a run's step journal: entries, caps, merge
    interrupts  human-in-the-loop rules, called by `thread`
    ids         every derived id
    records     the dispatch, stream, message and dead-letter records
    reasons     the typed vocabulary: `CancelReason`, `FailureCode` (str-valued enums
                whose values are the wire's strings)

Time, ids and model output arrive inside commands. Nothing here imports Kafka
clients, rocksdict, aiohttp, fastavro, `streams.clock`, the wire, the runtime or
the gateway: import-linter's contracts in pyproject.toml fail `make lint` if it did.
"""
