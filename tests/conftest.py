"""One real Kafka broker for the whole test session.

`KAFKA_BOOTSTRAP_SERVERS` if set; otherwise a testcontainers Kafka when a Docker
engine answers; otherwise the embedded broker from Maven jars. Each test gets
its own topic prefix and data folder, so tests share the broker, not state.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from streams.config import Settings


def _docker_answers() -> bool:
    if os.environ.get("THREADLINE_NO_DOCKER"):
        return False
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env(timeout=2).ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        yield os.environ["KAFKA_BOOTSTRAP_SERVERS"]
        return
    if _docker_answers():
        from testcontainers.kafka import KafkaContainer  # type: ignore[import-untyped]

        with KafkaContainer("apache/kafka:3.9.1").with_kraft() as kafka:
            yield kafka.get_bootstrap_server()
        return
    from streams.broker import EmbeddedKafka

    broker = EmbeddedKafka(tmp_path_factory.mktemp("broker"), port=0)
    broker.start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


SettingsFactory = Callable[..., Settings]


@pytest.fixture
def test_env(kafka_bootstrap: str, tmp_path: Path) -> dict[str, str]:
    """Environment of this test's Threadline processes: the session broker, a
    fresh topic prefix and data folder, and short timeouts."""
    return {
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "THREADLINE_TOPIC_PREFIX": f"t{uuid.uuid4().hex[:10]}.",
        "THREADLINE_PARTITIONS": "4",
        "THREADLINE_DATA_DIR": str(tmp_path / "data"),
        "THREADLINE_SESSION_TIMEOUT_S": "6",
    }


@pytest.fixture
def make_settings(test_env: dict[str, str]) -> SettingsFactory:
    def make(**env: str) -> Settings:
        test_env.update(env)
        return Settings.from_env(test_env)

    return make


@pytest.fixture
def settings(make_settings: SettingsFactory) -> Settings:
    return make_settings()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Fast, pure tests first: a broken core fails the run before any broker work.
    items.sort(key=lambda i: 1 if i.get_closest_marker("kafka") or i.get_closest_marker("chaos") else 0)


with contextlib.suppress(Exception):
    from hypothesis import settings as hsettings

    hsettings.register_profile("ci", deadline=None, derandomize=True)
    if os.environ.get("CI"):
        hsettings.load_profile("ci")
