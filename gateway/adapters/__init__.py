"""Protocol adapters, for clients that already exist: each a package mounted as an
aiohttp sub-app, so auth, readiness, limits and problem+json apply by construction.

    ai_sdk     the Vercel AI SDK's chat endpoints under /v1/ai
    langgraph  the LangGraph Platform runs API under /langgraph
    console    /console, the web console, and its /v1/console endpoint
    demo       /demo, a one-page watcher of a thread's SSE stream

Each speaks to the gateway through its public API only (`gateway.live.run_stream`,
`gateway.api.rest`, `gateway.http.plumbing`, ...); none imports another, and nothing
outside `gateway.app` imports an adapter (import-linter's contracts in pyproject.toml).
"""
