"""deploy/haproxy/threadline.lua in Debian's HAProxy: a request about a thread goes
to the gateway owning the thread's partition (issue #26: no forwarding where the
balancer knows the owner map), and the script's partition is the gateways' own."""

from __future__ import annotations

import re
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.kafka import partition_for
from streams.devtools.broker import free_port
from streams.testing.haproxy import HAProxy
from streams.testing.process import logs_of, wait_for
from tests.cluster import test_behind_haproxy as behind_haproxy
from tests.cluster.conftest import KEY, Cluster, _need_haproxy, running_cluster


@pytest.fixture(scope="module")
def lone_haproxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HAProxy]:
    """HAProxy with the script and no gateway up: only its partition probe answers."""
    _need_haproxy()
    haproxy = HAProxy(free_port(), [free_port()], tmp_path_factory.mktemp("haproxy"),
                      owner_routing=True).start()
    try:
        wait_for(lambda: _partition(haproxy, "t", 1) == 0, progress=logs_of(haproxy.log))
        yield haproxy
    finally:
        haproxy.stop()


def _partition(haproxy: HAProxy, thread_id: str, partitions: int) -> int | None:
    url = (f"{haproxy.base}/_threadline/partition/{urllib.parse.quote(thread_id, safe='')}"
           f"?partitions={partitions}")
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.read())
    except OSError:
        return None


@settings(max_examples=300)
@given(st.one_of(st.uuids().map(str), st.text(st.characters(codec="utf-8"), min_size=1,
                                                 max_size=40)),
       st.sampled_from([1, 2, 3, 7, 12, 64]))
def test_the_scripts_partition_of_a_thread_is_kafkas(lone_haproxy: HAProxy, thread_id: str,
                                                      partitions: int) -> None:
    """Kafka's murmur2 in Lua, on the id as a request path carries it (percent-encoded),
    puts every thread in the partition the gateways and the processor use."""
    assert _partition(lone_haproxy, thread_id, partitions) == partition_for(thread_id, partitions)


@pytest.fixture
def owner_routed(kafka_bootstrap: str, tmp_path: Path) -> Iterator[Cluster]:
    """Three gateways behind HAProxy running the script, which has polled each of
    them twice since they split the partitions."""
    with running_cluster(kafka_bootstrap, tmp_path, owner_routing=True) as running:
        first = running.haproxy.owner_polls()
        wait_for(lambda: running.haproxy.owner_polls() >= first + 2 * len(running.gateways),
                 progress=lambda: running.haproxy.owner_polls())
        yield running


def _servers(cluster: Cluster, path: str) -> list[int]:
    """The gateway each `GET path` went to, in HAProxy's log order."""
    lines = behind_haproxy._haproxy_lines(cluster, f"GET {path} ")
    return [int(m.group(1)) for line in lines if (m := re.search(r" gateways/g(\d+) ", line))]


@pytest.mark.kafka
def test_requests_about_a_thread_reach_its_owner(owner_routed: Cluster) -> None:
    """Once the script has read the gateways' shares, each request about a thread is
    sent to the gateway owning its partition, and the stream is served there: none
    of the gateways forwards it."""
    cluster = owner_routed
    status, thread = cluster.call("POST", "/v1/threads", {"title": "routed"})
    assert status == 201, thread
    thread_id = thread["thread_id"]
    owner = cluster.owner(thread_id)
    path = f"/v1/threads/{thread_id}"

    # The script polls the gateways once a second: a request before its map has the
    # split may go anywhere. Three rounds of polls after the split, it has it.
    first = cluster.haproxy.owner_polls()

    def routed() -> bool:
        assert cluster.haproxy.owner_polls() - first <= 3 * len(cluster.gateways), \
            f"not sent to its owner after 3 rounds of polls:\n{cluster.logs()}"
        assert cluster.call("GET", path)[0] == 200
        return _servers(cluster, path)[-1] == owner
    wait_for(routed, interval=0.2, progress=lambda: cluster.haproxy.owner_polls())
    forwarded = _forwarded(cluster)  # before the map had it, a request may have been
    for _ in range(6):
        assert cluster.call("GET", path)[0] == 200
    assert _servers(cluster, path)[-6:] == [owner] * 6, cluster.logs()

    status, accepted = cluster.call("POST", f"{path}/user_message", {"input_text": "hello"})
    assert status == 202, accepted
    stream = urllib.request.Request(f"{cluster.base}{path}/stream",
                                    headers={"Authorization": f"Bearer {KEY}"})
    events = []
    with urllib.request.urlopen(stream, timeout=120) as response:
        for line in response:  # a thread's stream stays open for its next run
            if line.startswith(b"event: "):
                events.append(line)
                if line == b"event: done\n":
                    break
    assert events[-1] == b"event: done\n", events
    assert _servers(cluster, f"{path}/stream") == [owner], cluster.logs()
    assert _forwarded(cluster) == forwarded  # none since: each request reached the owner


def _forwarded(cluster: Cluster) -> float:
    """The streams and requests the gateways forwarded to an owner, all told."""
    total = 0.0
    for port in cluster.ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
        total += sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                     if line.startswith(("threadline_gateway_forwarded_streams_total",
                                         "threadline_gateway_forwarded_requests_total")))
    return total


@pytest.mark.kafka
def test_a_browser_eventsource_sees_every_run_whole_across_owner_kills_routed_by_owner(
        owner_routed: Cluster) -> None:
    """test_behind_haproxy's Chromium EventSource test through the script: each run's
    owner is killed with SIGKILL while the browser's stream is on it (the script sent
    it there), so the browser reconnects through HAProxy (to another gateway, which
    forwards, until the map names the partition's new owner): every run arrives whole,
    no event twice."""
    behind_haproxy.test_a_browser_eventsource_sees_every_run_whole_across_owner_kills(
        owner_routed)
