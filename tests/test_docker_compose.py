"""docker-compose.yml is safe by default (no Docker engine here: the file is parsed
and interpolated the way `docker compose` does it, then checked): the gateway is
published on loopback only, Kafka is not published, and there is no default key."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from streams.devtools.broker import _QUICK_RESTART

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"

# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error}, ${VAR?error}; $$ is a literal $.
_VARIABLE = re.compile(r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


class MissingVariable(Exception):
    """A required ${VAR:?message} variable is missing: Compose would refuse to start."""
    pass


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's variable interpolation, over a whole parsed file."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, arg = match.group("name"), match.group("op"), match.group("arg") or ""
        unset = name not in env or (op is not None and op.startswith(":") and env[name] == "")
        if not unset:
            return env[name]
        if op in (":-", "-"):
            return arg
        if op in (":?", "?"):
            raise MissingVariable(f"{name}: {arg}")
        return ""

    return _VARIABLE.sub(one, value)


def _compose() -> dict[str, Any]:
    parsed = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(parsed, dict)
    return parsed


def _published(service: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(host ip, host port, container port) of each published port; host ip '' is every interface."""
    out = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            out.append((str(port.get("host_ip", "")), str(port.get("published", "")), str(port["target"])))
            continue
        parts = str(port).rsplit(":", 2)
        if len(parts) == 3:
            out.append((parts[0].strip("[]"), parts[1], parts[2]))
        elif len(parts) == 2:
            out.append(("", parts[0], parts[1]))
        else:
            out.append(("", "", parts[0]))  # a random host port on every interface
    return out


def test_the_file_is_valid_yaml_with_the_two_services() -> None:
    """docker-compose.yml is valid YAML with the kafka and threadline services."""
    assert set(_compose()["services"]) == {"kafka", "threadline"}


def test_without_api_keys_compose_refuses_to_start() -> None:
    """Without THREADLINE_API_KEYS, or with it empty, Compose refuses to start."""
    with pytest.raises(MissingVariable, match="THREADLINE_API_KEYS"):
        interpolate(_compose(), {})
    with pytest.raises(MissingVariable, match="THREADLINE_API_KEYS"):
        interpolate(_compose(), {"THREADLINE_API_KEYS": ""})


def test_no_known_key_is_written_anywhere_in_the_file() -> None:
    """The file holds no API key, only a required variable."""
    text = COMPOSE.read_text()
    assert "dev=dev" not in text
    raw = _compose()["services"]["threadline"]["environment"]["THREADLINE_API_KEYS"]
    assert re.fullmatch(r"\$\{THREADLINE_API_KEYS:\?[^}]+\}", raw), raw


def test_the_gateway_is_published_on_loopback_only_by_default() -> None:
    """By default only the gateway's port is published, on loopback."""
    services = interpolate(_compose(), {"THREADLINE_API_KEYS": "k=t"})["services"]
    assert services["threadline"]["environment"]["THREADLINE_API_KEYS"] == "k=t"
    assert _published(services["threadline"]) == [("127.0.0.1", "8080", "8080")]
    for name, service in services.items():
        for host, _, _ in _published(service):
            assert host in ("127.0.0.1", "::1"), f"{name} publishes a port on {host or 'every interface'}"


def test_kafka_is_not_published_and_listens_on_the_compose_network_only() -> None:
    """Kafka publishes no port and advertises only its Compose network listener."""
    kafka = interpolate(_compose(), {"THREADLINE_API_KEYS": "k=t"})["services"]["kafka"]
    assert "ports" not in kafka and "network_mode" not in kafka
    environment = kafka["environment"]
    advertised = environment["KAFKA_ADVERTISED_LISTENERS"].split(",")
    assert advertised == ["PLAINTEXT://kafka:19092"], "no listener is advertised to the host"
    assert "EXTERNAL" not in environment["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"]


def test_kafka_restarts_after_a_crash_with_the_embedded_brokers_settings() -> None:
    """The compose broker's registration session and log recovery threads are the
    embedded broker's: a broker killed and started again is back as soon under
    Compose as under `make run`."""
    environment = _compose()["services"]["kafka"]["environment"]
    as_compose = {name: environment["KAFKA_" + name.upper().replace(".", "_")]
                  for name in _QUICK_RESTART}
    assert as_compose == _QUICK_RESTART


def test_publishing_elsewhere_is_an_explicit_choice() -> None:
    """THREADLINE_PUBLISH_HOST publishes the gateway on another interface."""
    services = interpolate(_compose(), {"THREADLINE_API_KEYS": "k=t", "THREADLINE_PUBLISH_HOST": "0.0.0.0"})
    assert _published(services["services"]["threadline"]) == [("0.0.0.0", "8080", "8080")]


def test_the_image_never_carries_a_local_data_folder() -> None:
    """var/ holds the instance identity: copied into an image, every container would share it."""
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert "var/" in ignored and ".venv/" in ignored


@pytest.mark.parametrize(("text", "env", "expected"), [
    ("${A:-x}", {}, "x"), ("${A:-x}", {"A": ""}, "x"), ("${A-x}", {"A": ""}, ""),
    ("${A}", {"A": "1"}, "1"), ("$${A}", {"A": "1"}, "${A}"), ("a${B}c", {}, "ac"),
])
def test_the_interpolation_follows_compose(text: str, env: dict[str, str], expected: str) -> None:
    """Our interpolation of defaults, empties and $$ escapes follows Compose's rules."""
    assert interpolate(text, env) == expected
