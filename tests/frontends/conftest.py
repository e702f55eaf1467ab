"""One process stack for the module's tests (tests/frontends/stack.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.frontends.stack import ProcessStack, process_stack


@pytest.fixture(scope="module")
def processes(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> \
        Iterator[ProcessStack]:
    """Processor, worker and gateway processes with tests/frontends/stack.py's settings."""
    with process_stack(kafka_bootstrap, tmp_path_factory.mktemp("frontends")) as stack:
        yield stack
