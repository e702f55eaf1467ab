"""The Kubernetes chart (deploy/helm/threadline), checked offline with no cluster:
`helm lint --strict` and `helm template` render it, and the rendered objects are held
against the code: every variable set is one `Settings` reads, the required ones are
set and parse, probes hit real routes, every container requests resources, no
secret is a plain value, and each instance of a role has its own id and volume."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.app import create_app
from gateway.keys import OptionsEnv
from streams.config import Settings
from tests.streams.test_settings_doc import declared

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "threadline"
CACHE = Path(os.environ.get("THREADLINE_CACHE_DIR") or Path.home() / ".cache" / "threadline")
HELM = shutil.which("helm") or (str(CACHE / "bin" / "helm")
                                if (CACHE / "bin" / "helm").exists() else None)
if HELM is None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("no helm: make test builds it (infra/helm.sh)", pytrace=False)
    pytest.skip("no helm on this machine (infra/helm.sh builds it)", allow_module_level=True)

REQUIRED = {"kafka.bootstrapServers": "kafka-0.kafka:9092,kafka-1.kafka:9092",
            "secrets.apiKeys.name": "threadline-api-keys"}
SECRETS = {"THREADLINE_API_KEYS", "THREADLINE_KAFKA_SASL_PASSWORD",
           "THREADLINE_RESUME_TOKEN_KEYS", "THREADLINE_AGENT_OPENAI_API_KEY"}
# Everything switched on: SASL over TLS, a CA, KEDA with its auth, ServiceMonitors, the
# ingress, resume-token keys and an agent's secret.
FULL = {**REQUIRED, "kafka.securityProtocol": "SASL_SSL", "kafka.saslUsername": "threadline",
        "secrets.kafkaPassword.name": "kafka-credentials", "kafka.caSecret.name": "kafka-ca",
        "secrets.resumeTokenKeys.name": "resume-keys", "worker.autoscaling.enabled": "true",
        "worker.autoscaling.authSecret": "keda-kafka", "metrics.serviceMonitor": "true",
        "gateway.ingress.enabled": "true", "gateway.ingress.tlsSecret": "threadline-tls",
        "worker.agent": "openai", "worker.secretEnv[0].name": "THREADLINE_AGENT_OPENAI_API_KEY",
        "worker.secretEnv[0].secret": "openai", "worker.secretEnv[0].key": "api-key",
        "worker.env.THREADLINE_AGENT_OPENAI_MODEL": "gpt-4o-mini", "env.THREADLINE_MAX_ATTEMPTS": "3"}
ROLES = ("processor", "worker", "gateway")


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    """Run helm with `args`; its output, whatever its status."""
    assert HELM is not None
    return subprocess.run([HELM, *args], capture_output=True, text=True, timeout=300, check=False)


def sets(values: dict[str, str]) -> list[str]:
    """`values` (dotted keys, `a.b[0].c`) as a values file's command-line arguments: a
    file, because `--set` splits a value at its commas (bootstrap servers have them)."""
    nested: dict[str, Any] = {}
    for dotted, value in values.items():
        here: Any = nested
        parts = [p for part in dotted.split(".") for p in re.split(r"\[(\d+)\]", part) if p]
        for part, after in zip(parts, [*parts[1:], None], strict=True):
            key: Any = int(part) if part.isdigit() else part
            if after is None:
                here[key] = value
                break
            empty: Any = [] if after.isdigit() else {}
            if isinstance(here, list):
                while len(here) <= key:
                    here.append(empty)
                here = here[key]
            else:
                here = here.setdefault(key, empty)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as out:
        yaml.safe_dump(nested, out)
    return ["-f", out.name]


def render(values: dict[str, str]) -> list[dict[str, Any]]:
    """The objects `helm template` renders with `values`."""
    done = helm("template", "rel", str(CHART), *sets(values))
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    """The objects of one kind, by name."""
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def role_sets(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each role's StatefulSet, by role."""
    out = {}
    for sts in by_kind(objects, "StatefulSet").values():
        out[sts["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]] = sts
    assert set(out) == set(ROLES)
    return out


def container(sts: dict[str, Any]) -> dict[str, Any]:
    """The one container of a StatefulSet's pods."""
    (only,) = sts["spec"]["template"]["spec"]["containers"]
    return dict(only)


def environment(objects: list[dict[str, Any]], sts: dict[str, Any], pod: str) -> dict[str, Any]:
    """A pod's environment as the kubelet would make it: the ConfigMaps of `envFrom`,
    then `env`; a fieldRef to the pod's name is the name, a secret stays a marker."""
    maps = by_kind(objects, "ConfigMap")
    env: dict[str, Any] = {}
    spec = container(sts)
    for source in spec.get("envFrom", []):
        env.update(maps[source["configMapRef"]["name"]]["data"])
    for entry in spec.get("env", []):
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        elif entry["valueFrom"].get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[entry["name"]] = pod
        else:
            env[entry["name"]] = ("secret", entry["valueFrom"]["secretKeyRef"]["name"],
                                  entry["valueFrom"]["secretKeyRef"]["key"])
    return env


def pods(sts: dict[str, Any]) -> list[str]:
    """The names of a StatefulSet's pods: <name>-0, -1, ..."""
    return [f"{sts['metadata']['name']}-{i}" for i in range(sts["spec"].get("replicas", 1))]


def plain(env: dict[str, Any]) -> dict[str, str]:
    """The environment with each secret replaced by a stand-in of its shape."""
    stand_in = {"THREADLINE_API_KEYS": "key=tenant", "THREADLINE_RESUME_TOKEN_KEYS": "k" * 32}
    return {name: (stand_in.get(name, "secret") if isinstance(value, tuple) else value)
            for name, value in env.items()}


@pytest.fixture(scope="module", params=["required", "full"])
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    """The chart rendered with the required values only, and with everything on."""
    return render(REQUIRED if request.param == "required" else FULL)


def test_the_chart_lints_strictly() -> None:
    """`helm lint --strict` passes, with the least and with the most switched on."""
    for values in (REQUIRED, FULL):
        done = helm("lint", "--strict", str(CHART), *sets(values))
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_required_values_are_refused_when_missing() -> None:
    """Without Kafka's address or the API keys' Secret, rendering fails and names the value."""
    for missing in REQUIRED:
        done = helm("template", "rel", str(CHART),
                    *sets({k: v for k, v in REQUIRED.items() if k != missing}))
        assert done.returncode != 0 and missing in done.stderr, (missing, done.stderr)


def test_every_variable_set_is_one_the_code_reads(rendered: list[dict[str, Any]]) -> None:
    """No role is given a variable that no settings section reads (a typo would be ignored)."""
    known = set(declared())
    for role, sts in role_sets(rendered).items():
        unknown = set(environment(rendered, sts, pods(sts)[0])) - known
        assert not unknown, f"{role} sets variables no settings section reads: {unknown}"


def test_the_required_variables_are_set_and_parse(rendered: list[dict[str, Any]]) -> None:
    """Each role's environment parses as `Settings`, with what it cannot run without."""
    for role, sts in role_sets(rendered).items():
        env = environment(rendered, sts, pods(sts)[0])
        settings = Settings.from_env(plain(env))  # raises on a value it does not accept
        assert settings.bootstrap_servers == REQUIRED["kafka.bootstrapServers"]
        assert settings.instance_id == pods(sts)[0]
        mounts = {m["mountPath"] for m in container(sts)["volumeMounts"]}
        assert str(settings.data_dir) in mounts, f"{role}: the data folder is not a volume"
        assert container(sts)["workingDir"] == str(settings.data_dir)  # `var/` goes there too
        if role == "gateway":
            assert env["THREADLINE_API_KEYS"][0] == "secret"
            assert settings.gateway.http_host == "0.0.0.0"  # else neither Service nor probe reaches it
            OptionsEnv.read(plain(env))
        else:
            assert settings.observability.metrics_port is not None
            assert settings.observability.metrics_host == "0.0.0.0"
    # Every role agrees on the topics: the same ConfigMap, read whole by each.
    contracts = {(s.topic_prefix, s.partitions, s.replication_factor)
                 for sts in role_sets(rendered).values()
                 for s in [Settings.from_env(plain(environment(rendered, sts, "p-0")))]}
    assert len(contracts) == 1


def test_probes_point_at_real_routes(rendered: list[dict[str, Any]]) -> None:
    """The gateway's probes are routes of the real app; the others' the metrics server's."""
    for role, sts in role_sets(rendered).items():
        spec = container(sts)
        ports = {p["name"]: p["containerPort"] for p in spec["ports"]}
        env = plain(environment(rendered, sts, pods(sts)[0]))
        settings = Settings.from_env(env)
        probes = {kind: spec[kind]["httpGet"] for kind in
                  ("livenessProbe", "readinessProbe", "startupProbe") if kind in spec}
        assert "livenessProbe" in probes and "startupProbe" in probes, role
        if role == "gateway":
            # Not started: only its routes are read (and without the pod's CA file, which
            # is not on this machine: the routes do not depend on Kafka's security).
            app = create_app(Settings.from_env(
                {k: v for k, v in env.items() if not k.startswith("THREADLINE_KAFKA_")}))
            routes = {r.canonical for r in app.router.resources()}
            assert probes["livenessProbe"]["path"] == "/livez"
            assert probes["readinessProbe"]["path"] == "/readyz"
            for probe in probes.values():
                assert probe["path"] in routes
                assert ports[probe["port"]] == settings.gateway.http_port
        else:  # the metrics server (prometheus_client) on THREADLINE_METRICS_PORT
            for probe in probes.values():
                assert probe["path"] == "/metrics"
                assert ports[probe["port"]] == settings.observability.metrics_port


def test_every_container_requests_resources(rendered: list[dict[str, Any]]) -> None:
    """Every container requests CPU and memory and has a memory limit."""
    for role, sts in role_sets(rendered).items():
        requests = container(sts)["resources"]["requests"]
        assert requests.get("cpu") and requests.get("memory"), role
        assert container(sts)["resources"]["limits"].get("memory"), role


def test_no_secret_is_a_plain_value(rendered: list[dict[str, Any]]) -> None:
    """Secrets come from Secrets by reference: never in a ConfigMap, a value or values.yaml."""
    assert not by_kind(rendered, "Secret"), "the chart must not hold secrets"
    for cm in by_kind(rendered, "ConfigMap").values():
        assert not SECRETS & set(cm.get("data", {})), cm["metadata"]["name"]
    for role, sts in role_sets(rendered).items():
        for entry in container(sts).get("env", []):
            if entry["name"] in SECRETS:
                assert "secretKeyRef" in entry.get("valueFrom", {}), (role, entry)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert not SECRETS & set(_keys(values))


@pytest.mark.parametrize("where", ["env", "worker.env", "gateway.env"])
def test_a_secret_given_as_a_value_is_refused(where: str) -> None:
    """A secret put among plain settings fails the render instead of landing in a ConfigMap."""
    done = helm("template", "rel", str(CHART),
                *sets({**REQUIRED, f"{where}.THREADLINE_API_KEYS": "key=tenant"}))
    assert done.returncode != 0 and "is a secret" in done.stderr, done.stderr


def test_each_instance_has_its_own_id_and_volume() -> None:
    """3 gateways, 2 processors, 4 workers: nine instance ids, and no data volume shared."""
    objects = render({**REQUIRED, "gateway.replicas": "3", "processor.replicas": "2",
                      "worker.replicas": "4"})
    sets_ = role_sets(objects)
    assert {role: len(pods(sts)) for role, sts in sets_.items()} == \
        {"gateway": 3, "processor": 2, "worker": 4}
    ids: list[str] = []
    claims: list[str] = []
    for sts in sets_.values():
        template = sts["spec"]["template"]["spec"]
        # No volume shared by every pod: a data folder is a claim of each pod's own, or
        # an emptyDir (the worker's: nothing there outlives a run).
        for volume in template.get("volumes", []):
            assert "persistentVolumeClaim" not in volume, volume
        data = {v["name"]: v for v in template.get("volumes", [])}
        templates = {c["metadata"]["name"] for c in sts["spec"].get("volumeClaimTemplates", [])}
        for pod in pods(sts):
            ids.append(Settings.from_env(plain(environment(objects, sts, pod))).instance_id or "")
            if "data" in templates:
                claims.append(f"data-{pod}")
            else:
                assert "emptyDir" in data["data"], sts["metadata"]["name"]
    assert len(ids) == 9 and len(set(ids)) == 9 and all(ids)
    assert len(claims) == len(set(claims)) == 5  # 2 processors and 3 gateways


def test_workers_scale_on_the_lag_of_their_own_group() -> None:
    """KEDA scales the worker StatefulSet on its own group's lag on the dispatch topic."""
    objects = render(FULL)
    settings = Settings.from_env({"THREADLINE_TOPIC_PREFIX": "threadline."})
    (scaled,) = by_kind(objects, "ScaledObject").values()
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "kafka"
    assert trigger["metadata"]["consumerGroup"] == settings.group_id("worker")
    assert trigger["metadata"]["topic"] == settings.topics.dispatch
    worker = role_sets(objects)["worker"]
    assert scaled["spec"]["scaleTargetRef"]["name"] == worker["metadata"]["name"]
    assert "replicas" not in worker["spec"]  # KEDA owns the count
    assert trigger["authenticationRef"]["name"] in by_kind(objects, "TriggerAuthentication")


def test_the_ingress_streams_and_the_dashboard_is_the_docs_one() -> None:
    """The ingress does not buffer SSE; the dashboard is docs/grafana-dashboard.json."""
    objects = render(FULL)
    (ingress,) = by_kind(objects, "Ingress").values()
    notes = ingress["metadata"]["annotations"]
    assert notes["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    assert int(notes["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= 60
    (dashboard,) = [cm for cm in by_kind(objects, "ConfigMap").values()
                    if cm["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    docs = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    assert json.loads(dashboard["data"]["threadline.json"]) == docs
    monitors = by_kind(objects, "ServiceMonitor")
    assert len(monitors) == 3


def _keys(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, inner in value.items():
            yield str(key)
            yield from _keys(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _keys(inner)
