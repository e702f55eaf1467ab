"""The per-tenant limiter alone: slots, the token bucket, the active-run cap. (Counting
a tenant's active runs is the read model's: tests/gateway/test_gateway_limits.py.)"""

from __future__ import annotations

import pytest

from gateway.http.limits import TenantLimiter
from gateway.http.problems import Problem
from streams.config import GatewayLimits, Settings
from tests.manual_clock import ManualClock


def _refused(problem: pytest.ExceptionInfo[Problem], slug: str, retry_after: int) -> None:
    assert problem.value.status == 429 and problem.value.slug == slug
    assert problem.value.headers["Retry-After"] == str(retry_after)


def test_stream_and_replay_slots_are_counted_per_tenant_and_given_back() -> None:
    """Stream and replay slots are counted per tenant and given back when the block ends or raises."""
    limiter = TenantLimiter(GatewayLimits(streams_per_tenant=2, replays_per_tenant=1))
    with limiter.stream("a"), limiter.stream("a"):
        with pytest.raises(Problem) as refused, limiter.stream("a"):
            pass
        _refused(refused, "too-many-streams", 5)
        with limiter.stream("b"):  # another tenant has its own
            assert limiter.streams == {"a": 2, "b": 1}
        with limiter.replay("a"):
            with pytest.raises(Problem) as refused, limiter.replay("a"):
                pass
            _refused(refused, "too-many-replays", 1)
    assert not limiter.streams and not limiter.replays
    with limiter.stream("a"), limiter.stream("a"):  # given back, even after a refusal
        pass
    # A slot is given back when the block raises.
    with pytest.raises(RuntimeError), limiter.stream("a"):
        raise RuntimeError("the client went away")
    assert not limiter.streams


def test_copy_slots_are_counted_per_tenant_and_given_back() -> None:
    """Thread copies in flight are counted per tenant (429 too-many-copies past the
    limit) and their slots given back when the block ends or raises."""
    limiter = TenantLimiter(GatewayLimits(copies_per_tenant=2))
    with limiter.copy("a"), limiter.copy("a"):
        with pytest.raises(Problem) as refused, limiter.copy("a"):
            pass
        _refused(refused, "too-many-copies", 2)
        with limiter.copy("b"):
            assert limiter.copies == {"a": 2, "b": 1}
    with pytest.raises(RuntimeError), limiter.copy("a"):
        raise RuntimeError("the wait ended")
    assert not limiter.copies
    assert Settings.from_env({"THREADLINE_TENANT_MAX_COPIES": "5"}).gateway.limits.copies_per_tenant == 5


def test_zero_turns_a_limit_off() -> None:
    """A limit of zero means no limit."""
    limiter = TenantLimiter(GatewayLimits(streams_per_tenant=0, replays_per_tenant=0,
                                          posts_per_s=0, active_runs_per_tenant=0))
    with limiter.stream("a"), limiter.stream("a"), limiter.replay("a"), limiter.replay("a"):
        for _ in range(1000):
            limiter.post("a")
        limiter.admit_run("a", 10_000)


def test_posts_take_tokens_from_a_bucket_that_refills_at_the_rate() -> None:
    """Posts draw from a per-tenant token bucket that refills at the rate up to the burst."""
    clock = ManualClock(1000.0)
    limiter = TenantLimiter(GatewayLimits(posts_per_s=2.0, post_burst=3), clock)
    for _ in range(3):
        limiter.post("a")
    with pytest.raises(Problem) as refused:
        limiter.post("a")
    _refused(refused, "too-many-posts", 1)
    limiter.post("b")  # another tenant's bucket is full
    clock.now += 0.5  # one token back
    limiter.post("a")
    with pytest.raises(Problem):
        limiter.post("a")
    clock.now += 100  # refills up to the burst, no more
    for _ in range(3):
        limiter.post("a")
    with pytest.raises(Problem):
        limiter.post("a")
    slow = TenantLimiter(GatewayLimits(posts_per_s=0.1, post_burst=1), clock)
    slow.post("a")
    with pytest.raises(Problem) as refused:
        slow.post("a")
    _refused(refused, "too-many-posts", 10)  # when a whole token is back


