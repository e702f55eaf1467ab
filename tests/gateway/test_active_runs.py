"""The read store's index of active runs (`ActiveRuns`): whatever the order of
accepts, ends and wipes, its per-tenant counts over any share of partitions are what
a pass over every active run would count, and the store keeps them across a reopen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gateway.model.read_store import ActiveRuns, ReadStore
from streams.core.domain import ActiveRun, RunStatus, ThreadState
from streams.wire import Codec

PARTITIONS = 4
THREADS = [f"t{i}" for i in range(12)]
TENANTS = ["a", "b", "c"]


def _partition(thread_id: str) -> int:
    return int(thread_id[1:]) % PARTITIONS


_ops = st.lists(st.one_of(
    st.tuples(st.just("put"), st.sampled_from(THREADS), st.sampled_from(TENANTS),
              st.integers(0, 3)),
    st.tuples(st.just("pop"), st.sampled_from(THREADS)),
    st.tuples(st.just("clear"),)), max_size=60)
_shares = st.one_of(st.none(), st.sets(st.integers(0, PARTITIONS - 1)))


@given(_ops, _shares)
def test_the_counts_are_what_a_pass_over_every_run_counts(
        ops: list[tuple[Any, ...]], share: set[int] | None) -> None:
    """Random accepts, ends and wipes: counts, by-tenant counts and the listing over a
    random share equal a brute-force pass over a plain dict."""
    index, model = ActiveRuns(_partition), dict[str, tuple[str, str, int]]()
    for op in ops:
        if op[0] == "put":
            _, thread_id, tenant, run = op
            index.put(thread_id, (tenant, f"r{run}", run))
            model[thread_id] = (tenant, f"r{run}", run)
        elif op[0] == "pop":
            assert index.pop(op[1]) == model.pop(op[1], None)
        else:
            index.clear()
            model.clear()
    inside = {t: e for t, e in model.items() if share is None or _partition(t) in share}
    assert len(index) == len(model)
    assert dict(index.in_partitions(share)) == inside
    for tenant in TENANTS:
        assert index.count(tenant, share) == sum(1 for e in inside.values() if e[0] == tenant)
    expected: dict[str, int] = {}
    for tenant, _, _ in inside.values():
        expected[tenant] = expected.get(tenant, 0) + 1
    assert index.counts(share) == expected


def test_a_reopened_store_counts_its_stored_active_runs_by_partition(tmp_path: Path) -> None:
    """The stored active runs read back at open are placed by the store's partitioner."""
    codec = Codec()
    store = ReadStore(tmp_path / "s", {"p": 1}, codec=codec, partition_of=_partition)
    for n, thread_id in enumerate(THREADS[:6]):
        run = ActiveRun(f"run-{n}", f"m-{n}", 1, RunStatus.RUNNING, 1_000, 1_000, None)
        state = ThreadState(thread_id, TENANTS[n % 2], "t", 500, active_run=run)
        store.apply_state(thread_id.encode(), codec.encode_state(state))
    store.commit({})
    store.close()
    again = ReadStore(tmp_path / "s", {"p": 1}, codec=codec, partition_of=_partition)
    # t0..t5: partitions 0, 1, 2, 3, 0, 1; tenants a, b, a, b, a, b
    assert again.active.count("a", {0}) == 2
    assert again.active.count("b", {1, 3}) == 3
    assert again.active.counts({2}) == {"a": 1}
    assert again.active.count("a", None) == 3
    again.close()
