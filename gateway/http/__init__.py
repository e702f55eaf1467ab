"""The HTTP plumbing every API of the gateway shares, native or adapter.

    auth           API keys to tenants; an access log that redacts access_token
    limits         per-tenant limits: streams, replays, posts a second, active runs (429)
    problems       RFC 9457 problem+json for every error
    plumbing       JSON bodies and answers, integer parameters, END_SEQ, the readiness
                   503 (starting_middleware)
    ready          /readyz: the processor decides on every partition
    health         /healthz: liveness, the feed's write lag
    observability  /metrics, request metrics and server spans
"""
