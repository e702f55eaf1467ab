"""The embedded broker with SASL/SCRAM-SHA-512 on its listener (its own broker, not
the session's): an unauthenticated client and a wrong password are refused; a
role given its credentials through the environment works, over librdkafka
(topic set-up) and over aiokafka (the worker)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from streams.broker import EmbeddedKafka
from streams.config import Settings
from streams.kafka_security import aiokafka_config, librdkafka_config
from streams.topics import ensure_topics
from tests.kafka_helpers import RoleProcess, wait_for

pytestmark = pytest.mark.kafka

USERS = {"operator": "operator-secret", "worker": "worker-secret"}


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedKafka]:
    broker = EmbeddedKafka(tmp_path_factory.mktemp("sasl-broker"), port=0, scram_users=USERS)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def _env(broker: EmbeddedKafka, folder: Path, user: str, password: str) -> dict[str, str]:
    return {
        "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
        "THREADLINE_TOPIC_PREFIX": f"s{uuid.uuid4().hex[:10]}.",
        "THREADLINE_PARTITIONS": "2",
        "THREADLINE_DATA_DIR": str(folder / "data"),
        "THREADLINE_SESSION_TIMEOUT_S": "6",
        "THREADLINE_KAFKA_SASL_USERNAME": user,
        "THREADLINE_KAFKA_SASL_PASSWORD": password,
    }


def test_the_settings_become_both_client_libraries_configurations(tmp_path: Path) -> None:
    settings = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": "h:1", "THREADLINE_KAFKA_SASL_USERNAME": "u",
                                  "THREADLINE_KAFKA_SASL_PASSWORD": "p"})
    assert librdkafka_config(settings, **{"group.id": "g"}) == {
        "bootstrap.servers": "h:1", "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "u", "sasl.password": "p", "group.id": "g"}
    assert aiokafka_config(settings) == {
        "bootstrap_servers": "h:1", "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "u", "sasl_plain_password": "p"}
    plain = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": "h:1", "THREADLINE_KAFKA_SASL_USERNAME": ""})
    assert librdkafka_config(plain) == {"bootstrap.servers": "h:1"}
    assert aiokafka_config(plain) == {"bootstrap_servers": "h:1"}
    with pytest.raises(ValueError, match="THREADLINE_KAFKA_SASL_USERNAME"):
        Settings.from_env({"THREADLINE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                           "THREADLINE_KAFKA_SASL_USERNAME": ""})


def test_an_unauthenticated_client_is_refused(sasl_broker: EmbeddedKafka) -> None:
    admin = AdminClient({"bootstrap.servers": sasl_broker.bootstrap, "log_level": 0})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)


def test_a_wrong_password_is_refused_as_an_authentication_failure(sasl_broker: EmbeddedKafka) -> None:
    errors: list[KafkaError] = []
    producer = Producer({"bootstrap.servers": sasl_broker.bootstrap, "log_level": 0,
                         "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
                         "sasl.username": "worker", "sasl.password": "not-the-password",
                         "error_cb": errors.append})

    def refused() -> bool:
        producer.poll(0.2)  # serves error_cb
        return any(e.code() == KafkaError._AUTHENTICATION for e in errors)

    wait_for(refused, timeout=60)
    with pytest.raises(KafkaException):
        producer.list_topics(timeout=2)


def test_roles_with_credentials_work(sasl_broker: EmbeddedKafka, tmp_path: Path) -> None:
    operator = _env(sasl_broker, tmp_path, "operator", USERS["operator"])
    settings = Settings.from_env(operator)
    specs = ensure_topics(settings)  # librdkafka: admin and probe consumer
    assert {s.name for s in specs} == set(settings.topics.all())
    worker_env = {**operator, "THREADLINE_KAFKA_SASL_USERNAME": "worker",
                  "THREADLINE_KAFKA_SASL_PASSWORD": USERS["worker"]}
    worker = RoleProcess("worker", worker_env, tmp_path / "worker.log").start()
    try:  # aiokafka: the worker's producer, group consumer and lifecycle reader
        wait_for(lambda: "assigned dispatch partitions" in worker.tail(200) or not worker.alive(),
                 timeout=120)
        assert worker.alive(), worker.tail()
    finally:
        worker.stop()