def test_active_runs_beyond_the_cap_are_refused() -> None:
    """A run past the tenant's active-run cap is refused with Retry-After 5."""
    limiter = TenantLimiter(GatewayLimits(active_runs_per_tenant=2))
    limiter.admit_run("a", 0)
    limiter.admit_run("a", 1)
    with pytest.raises(Problem) as refused:
        limiter.admit_run("a", 2)
    _refused(refused, "too-many-active-runs", 5)


def test_limits_come_from_the_environment() -> None:
    """Every gateway limit is read from its environment variable, with defaults."""
    limits = Settings.from_env({
        "THREADLINE_TENANT_MAX_STREAMS": "3", "THREADLINE_TENANT_MAX_REPLAYS": "2",
        "THREADLINE_TENANT_POSTS_PER_S": "0.5", "THREADLINE_TENANT_POST_BURST": "4",
        "THREADLINE_TENANT_MAX_ACTIVE_RUNS": "6", "THREADLINE_REPLAY_MAX_RECORDS": "7"}).gateway.limits
    assert (limits.streams_per_tenant, limits.replays_per_tenant, limits.posts_per_s,
            limits.post_burst, limits.active_runs_per_tenant, limits.replay_max_records) == \
        (3, 2, 0.5, 4, 6, 7)
    assert Settings.from_env({}).gateway.limits == GatewayLimits()


def test_gateways_of_a_group_each_take_their_share_of_a_tenants_post_rate() -> None:
    """With N gateways sharing the posts (a load balancer spreads them), each admits
    1/N of the rate and of the burst, so the tenant's whole is its limit; the refusal
    names the tenant's limit, not the share."""
    clock = ManualClock(1000.0)
    gateways = [TenantLimiter(GatewayLimits(posts_per_s=6.0, post_burst=6), clock)
                for _ in range(3)]
    for limiter in gateways:
        limiter.sharing = lambda: 3
    admitted = 0
    for n in range(30):  # round robin, all at once: the burst of 6 in all
        try:
            gateways[n % 3].post("a")
            admitted += 1
        except Problem as refused:
            assert refused.status == 429 and "6 posts a second" in str(refused.detail) \
                and "across 3 gateways" in str(refused.detail)
    assert admitted == 6
    for second in range(10):  # then 6 a second in all, 2 at each
        clock.now += 1.0
        assert sum(_try(gateways[n % 3]) for n in range(30)) == 6, second
    gateways[0].sharing = lambda: 1  # the others left: the whole rate here
    clock.now += 1.0
    assert sum(_try(gateways[0]) for _ in range(30)) == 6


def _try(limiter: TenantLimiter) -> bool:
    try:
        limiter.post("a")
    except Problem:
        return False
    return True


def test_a_tenants_streams_at_the_other_gateways_count_against_its_cap() -> None:
    """In a group, a stream is admitted against the tenant's streams here plus those
    the other gateways last wrote; the refusal says so. Another tenant's, and this
    one's once the others' close, are not held back."""
    elsewhere = {"a": 2}
    limiter = TenantLimiter(GatewayLimits(streams_per_tenant=3))
    limiter.streams_elsewhere = lambda tenant: elsewhere.get(tenant, 0)
    with limiter.stream("a"):
        with pytest.raises(Problem) as refused, limiter.stream("a"):
            pass
        assert refused.value.status == 429
        assert "3 open streams across the gateways (2 at others)" in str(refused.value.detail)
        with limiter.stream("b"), limiter.stream("b"), limiter.stream("b"):
            assert limiter.streams == {"a": 1, "b": 3}
        elsewhere["a"] = 0
        with limiter.stream("a"), limiter.stream("a"):
            assert limiter.streams["a"] == 3
    assert limiter.streams == {}
