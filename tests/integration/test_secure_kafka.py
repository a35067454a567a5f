"""`ragwarm kafka start --secure`: the whole pipeline over SASL_SSL; plaintext is refused.

A private broker (its own RAGWARM_HOME and ports, the shared jars) opens only a SASL_SSL
listener; the streams app, a worker, topic creation, replay and the test's own clients
connect with the settings the start command prints.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kafka import KafkaProducer
from pydantic import SecretStr

from ragwarm.kafka.admin import probe
from ragwarm.kafka.local import LocalKafka
from ragwarm.ports import free_port
from ragwarm.settings import HomeSettings, KafkaSettings
from schemas.signing import derive_commands_key, derive_worker_key
from schemas.topics import KB_CHANGES
from tests.integration.e2e_kit import initial_docs, run_scenario
from tests.integration.kb_stack import send_docs
from tests.integration.streams_proc import StreamsApp
from tests.integration.worker_proc import WorkerProc

pytestmark = pytest.mark.integration

RAGWARM = Path(sys.executable).parent / "ragwarm"
PREFIX = "sec."


@dataclass
class SecureKafka:
    bootstrap: str
    broker_env: dict[str, str]  # what `ragwarm kafka start|stop` runs with
    client_env: dict[str, str]  # what the start command printed, plus the bootstrap

    @property
    def settings(self) -> KafkaSettings:
        names = {k.removeprefix("RAGWARM_KAFKA_").lower(): v for k, v in self.client_env.items()}
        return KafkaSettings(**names)

    def ragwarm(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(RAGWARM), *args], env=env or {**self.broker_env, **self.client_env},
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip


def _exports(stdout: str) -> dict[str, str]:
    pairs = [ln.removeprefix("export ").split("=", 1) for ln in stdout.splitlines()]
    return {k: v.strip("'") for k, v in (p for p in pairs if len(p) == 2) if k.startswith("RAG")}


@pytest.fixture(scope="module")
def secure_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    shared = LocalKafka(HomeSettings(), KafkaSettings(bootstrap=None))
    shared.ensure_jars()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGWARM_KAFKA_")}
    env.update(
        RAGWARM_HOME=str(tmp_path_factory.mktemp("secure-home")),
        RAGWARM_KAFKA_PORT=str(port),
        RAGWARM_KAFKA_CONTROLLER_PORT=str(free_port()),
        RAGWARM_KAFKA_JARS_DIR=str(shared.jars_dir.parent),
    )
    started = subprocess.run([str(RAGWARM), "kafka", "start", "--secure"], env=env,
                             capture_output=True, text=True, timeout=180)  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr
    bootstrap = f"127.0.0.1:{port}"
    client = {**_exports(started.stdout), "RAGWARM_KAFKA_BOOTSTRAP": bootstrap}
    assert client["RAGWARM_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    yield SecureKafka(bootstrap, env, client)
    subprocess.run([str(RAGWARM), "kafka", "stop", "--force"], env=env, timeout=60)


def test_plaintext_and_wrong_password_are_refused(secure_kafka: SecureKafka) -> None:
    settings = secure_kafka.settings
    assert probe(secure_kafka.bootstrap, settings.client_options(), 10.0) is not None
    assert probe(secure_kafka.bootstrap, {}, 5.0) is None
    wrong = settings.model_copy(update={"sasl_password": SecretStr("not-it")})
    assert probe(secure_kafka.bootstrap, wrong.client_options(), 5.0) is None
    plaintext = {**secure_kafka.client_env, "RAGWARM_KAFKA_SECURITY_PROTOCOL": "PLAINTEXT"}
    listed = secure_kafka.ragwarm("topics", "list", env={**secure_kafka.broker_env, **plaintext})
    assert listed.returncode != 0


def test_pipeline_runs_end_to_end_over_sasl_ssl(
    secure_kafka: SecureKafka, tmp_path: Path
) -> None:
    created = secure_kafka.ragwarm(
        "topics", "create", env={**secure_kafka.broker_env, **secure_kafka.client_env,
                                 "RAGWARM_KAFKA_TOPIC_PREFIX": PREFIX}
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    settings = secure_kafka.settings
    producer = KafkaProducer(bootstrap_servers=secure_kafka.bootstrap,
                             **settings.producer_options())  # fmt: skip
    docs = initial_docs()
    send_docs(producer, PREFIX + KB_CHANGES, list(docs.values()))
    # Signed worker events and commands too: the app holds the master secret, the worker only
    # its own events key and the commands key derived from it (`ragwarm keys`).
    master = b"e2e-master-secret"
    shared = secure_kafka.client_env
    env = {**shared, "RAGWARM_STREAMS_HOT_MIN_COUNT": "2",
           "RAGWARM_STREAMS_WORKER_EVENTS_SECRET": master.decode()}  # fmt: skip
    app = StreamsApp(secure_kafka.bootstrap, PREFIX, "e2e", tmp_path, env).start()
    worker = WorkerProc(
        tmp_path, "w1", kafka_bootstrap=secure_kafka.bootstrap, topic_prefix=PREFIX,
        env={**shared, "RAGWARM_WORKER_HEARTBEAT_S": "1",
             "RAGWARM_WORKER_CACHE_REQUESTS": "false",
             "RAGWARM_WORKER_EVENTS_SECRET": derive_worker_key(master, "w1"),
             "RAGWARM_WORKER_COMMANDS_KEY": derive_commands_key(master)},
    )  # fmt: skip
    worker.start().wait_ready()
    try:
        run_scenario(secure_kafka.bootstrap, producer, PREFIX, app, worker, docs,
                     settings.client_options())  # fmt: skip
        assert app.counters().get("unauthenticated_events", 0) == 0
    finally:
        worker.stop()
        app.stop()
        producer.close()
    replay = secure_kafka.ragwarm("replay", PREFIX + KB_CHANGES, "--from", "beginning",
                                  "--into", PREFIX + "copy", "--dry-run")  # fmt: skip
    assert replay.returncode == 0, replay.stdout + replay.stderr
