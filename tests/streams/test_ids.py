"""The derived ids are on the wire and in store keys: pin known values."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streams.core.ids import (
    answer_message_id_for,
    derived_envelope_id,
    idempotent_message_id_for,
    outbox_id_for,
    regenerate_run_id_for,
    run_id_for,
    workflow_id_for,
)

# Values computed by the code before the ids moved to streams.ids.
KNOWN = [
    (run_id_for("t-1", "m-1"), "ec420887-3217-5fb4-8f77-1eb59777503c"),
    (run_id_for("a:b", "c"), "8ac68d3c-0fb3-5130-b7c0-c4907b0e5ec2"),
    (run_id_for("a", "b:c"), "6a7baf18-679d-5eb1-b50a-fc0f5748f039"),
    (run_id_for("t\udc80", "m"), "cc4a3968-54f2-5a14-ae7f-29e0529f746c"),
    (answer_message_id_for("r-1"), "f5557651-b501-5306-bd11-9f3a923b5c8b"),
    (workflow_id_for("t-1"), "agent-t-1"),
    (idempotent_message_id_for("acme", "t-1", "key-1"), "98b5d9ad-69f5-5312-9737-9e08590bbde7"),
    (derived_envelope_id("env-1", 0), "70d60a1a-4842-540c-9c32-6baf1e87abf4"),
    (derived_envelope_id("env-1", 3), "54f64009-355c-5d87-9378-9ce4f90ce2c3"),
    (outbox_id_for("run-1", "answer"), "27cecc51-390f-5456-8ef3-5a833692568c"),
    # Since branches (issue #30): a regenerate's run, named by its idempotency key.
    (regenerate_run_id_for("t-1", "key-1"), "2ba31c42-b408-5f77-a417-fc3fb5dd1816"),
]


def test_known_ids_do_not_change() -> None:
    """Shows each derived id still has the value pinned when the ids moved to streams.ids."""
    for got, want in KNOWN:
        assert got == want


@given(st.text(), st.text())
def test_run_id_is_a_uuid5_and_never_raises(thread_id: str, message_id: str) -> None:
    """Shows a run id is a version-5 uuid for any thread and message id text, and never raises."""
    run_id = run_id_for(thread_id, message_id)
    assert len(run_id) == 36 and run_id[14] == "5"


@given(st.text(), st.integers(min_value=0, max_value=1000))
def test_envelope_ids_differ_by_index(parent: str, index: int) -> None:
    """Shows envelope ids derived from one parent differ from one index to the next."""
    assert derived_envelope_id(parent, index) != derived_envelope_id(parent, index + 1)
