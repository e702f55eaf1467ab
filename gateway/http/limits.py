"""Per-tenant limits: what one tenant may cost the gateway and the workers.

Four limits (`streams.config.GatewayLimits`, 0 turns one off), each refused with
`429` problem+json and `Retry-After`:

    streams       open SSE streams of the tenant: in a gateway group, those here and
                  those the other gateways last wrote in their claims (every session
                  timeout, `gateway.cluster.owners`); else in this gateway process
    replays       Kafka replays the tenant's streams run at once, in this process
                  (each is a consumer of its own reading a partition)
    posts         POSTs a second, a token bucket per tenant in this process
                  (`post_burst` at once, then `posts_per_s`); in a gateway group
                  each of the N live gateways takes 1/N of both
    active runs   runs in progress across the deployment, from the threads read
                  model: a user message beyond the cap is refused, so one tenant
                  cannot fill every worker slot

Replays are counted per process: N gateways admit up to N times as many. Streams
are counted across a group: a gateway adds the tenant's streams at the others, as
they last wrote them, to its own, so the cap holds across the group but for the
streams opened elsewhere since (a session timeout's worth, 2 s by default). A
stream counts where its client connected: a gateway serving another's forwarded
stream (the hop) takes no slot for it. Posts are split instead: the load
balancer spreads a tenant's posts over the group, so each gateway's 1/N share of the
rate adds up to the tenant's limit, with no round trip per post (Envoy's local rate
limit, divided; a balancer with affinity would send one tenant to fewer gateways and
so admit less than the limit).
Active runs come from the read model, which lags the processor by a few
milliseconds, so posts racing each other can pass the cap by the number in flight.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Middleware

from gateway.http.auth import HOPPED, TENANT
from gateway.http.problems import Handler, Problem
from gateway.model.read_model import ReadModel
from streams.config import GatewayLimits

__all__ = ["TenantLimiter", "post_rate_middleware", "tenant_active_runs"]

STREAM_RETRY_S = 5  # a stream slot frees when one of the tenant's streams ends
REPLAY_RETRY_S = 1  # replays take a moment
COPY_RETRY_S = 2  # a copy takes a transaction or two
ACTIVE_RUN_RETRY_S = 5  # a run takes seconds


def _too_many(slug: str, detail: str, retry_after_s: int, limit: float) -> Problem:
    return Problem(429, slug, detail, headers={"Retry-After": str(max(1, retry_after_s))},
                   limit=limit)


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float  # when `tokens` was right


class TenantLimiter:
    """The per-tenant counters of one gateway process. Not thread-safe: the event loop's."""

    def __init__(self, limits: GatewayLimits,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.clock = clock
        self.streams: Counter[str] = Counter()
        self.replays: Counter[str] = Counter()
        self.copies: Counter[str] = Counter()
        self._buckets: dict[str, _Bucket] = {}
        # How many gateways share the tenants' posts (the gateway group's live
        # members, `gateway.cluster.owners`): each takes that share of the rate.
        self.sharing: Callable[[], int] = lambda: 1
        # The tenant's open streams at the group's other gateways.
        self.streams_elsewhere: Callable[[str], int] = lambda tenant: 0

    @contextmanager
    def stream(self, tenant: str) -> Iterator[None]:
        """Hold one of the tenant's stream slots for the `with` block, or raise 429."""
        with self._slot(self.streams, tenant, self.limits.streams_per_tenant,
                        "too-many-streams", "open streams", STREAM_RETRY_S,
                        self.streams_elsewhere):
            yield

    @contextmanager
    def replay(self, tenant: str) -> Iterator[None]:
        """Hold one of the tenant's replay slots for the `with` block, or raise 429."""
        with self._slot(self.replays, tenant, self.limits.replays_per_tenant,
                        "too-many-replays", "replays from Kafka at once", REPLAY_RETRY_S):
            yield

    @contextmanager
    def copy(self, tenant: str) -> Iterator[None]:
        """Hold one of the tenant's copy slots for the `with` block, or raise 429."""
        with self._slot(self.copies, tenant, self.limits.copies_per_tenant,
                        "too-many-copies", "thread copies in flight", COPY_RETRY_S):
            yield

    @contextmanager
    def _slot(self, held: Counter[str], tenant: str, limit: int, slug: str, what: str,
              retry_after_s: int,
              elsewhere: Callable[[str], int] = lambda tenant: 0) -> Iterator[None]:
        if limit > 0 and held[tenant] >= limit:
            raise _too_many(slug, f"the tenant has {held[tenant]} {what}, the limit is {limit}",
                            retry_after_s, limit)
        if limit > 0 and (others := elsewhere(tenant)) and held[tenant] + others >= limit:
            raise _too_many(slug, f"the tenant has {held[tenant] + others} {what} across the "
                            f"gateways ({others} at others), the limit is {limit}",
                            retry_after_s, limit)
        held[tenant] += 1
        try:
            yield
        finally:
            held[tenant] -= 1
            if held[tenant] <= 0:
                del held[tenant]

    def post(self, tenant: str) -> None:
        """Take one token from the tenant's bucket, or raise 429 saying when one is back."""
        limit = self.limits.posts_per_s
        if limit <= 0:
            return
        gateways = max(1, self.sharing())
        rate, burst = limit / gateways, max(1, math.ceil(self.limits.post_burst / gateways))
        now = self.clock()
        bucket = self._buckets.get(tenant)
        if bucket is None:
            bucket = self._buckets[tenant] = _Bucket(float(burst), now)
        bucket.tokens = min(float(burst), bucket.tokens + (now - bucket.at) * rate)
        bucket.at = now
        if bucket.tokens < 1.0:
            wait = math.ceil((1.0 - bucket.tokens) / rate)
            across = f", across {gateways} gateways" if gateways > 1 else ""
            raise _too_many("too-many-posts", f"more than {limit:g} posts a second "
                            f"(bursts of {self.limits.post_burst}{across})", wait, limit)
        bucket.tokens -= 1.0

    def admit_run(self, tenant: str, active: int) -> None:
        """Raise 429 if a tenant with `active` runs in progress may not start another."""
        limit = self.limits.active_runs_per_tenant
        if limit > 0 and active >= limit:
            raise _too_many("too-many-active-runs", f"the tenant has {active} runs in "
                            f"progress, the limit is {limit}", ACTIVE_RUN_RETRY_S, limit)


def tenant_active_runs(read_model: ReadModel, tenant: str) -> int:
    """The tenant's runs in progress, as far as the read model has read (the one
    place that knows how the read model counts them)."""
    return read_model.active_run_count(tenant)


def post_rate_middleware(limiter: TenantLimiter) -> Middleware:
    """Every POST of an authenticated tenant takes a token (after `auth_middleware`)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        tenant = request.get(TENANT)
        # A request another gateway sent on was counted there.
        if request.method == "POST" and tenant is not None and not request.get(HOPPED):
            limiter.post(tenant)
        return await handler(request)

    return middleware
