"""Every setting does something: each `Settings` field is read by the code outside
`streams/config.py` (that each variable is documented: test_settings_doc.py); a bad
value is refused at load, naming its variable; defaults are the runtime objects'."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from streams.agents.builtin import BuiltinAgent
from streams.agents.example import create
from streams.agents.openai import OpenAIAgent
from streams.config import (
    GatewayEnv,
    GatewayLimits,
    GatewaySettings,
    KafkaEnv,
    PolicyEnv,
    ProcessorSettings,
    Settings,
    SettingsError,
    WorkerSettings,
)
from streams.core.domain import Policy
from streams.observability.settings import ObservabilitySettings

REPO = Path(__file__).resolve().parents[2]
CODE = [p for folder in ("streams", "gateway", "chaos", "bench") for p in (REPO / folder).rglob("*.py")
        if p != REPO / "streams" / "config.py"]


@pytest.mark.parametrize("name", [f.name for kind in (Settings, ProcessorSettings, WorkerSettings,
                                                       GatewaySettings)
                                  for f in dataclasses.fields(kind)])
def test_every_setting_is_read_by_the_code(name: str) -> None:
    """Every field of Settings and of each role's own settings is used somewhere in the code."""
    used = re.compile(rf"\.{name}\b")
    assert any(used.search(p.read_text()) for p in CODE), f"Settings.{name} is read and never used"


def test_the_worker_and_the_agents_read_no_environment() -> None:
    """Shows no module of the worker or the agents reads the environment; settings come to them."""
    for folder in ("worker", "agents"):
        for path in (REPO / "streams" / folder).rglob("*.py"):
            text = path.read_text()
            assert "os.environ" not in text and "getenv" not in text, path


@pytest.mark.parametrize(("name", "value"), [
    ("THREADLINE_PROCESSING_GUARANTEE", "twice"),
    ("THREADLINE_PARTITIONS", "0"),
    ("THREADLINE_PARTITIONS", "twelve"),
    ("THREADLINE_SESSION_TIMEOUT_S", "-1"),
    ("THREADLINE_MAX_ATTEMPTS", "0"),
    ("THREADLINE_HTTP_PORT", "70000"),
    ("THREADLINE_API_KEYS", "no-tenant"),
    ("THREADLINE_KAFKA_SECURITY_PROTOCOL", "TLS"),
    ("THREADLINE_METRICS", "maybe"),
])
def test_a_refused_value_names_its_variable(name: str, value: str) -> None:
    """A value out of type or bounds stops `from_env` with an error that names the variable."""
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({name: value})


def test_each_role_reads_its_own_section() -> None:
    """Shows each role's settings come from its own variables, with their defaults."""
    settings = Settings.from_env({"THREADLINE_WORKER_CONCURRENCY": "3", "THREADLINE_HTTP_PORT": "9",
                                  "THREADLINE_MIGRATION_BATCH": "0", "THREADLINE_AGENT_WORDS": "4"})
    assert settings.worker.concurrency == 3 and settings.worker.extra == {"THREADLINE_AGENT_WORDS": "4"}
    assert settings.gateway.http_port == 9 and settings.gateway.limits == GatewayLimits()
    assert settings.processor.migration_batch == 1  # 0 is taken as 1, as before
    assert settings.processor.max_record_bytes is None  # the topics' own limit


def test_the_guarantee_is_one_of_two() -> None:
    """THREADLINE_PROCESSING_GUARANTEE takes exactly its two values."""
    for guarantee in ("exactly_once", "at_least_once"):
        assert Settings.from_env({"THREADLINE_PROCESSING_GUARANTEE": guarantee}
                                 ).processor.processing_guarantee == guarantee


def test_defaults_are_written_once() -> None:
    """Sections read with nothing set give the runtime objects' own defaults."""
    assert PolicyEnv.read({}).policy() == Policy()
    assert GatewayEnv.read({}).limits() == GatewayLimits()
    assert ObservabilitySettings.from_env({}) == ObservabilitySettings()


def test_an_empty_variable_is_unset_but_an_empty_prefix_is_a_prefix() -> None:
    """Empty numbers take their default; THREADLINE_TOPIC_PREFIX="" names topics without one."""
    settings = Settings.from_env({"THREADLINE_PARTITIONS": "", "THREADLINE_TOPIC_PREFIX": ""})
    assert settings.partitions == KafkaEnv.read({}).partitions
    assert settings.topics.commands == "commands"


@pytest.mark.parametrize(("name", "value"), [
    ("THREADLINE_AGENT_TOKENS_PER_S", "-1"),
    ("THREADLINE_AGENT_WORDS", "many"),
    ("THREADLINE_AGENT_STEPS", "perhaps"),
    ("THREADLINE_AGENT_OPENAI_TIMEOUT_S", "0"),
    ("THREADLINE_AGENT_TICKET_DELAY_S", "-2"),
])
def test_an_agents_refused_value_names_its_variable(name: str, value: str) -> None:
    """The agents we ship refuse a bad value of their own variables by name, at start."""
    settings = Settings.from_env({name: value})
    factory = create if "TICKET" in name else (
        OpenAIAgent.from_settings if "OPENAI" in name else BuiltinAgent.from_settings)
    with pytest.raises(SettingsError, match=name):
        factory(settings)


def test_the_agents_defaults_are_their_own() -> None:
    """The agents' sections read with nothing set give the agents' own defaults."""
    assert BuiltinAgent.from_settings(Settings.from_env({})) == BuiltinAgent()
    openai, default = OpenAIAgent.from_settings(Settings.from_env({}), tools=()), OpenAIAgent()
    assert (openai.base_url, openai.model, openai.timeout_s, openai.api_key) == \
        (default.base_url, default.model, default.timeout_s, default.api_key)
    on = BuiltinAgent.from_settings(Settings.from_env({"THREADLINE_AGENT_STEPS": "yes",
                                                      "THREADLINE_AGENT_TOOL_LOG": "/tmp/x.log"}))
    assert on.steps and on.tool_log == "/tmp/x.log"


def test_the_agent_gets_only_the_variables_its_settings_reference() -> None:
    """`${NAME}` in an agent setting (an MCP server's header) brings NAME's value to the
    worker's settings, read by the config module, and no other variable comes with it."""
    servers = '{"t": {"url": "http://h/mcp", "headers": {"Authorization": "Bearer ${TOKEN}"}}}'
    settings = Settings.from_env({"THREADLINE_AGENT_MCP_SERVERS": servers, "TOKEN": "s3cret",
                                  "UNRELATED_SECRET": "x"})
    assert settings.worker.referenced == {"TOKEN": "s3cret"}
