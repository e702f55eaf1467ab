"""The session timeout a role asks for, against a real broker: the setting, or the
broker's `group.min.session.timeout.ms` when that is higher (a join below it would
be refused again and again). The session's embedded broker sets the minimum to 1 s."""

from __future__ import annotations

import logging

import pytest

from streams.kafka import liveness
from tests.conftest import SettingsFactory

pytestmark = pytest.mark.kafka

EMBEDDED_MINIMUM_MS = 1000  # streams/devtools/broker.py


@pytest.fixture(autouse=True)
def _read_the_broker_again() -> None:
    liveness._broker_minimum.cache_clear()  # read once per process in a role


def test_a_session_below_the_brokers_minimum_is_raised_to_it_with_a_warning(
        make_settings: SettingsFactory, caplog: pytest.LogCaptureFixture) -> None:
    """Shows the broker's minimum is read and used, and the warning names the setting."""
    settings = make_settings(THREADLINE_SESSION_TIMEOUT_S="0.5")
    with caplog.at_level(logging.WARNING, logger="threadline.kafka.liveness"):
        assert liveness.session_timeout_ms(settings) == EMBEDDED_MINIMUM_MS
    assert "THREADLINE_SESSION_TIMEOUT_S is 0.5 s, below the broker's" in caplog.text


def test_a_session_at_or_above_the_minimum_is_kept(make_settings: SettingsFactory,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """Shows the setting is asked for as it is when the broker allows it, silently."""
    with caplog.at_level(logging.WARNING, logger="threadline.kafka.liveness"):
        assert liveness.session_timeout_ms(make_settings(THREADLINE_SESSION_TIMEOUT_S="2")) == 2000
        assert liveness.session_timeout_ms(make_settings(THREADLINE_SESSION_TIMEOUT_S="1")) == 1000
    assert caplog.text == ""


def test_an_unreachable_broker_leaves_the_setting_as_it_is(make_settings: SettingsFactory) -> None:
    """Shows a minimum that cannot be read (here: no broker) is no reason not to start."""
    settings = make_settings(THREADLINE_SESSION_TIMEOUT_S="0.5",
                             KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:1")
    original = liveness.TIMEOUT_S
    liveness.TIMEOUT_S = 1.0
    try:
        assert liveness.session_timeout_ms(settings) == 500
    finally:
        liveness.TIMEOUT_S = original


@pytest.mark.parametrize(("session_ms", "interval_ms"),
                         [(2000, 400), (1000, 200), (300, 100), (6000, 1000), (45_000, 1000)])
def test_heartbeats_come_five_times_a_session_within_bounds(session_ms: int, interval_ms: int) -> None:
    """Shows the heartbeat interval: a fifth of the session, between 0.1 and 1 s."""
    assert liveness.heartbeat_interval_ms(session_ms) == interval_ms
