"""The embedded broker with SASL/SCRAM-SHA-512 on its listener and an authorizer (its
own broker, not the session's): an unauthenticated client and a wrong password are
refused; the ACLs of docs/security.md (parsed from its block of kafka-acls commands)
let each role, given its credentials through the environment, do its work and no
more, over librdkafka (topic set-up, the processor's transactions) and over
aiokafka (the worker)."""

from __future__ import annotations

import re
import shlex
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # exported, not in its __all__
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from gateway.app import create_app
from streams.config import Settings
from streams.devtools.broker import EmbeddedKafka
from streams.kafka import liveness
from streams.kafka.clients import aiokafka_config, librdkafka_config
from streams.kafka.topics import ensure_topics
from streams.testing.process import ROOT, RoleProcess, wait_for

pytestmark = pytest.mark.kafka

PRINCIPALS = ("operator", "gateway", "processor", "worker", "connector", "analytics")


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedKafka]:
    """A SASL broker with ACLs enforced and only the operator as super user, for this
    module: one broker for the refusals and the roles (a second one, without an
    authorizer, cost a broker start and proved nothing the ACL tests do not)."""
    broker = EmbeddedKafka(tmp_path_factory.mktemp("acl-broker"), port=0,
                           scram_users={p: f"{p}-secret" for p in PRINCIPALS}, super_users=("operator",))
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
    """SASL settings become both librdkafka and aiokafka configurations; without a user, neither has them."""
    settings = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": "h:1", "THREADLINE_KAFKA_SASL_USERNAME": "u",
                                  "THREADLINE_KAFKA_SASL_PASSWORD": "p"})
    assert librdkafka_config(settings, **{"group.id": "g"}) == {
        "bootstrap.servers": "h:1", "reconnect.backoff.max.ms": 1_000, "enable.sparse.connections": False,
        "metadata.recovery.strategy": "none", "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "u", "sasl.password": "p", "group.id": "g"}
    assert aiokafka_config(settings) == {
        "bootstrap_servers": "h:1", "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "u", "sasl_plain_password": "p"}
    plain = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": "h:1", "THREADLINE_KAFKA_SASL_USERNAME": ""})
    assert librdkafka_config(plain) == {"bootstrap.servers": "h:1", "reconnect.backoff.max.ms": 1_000,
                                        "enable.sparse.connections": False,
                                        "metadata.recovery.strategy": "none"}
    assert aiokafka_config(plain) == {"bootstrap_servers": "h:1"}
    with pytest.raises(ValueError, match="THREADLINE_KAFKA_SASL_USERNAME"):
        Settings.from_env({"THREADLINE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                           "THREADLINE_KAFKA_SASL_USERNAME": ""})


def test_an_unauthenticated_client_is_refused(acl_broker: EmbeddedKafka) -> None:
    """A client without credentials cannot list topics on the SASL broker."""
    admin = AdminClient({"bootstrap.servers": acl_broker.bootstrap, "log_level": 0})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)


def test_a_wrong_password_is_refused_as_an_authentication_failure(acl_broker: EmbeddedKafka) -> None:
    """A wrong password is reported as an authentication failure."""
    errors: list[KafkaError] = []
    producer = Producer({"bootstrap.servers": acl_broker.bootstrap, "log_level": 0,
                         "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
                         "sasl.username": "worker", "sasl.password": "not-the-password",
                         "error_cb": errors.append})

    def refused() -> bool:
        producer.poll(0.2)  # serves error_cb
        return any(e.code() == KafkaError._AUTHENTICATION for e in errors)

    wait_for(refused, timeout=60, progress=lambda: len(errors))  # each try's error counts
    with pytest.raises(KafkaException):
        producer.list_topics(timeout=2)


# --- the ACLs of docs/security.md, applied verbatim to a broker with an authorizer ---

def _docs_acl_script() -> str:
    text = (ROOT / "docs" / "security.md").read_text()
    found = re.search(r"```sh\n(P=threadline\.\n.*?)```", text, re.S)
    assert found, "the ACL block of docs/security.md"
    return found.group(1)


_RESOURCES = {"--topic": ResourceType.TOPIC, "--group": ResourceType.GROUP,
              "--transactional-id": ResourceType.TRANSACTIONAL_ID}


def _docs_acls(prefix: str) -> list[AclBinding]:
    """The `acl ...` lines of the block (`kafka-acls.sh ... --add`), parsed strictly:
    a flag this parser does not know fails the test rather than being skipped."""
    script = _docs_acl_script().replace("\\\n", " ")
    bindings: list[AclBinding] = []
    for line in script.splitlines():
        if not line.startswith("acl "):
            continue
        words = shlex.split(line.replace("${P}", prefix).replace("$P", prefix))[1:]
        principals, operations, resources = [], [], []
        pattern = ResourcePatternType.LITERAL
        while words:
            flag = words.pop(0)
            if flag == "--cluster":
                resources.append((ResourceType.BROKER, "kafka-cluster"))
                continue
            value = words.pop(0)
            if flag == "--allow-principal":
                principals.append(value)
            elif flag == "--operation":
                operations.append(AclOperation[re.sub(r"(?<!^)(?=[A-Z])", "_", value).upper()])
            elif flag == "--resource-pattern-type":
                pattern = ResourcePatternType[value.upper()]
            elif flag in _RESOURCES:
                resources.append((_RESOURCES[flag], value))
            else:
                raise AssertionError(f"unknown kafka-acls flag {flag} in docs/security.md")
        assert principals and operations and resources, line
        bindings += [AclBinding(kind, name, pattern, who, "*", op, AclPermissionType.ALLOW)
                     for who in principals for op in operations for kind, name in resources]
    return bindings


def _apply_docs_acls(broker: EmbeddedKafka, prefix: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 0, **broker.client_security})
    wanted = _docs_acls(prefix)
    for binding, done in admin.create_acls(wanted, request_timeout=30).items():
        assert done.result(30) is None, binding
    # The controller has them; the broker's authorizer applies them when it replays the
    # metadata log, a moment later. DescribeAcls answers from that authorizer: wait
    # until it shows them all (a produce at once was refused once, under load).
    # None matches any name, principal or host (the stubs type them as str only).
    any_name: Any = None
    every = AclBindingFilter(ResourceType.ANY, any_name, ResourcePatternType.ANY, any_name,
                             any_name, AclOperation.ANY, AclPermissionType.ANY)

    shown: set[AclBinding] = set()

    def applied() -> bool:
        shown.update(b for b in admin.describe_acls(every, request_timeout=10).result(10)
                     if b in wanted)
        return len(shown) == len(set(wanted))

    wait_for(applied, timeout=30, progress=lambda: len(shown))  # while more are applied


def _produce_error(settings: Settings, user: str, topic: str) -> KafkaError | None:
    """The delivery error of one record written to `topic` as `user`, or None."""
    outcome: list[KafkaError | None] = []
    producer = Producer({"bootstrap.servers": settings.bootstrap, "log_level": 0,
                         "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
                         "sasl.username": user, "sasl.password": f"{user}-secret",
                         "message.timeout.ms": 20_000,
                         "on_delivery": lambda err, _msg: outcome.append(err)})
    producer.produce(topic, b"x", b"k")
    producer.flush(30)
    assert len(outcome) == 1
    return outcome[0]


def test_the_documented_acls_let_each_role_do_its_work_and_no_more(
        acl_broker: EmbeddedKafka, tmp_path: Path) -> None:
    """The ACLs in the docs let each role write and read what it needs, and refuse the rest."""
    operator = _env(acl_broker, tmp_path, "operator", "operator-secret")
    settings = Settings.from_env(operator)
    ensure_topics(settings)  # the operator creates the topics
    _apply_docs_acls(acl_broker, settings.topic_prefix)
    topics = settings.topics
    # Who may write commands: the four roles; analytics may not.
    for user in ("gateway", "processor", "worker", "connector"):
        assert _produce_error(settings, user, topics.commands) is None, user
    denied = _produce_error(settings, "analytics", topics.commands)
    assert denied is not None and denied.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # Nobody but the processor writes decisions.
    for user in ("gateway", "worker", "connector", "analytics"):
        error = _produce_error(settings, user, topics.events)
        assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, user
    assert _produce_error(settings, "processor", topics.events) is None
    # The worker does its work with exactly its ACLs (topics verified, group joined).
    worker_env = {**operator, "THREADLINE_KAFKA_SASL_USERNAME": "worker",
                  "THREADLINE_KAFKA_SASL_PASSWORD": "worker-secret"}
    worker = RoleProcess("worker", worker_env, tmp_path / "worker.log").start()
    try:
        worker.wait_for_log("assigned dispatch partitions", timeout=120)
        assert worker.alive(), worker.tail()
    finally:
        worker.stop()
    # And the processor with its own: transactions, its group, restoring both tables.
    processor_env = {**operator, "THREADLINE_KAFKA_SASL_USERNAME": "processor",
                     "THREADLINE_KAFKA_SASL_PASSWORD": "processor-secret"}
    processor = RoleProcess("processor", processor_env, tmp_path / "processor.log").start()
    try:
        processor.wait_for_log("assigned [", timeout=120)
        assert processor.alive(), processor.tail()
    finally:
        processor.stop()


def test_the_roles_that_join_a_group_read_the_brokers_minimum_session_under_their_acls(
        acl_broker: EmbeddedKafka, tmp_path: Path) -> None:
    """The processor, the worker and the connector may describe the brokers' configuration
    (docs/security.md), so each reads `group.min.session.timeout.ms` (1 s here) and asks
    for it rather than a session the broker would refuse; analytics, which joins no
    group, is granted nothing of the kind, and keeps its setting."""
    operator = _env(acl_broker, tmp_path, "operator", "operator-secret")
    ensure_topics(Settings.from_env(operator))
    _apply_docs_acls(acl_broker, operator["THREADLINE_TOPIC_PREFIX"])
    for user, expected_ms in (("processor", 1000), ("worker", 1000), ("connector", 1000),
                              ("analytics", 500)):
        liveness._broker_minimum.cache_clear()  # read once per process in a role
        settings = Settings.from_env({**operator, "THREADLINE_KAFKA_SASL_USERNAME": user,
                                      "THREADLINE_KAFKA_SASL_PASSWORD": f"{user}-secret",
                                      "THREADLINE_SESSION_TIMEOUT_S": "0.5"})
        assert liveness.session_timeout_ms(settings) == expected_ms, user


async def test_the_gateway_runs_under_its_documented_acls(acl_broker: EmbeddedKafka, tmp_path: Path) -> None:
    """The gateway in-process with its own principal: it starts (topic check, read
    model, feed, command bus), its health probe describes the broker and the groups,
    and a post is written to commands (no processor here: it stays pending)."""
    operator = _env(acl_broker, tmp_path, "operator", "operator-secret")
    ensure_topics(Settings.from_env(operator))
    _apply_docs_acls(acl_broker, operator["THREADLINE_TOPIC_PREFIX"])
    settings = Settings.from_env({**operator, "THREADLINE_KAFKA_SASL_USERNAME": "gateway",
                                  "THREADLINE_KAFKA_SASL_PASSWORD": "gateway-secret",
                                  "THREADLINE_API_KEYS": "k=t", "THREADLINE_DECISION_TIMEOUT_S": "1"})
    server = TestServer(create_app(settings), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(server.make_url("/healthz")) as response:
                report = await response.json()
            assert report["broker"]["ok"], report
            assert all("error" not in g for g in report["groups"].values()), report
            async with session.post(server.make_url("/v1/threads"), json={"title": "acl"},
                                    headers={"Authorization": "Bearer k"}) as response:
                body = await response.json()
            assert response.status == 202 and body["status"] == "pending", body
    finally:
        await server.close()
