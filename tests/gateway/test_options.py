"""The gateway's `Options` are reachable by THREADLINE_GATEWAY_* variables, checked at load."""

from __future__ import annotations

import pytest

from gateway.keys import Options, OptionsEnv
from streams.env import SettingsError


def test_unset_variables_give_the_dataclass_defaults() -> None:
    """Nothing set: the same options as `Options()`, so the defaults live in one place."""
    read = OptionsEnv.read({})
    assert Options(**{name: getattr(read, name) for name in OptionsEnv.model_fields}) == Options()


def test_each_knob_is_read_from_its_variable() -> None:
    """A variable sets its knob; serve_while_loading is the caller's."""
    options = Options.from_env({"THREADLINE_GATEWAY_KEEPALIVE_S": "1.5",
                                "THREADLINE_GATEWAY_WINDOW_EVENTS": "3",
                                "THREADLINE_GATEWAY_STORE_NAME": "gw-a"}, serve_while_loading=True)
    assert (options.keepalive_s, options.window_events, options.store_name) == (1.5, 3, "gw-a")
    assert options.serve_while_loading


def test_a_refused_value_names_its_variable() -> None:
    """A queue of no events is refused, by name."""
    with pytest.raises(SettingsError, match="THREADLINE_GATEWAY_QUEUE_LIMIT"):
        Options.from_env({"THREADLINE_GATEWAY_QUEUE_LIMIT": "0"})
