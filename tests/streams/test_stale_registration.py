"""A restarted embedded node withdraws its dead predecessor's registration at the
first refusal, instead of waiting out the session (streams.devtools.stale_registration),
and never leaves its own new registration withdrawn."""

from __future__ import annotations

import time
from pathlib import Path

from streams.devtools.broker import EmbeddedKafka
from streams.devtools.stale_registration import (
    MARGIN_S,
    Action,
    RegistrationScan,
    RegistrationWatch,
    unregister_broker,
)
from streams.testing.process import logs_of, wait_for

ACTIVE = ("[2026-12-06 00:12:28,244] INFO [QuorumController id=1] Becoming the active "
          "controller at epoch 2, next write offset 162. (org.apache.kafka.controller.QuorumController)")
REFUSED = ("[2026-12-06 00:12:28,360] INFO [BrokerLifecycleManager id=1] Unable to register "
           "broker 1 because the controller returned error DUPLICATE_BROKER_REGISTRATION "
           "(kafka.server.BrokerLifecycleManager)")
REMOVED = ("[2026-12-06 00:12:28,407] INFO [QuorumController id=1] Replayed "
           "UnregisterBrokerRecord(brokerId=1, brokerEpoch={epoch}) "
           "(org.apache.kafka.controller.ClusterControlManager)")
REGISTERED = ("[2026-12-06 00:12:28,495] INFO [BrokerLifecycleManager id=1] Successfully "
              "registered broker 1 with broker epoch {epoch} (kafka.server.BrokerLifecycleManager)")
ACTIVE_AT = time.mktime((2026, 12, 6, 0, 12, 28, 0, 0, -1)) + 0.244  # ACTIVE's stamp, local


def scan(*lines: str, now: float = ACTIVE_AT + 0.1, session_s: float = 3.0) -> list[Action]:
    """The actions a scan of a node 1 with this session takes on `lines`, read at `now`."""
    s = RegistrationScan(node_id=1, session_s=session_s)
    return [s.feed(line, now) for line in lines]


def test_a_refusal_soon_after_activation_withdraws_then_the_old_epoch_goes() -> None:
    """The normal course: refused soon after the controller's activation, withdrawn,
    the predecessor's epoch removed, the new one registered."""
    assert scan(ACTIVE, REFUSED, REMOVED.format(epoch=6), REGISTERED.format(epoch=268)) == \
        [Action.WATCH, Action.WITHDRAW, Action.WATCH, Action.DONE]
    # In either order: the controller's line and the node's may interleave.
    assert scan(ACTIVE, REFUSED, REGISTERED.format(epoch=268), REMOVED.format(epoch=6))[-1] \
        is Action.DONE


def test_the_new_incarnation_withdrawn_is_killed_to_register_afresh() -> None:
    """The epoch removed is the one just registered: the node must start again."""
    assert scan(ACTIVE, REFUSED, REGISTERED.format(epoch=268), REMOVED.format(epoch=268))[-1] \
        is Action.KILL


def test_a_refusal_too_close_to_the_sessions_end_is_left_to_it() -> None:
    """With less than MARGIN_S of the old session left, a try might register before
    the withdrawal lands: nothing is sent."""
    late = ACTIVE_AT + 3.0 - MARGIN_S + 0.01
    assert scan(ACTIVE, REFUSED, now=late) == [Action.WATCH, Action.DONE]
    assert scan(ACTIVE, REFUSED, now=late - 0.02) == [Action.WATCH, Action.WITHDRAW]


def test_no_activation_seen_no_withdrawal() -> None:
    """Without the controller's activation (another node's controller) the session's
    end is unknown: nothing is sent."""
    assert scan(REFUSED) == [Action.DONE]


def test_a_clean_registration_ends_the_watch_and_other_nodes_lines_are_ignored() -> None:
    """A node registered at its first try (a clean restart) needs nothing."""
    assert scan(ACTIVE, REGISTERED.format(epoch=9)) == [Action.WATCH, Action.DONE]
    other = REFUSED.replace("broker 1 ", "broker 2 ")
    assert scan(ACTIVE, other, REGISTERED.replace("broker 1", "broker 2")) == [Action.WATCH] * 3


def test_an_activation_dated_by_a_clock_ahead_counts_from_when_it_was_read() -> None:
    """Should the JVM's time zone differ from ours, its stamp may lie hours ahead: the
    earlier of it and the moment it was read is taken."""
    s = RegistrationScan(node_id=1, session_s=3.0)
    s.feed(ACTIVE, ACTIVE_AT - 3600)
    assert s.activated_at == ACTIVE_AT - 3600
    assert s.feed(REFUSED, ACTIVE_AT - 3600 + 2.5) is Action.DONE


def test_the_answer_decides_whether_to_read_on() -> None:
    """An error answer means nothing was removed; no answer may mean it was."""
    s = RegistrationScan(node_id=1, session_s=3.0)
    assert s.answered(0) is Action.WATCH
    assert s.answered(None) is Action.WATCH  # no answer: it may have been removed
    assert s.answered(69) is Action.DONE  # BROKER_ID_NOT_REGISTERED: nothing was


def test_a_killed_node_registers_at_its_first_try_after_the_refusal(tmp_path: Path) -> None:
    """A real node killed and started on its data: the launcher's watch withdraws the
    dead node's registration (its epoch, not the new one's) and the node registers
    after one refusal, where it used to be refused until the 3 s session ran out."""
    broker = EmbeddedKafka(tmp_path / "node", port=0).start()
    try:
        assert broker.registration_watch is None  # a first start has nothing to withdraw
        broker.kill()
        offset = broker.log_file.stat().st_size
        broker.start()
        watch = broker.registration_watch
        assert watch is not None
        wait_for(lambda: not watch.is_alive(), timeout=60, progress=logs_of(broker.log_file))
        assert watch.actions == [Action.WITHDRAW, Action.DONE]
        assert watch.scan.removed_epoch is not None
        assert watch.scan.removed_epoch != watch.scan.registered_epoch
        text = broker.log_file.read_bytes()[offset:].decode()
        assert text.count("DUPLICATE_BROKER_REGISTRATION (kafka") == 1, text[-4000:]
        broker.wait_ready()
    finally:
        broker.stop()


def test_the_safety_net_kills_a_node_whose_own_registration_went(tmp_path: Path) -> None:
    """Were the withdrawal ever to land after the new incarnation registered, the node
    would heartbeat into errors for good; the watch reads which epoch went and kills
    the JVM, so that its restart registers afresh. Forced here on a live node."""
    broker = EmbeddedKafka(tmp_path / "node", port=0).start()
    try:
        assert broker.process is not None
        watch = RegistrationWatch(broker.log_file, 0, broker.process, broker.controller_port,
                                  broker.node_id, session_s=3.0)
        watch.scan.withdrawn = True  # as if it had sent the request
        assert unregister_broker(broker.controller_port, broker.node_id) == 0
        watch.start()
        wait_for(lambda: not watch.is_alive(), timeout=60, progress=logs_of(broker.log_file))
        assert watch.actions == [Action.KILL]
        assert broker.process.wait() != 0
        broker.process = None
        broker.start()  # no registration left to wait for: it registers at once
        again = broker.registration_watch
        assert again is not None
        wait_for(lambda: not again.is_alive(), timeout=60, progress=logs_of(broker.log_file))
        assert again.actions == [Action.DONE]
        broker.wait_ready()
    finally:
        broker.stop()
