"""The Helm chart: `helm lint`, `helm template`, and probes that hit routes the code serves.

helm is built once with `go install` from the Go module proxy into ~/.cache/ragwarm/helm
(a few minutes on a clean machine, then cached); the test skips only where Go is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from ragwarm.cli.openapi import streams_routes
from ragwarm.stack.local import ONE_THREAD
from schemas.topics import TOPICS

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "infra" / "helm" / "ragwarm"
HELM_VERSION = "v3.22.0"
HELM_DIR = Path.home() / ".cache" / "ragwarm" / "helm" / HELM_VERSION


@pytest.fixture(scope="module")
def helm() -> str:
    """A helm binary: $HELM_BIN, the cached build, or one built now with `go install`.

    Not RAGWARM_HELM: every RAGWARM_ variable must name a setting, or `ragwarm` refuses to run.
    """
    given = os.environ.get("HELM_BIN")
    if given:
        return given
    exe = HELM_DIR / "helm"
    if exe.exists():
        return str(exe)
    go = shutil.which("go")
    if go is None:
        pytest.skip("helm is built with `go install`; no Go toolchain on this machine")
    env = {**os.environ, "GOBIN": str(HELM_DIR), "GOFLAGS": "-mod=mod"}
    run = subprocess.run([go, "install", f"helm.sh/helm/v3/cmd/helm@{HELM_VERSION}"],
                         env=env, capture_output=True, text=True, timeout=1500)
    assert run.returncode == 0, run.stderr[-3000:]
    return str(exe)


def rendered(helm: str, *sets: str) -> list[dict]:
    args = [helm, "template", "r", str(CHART), "--namespace", "prod"]
    for s in sets:
        args += ["--set", s]
    run = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return [d for d in yaml.safe_load_all(run.stdout) if d]


def served_routes() -> dict[str, set[str]]:
    """GET/POST paths each process serves, read from the code that registers them."""
    def grep(pattern: str, *paths: Path) -> set[str]:
        return {m for p in paths for m in re.findall(pattern, p.read_text())}

    aiohttp_route = r'web\.(?:get|post)\("([^"]+)"'
    return {
        "worker": grep(aiohttp_route, ROOT / "workers" / "service.py"),
        "gateway": grep(aiohttp_route, ROOT / "ragwarm" / "gateway" / "app.py"),
        "streams": {path for _, path in streams_routes()},
    }


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def container(doc: dict) -> dict:
    spec = doc["spec"]
    pod = spec["jobTemplate"]["spec"]["template"] if doc["kind"] == "CronJob" else spec["template"]
    return pod["spec"]["containers"][0]


def check_probes(c: dict, routes: set[str], probes: tuple[str, ...]) -> None:
    """The process listens on the `http` container port, and each probe hits one of its routes."""
    port = {p["name"]: p["containerPort"] for p in c["ports"]}["http"]
    # A worker started through `sh -c` (to read its derived keys) has its args in the script.
    args = c.get("args") or c["command"][-1].split()
    env = {e["name"]: e.get("value") for e in c["env"]}
    listens = args[args.index("--port") + 1] if "--port" in args else env[
        "RAGWARM_STREAMS_WEB_PORT"]
    assert listens == str(port)
    for probe in probes:
        get = c[probe]["httpGet"]
        assert get["port"] == "http" and get["path"] in routes, (probe, get, routes)


def test_helm_lint(helm: str) -> None:
    run = subprocess.run([helm, "lint", str(CHART), "--strict"], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


def test_rendered_probes_hit_routes_and_ports_the_code_serves(helm: str) -> None:
    docs, routes = rendered(helm), served_routes()
    worker = by_kind(docs, "StatefulSet")[0]
    check_probes(container(worker), routes["worker"],
                 ("startupProbe", "readinessProbe", "livenessProbe"))
    assert container(worker)["startupProbe"]["httpGet"]["path"] == "/health/ready"
    assert container(worker)["livenessProbe"]["httpGet"]["path"] == "/health/live"
    deployments = {d["metadata"]["name"]: d for d in by_kind(docs, "Deployment")}
    streams = container(deployments["r-ragwarm-streams"])
    check_probes(streams, routes["streams"], ("readinessProbe", "livenessProbe"))
    assert streams["readinessProbe"]["httpGet"]["path"] == "/ragwarm/health/ready"
    env = {e["name"]: e.get("value") for e in streams["env"]}
    assert ONE_THREAD.items() <= env.items()  # as `ragwarm up` runs it
    check_probes(container(deployments["r-ragwarm-gateway"]), routes["gateway"],
                 ("readinessProbe", "livenessProbe"))
    cron = container(by_kind(docs, "CronJob")[0])
    assert "/ragwarm/warmup" in cron["args"][0] and "/ragwarm/warmup" in routes["streams"]
    monitor = by_kind(docs, "ServiceMonitor")[0]["spec"]["endpoints"][0]
    assert monitor["path"] in routes["worker"] & routes["streams"]


def test_strimzi_topics_are_the_schema_topics(helm: str) -> None:
    docs = rendered(helm, "kafka.topicPrefix=prod.")
    topics = {d["spec"]["topicName"]: d for d in by_kind(docs, "KafkaTopic")}
    assert set(topics) == {"prod." + name for name in TOPICS}
    for name, spec in TOPICS.items():
        got = topics["prod." + name]
        assert got["apiVersion"] == "kafka.strimzi.io/v1"  # Strimzi >= 0.49
        assert got["spec"]["partitions"] == spec.partitions
        assert got["spec"]["config"] == spec.config
        assert re.fullmatch(r"[a-z0-9-]+", got["metadata"]["name"])
    assert not by_kind(rendered(helm, "strimzi.enabled=false"), "KafkaTopic")


def key_refs(c: dict) -> dict[str, tuple[str, str]]:
    """Variable -> (Secret, key) of every env entry read from a Secret."""
    refs = [(e["name"], e["valueFrom"]["secretKeyRef"]) for e in c["env"]
            if "secretKeyRef" in e.get("valueFrom", {})]
    return {name: (ref["name"], ref["key"]) for name, ref in refs}


def components(docs: list[dict]) -> dict[str, dict]:
    named = {d["metadata"]["name"]: d for d in docs if d["kind"] in ("Deployment", "StatefulSet")}
    return {"streams": container(named["r-ragwarm-streams"]),
            "worker": container(named["r-ragwarm-workers"]),
            "gateway": container(named["r-ragwarm-gateway"])}


def exposures(component: str, env: set[str]) -> list:
    """What the process would leave open with these variables set, by the code's own check
    (ragwarm.secure, which refuses to listen on 0.0.0.0 so)."""
    from ragwarm.secure import open_keys, unsigned_events

    if component == "gateway":
        return open_keys("gateway", "RAGWARM_GATEWAY_OPERATOR_KEY" in env,
                         "RAGWARM_GATEWAY_KEYS" in env)
    prefix = "RAGWARM_STREAMS" if component == "streams" else "RAGWARM_WORKER"
    secret = "RAGWARM_STREAMS_WORKER_EVENTS_SECRET" if component == "streams" else \
        "RAGWARM_WORKER_EVENTS_SECRET"
    return (open_keys(component, f"{prefix}_API_KEY" in env, f"{prefix}_TENANT_KEYS" in env)
            + unsigned_events(component, secret in env))


def test_default_values_render_no_open_view(helm: str) -> None:
    """Issue 41: a generated Secret, and every process gets its keys from it."""
    docs = rendered(helm)
    secret = by_kind(docs, "Secret")
    assert [s["metadata"]["name"] for s in secret] == ["r-ragwarm-keys"]
    assert set(secret[0]["data"]) == {"operator-key", "signing-secret"}
    assert secret[0]["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    for name, c in components(docs).items():
        refs = key_refs(c)
        assert {s for s, _ in refs.values()} == {"r-ragwarm-keys"}, (name, refs)
        # A worker's signing keys are derived into files by its init container.
        derived = {"RAGWARM_WORKER_EVENTS_SECRET"} if "$(cat /keys/events.key)" in " ".join(
            c.get("command", [])) else set()
        assert exposures(name, set(refs) | derived) == [], name
        assert "RAGWARM_INSECURE" not in {e["name"] for e in c["env"]}
    workers = next(d for d in by_kind(docs, "StatefulSet")
                   if d["metadata"]["name"] == "r-ragwarm-workers")
    init = workers["spec"]["template"]["spec"]["initContainers"][0]
    # Only the init container sees the master secret; the worker gets its own key.
    assert key_refs(init) == {"RAGWARM_STREAMS_WORKER_EVENTS_SECRET": ("r-ragwarm-keys",
                                                                      "signing-secret")}
    assert "ragwarm keys worker-key" in init["command"][-1]
    assert "signing-secret" not in {k for _, k in key_refs(components(docs)["worker"]).values()}
    assert key_refs(components(docs)["gateway"])["RAGWARM_CLIENT_API_KEY"] == (
        "r-ragwarm-keys", "operator-key")
    cron = container(by_kind(docs, "CronJob")[0])
    assert key_refs(cron) == {"OPERATOR_KEY": ("r-ragwarm-keys", "operator-key")}
    assert "Authorization" in cron["args"][0]
    monitor = by_kind(docs, "ServiceMonitor")[0]["spec"]["endpoints"][0]
    assert monitor["bearerTokenSecret"] == {"name": "r-ragwarm-keys", "key": "operator-key"}


def test_an_existing_secret_is_used_and_none_generated(helm: str) -> None:
    docs = rendered(helm, "security.existingSecret=mine")
    assert not by_kind(docs, "Secret")
    for name, c in components(docs).items():
        assert {s for s, _ in key_refs(c).values()} == {"mine"}, name


def test_insecure_is_an_explicit_opt_out(helm: str) -> None:
    docs = rendered(helm, "security.insecure=true")
    assert not by_kind(docs, "Secret")
    for name, c in components(docs).items():
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["RAGWARM_INSECURE"] == "true" and not key_refs(c), name
    monitor = by_kind(docs, "ServiceMonitor")[0]["spec"]["endpoints"][0]
    assert "bearerTokenSecret" not in monitor
