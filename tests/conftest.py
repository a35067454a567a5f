"""Shared fixtures: the session's Kafka broker (started once, on demand), topics and clients."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

from ragwarm.settings import TRACE_DIR, HomeSettings, KafkaSettings

if TYPE_CHECKING:
    from kafka import KafkaProducer


def _kafka_version_line() -> str:
    kafka = KafkaSettings()
    if kafka.bootstrap:
        return f"kafka: external cluster at {kafka.bootstrap} (RAGWARM_KAFKA_BOOTSTRAP)"
    return f"kafka: Apache Kafka {kafka.version}, local KRaft broker at {kafka.local_bootstrap}"


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [_kafka_version_line()]


def pytest_report_collectionfinish(config: pytest.Config, items: list[pytest.Item]) -> list[str]:
    # `-q` hides the header; the Kafka version must still show when tests use the broker.
    quiet = config.get_verbosity() < 0
    uses_kafka = any("kafka_bootstrap" in getattr(i, "fixturenames", ()) for i in items)
    return [_kafka_version_line()] if quiet and uses_kafka else []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The integration tier replays the Argo CD trace, found beside the checkout: say so once,
    # before any broker starts, rather than fail test by test with FileNotFoundError.
    trace = TRACE_DIR / "events.jsonl"
    if not trace.is_file() and any(i.get_closest_marker("integration") for i in items):
        pytest.exit(
            f"the integration tests read the Argo CD trace at {TRACE_DIR}, which is missing: "
            "clone this repository beside shared/ (shared/data/argocd), or run the unit tier "
            "alone (pytest -m 'not integration')",
            returncode=4,
        )


# --- Kafka ---------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def kafka_settings() -> KafkaSettings:
    return KafkaSettings()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_settings: KafkaSettings) -> Iterator[str]:
    """Bootstrap servers of a broker with the ragwarm topics; the local one is started once.

    A broker that was already running is reused and left running; one started here is
    stopped when the last test session sharing it ends.
    """
    from ragwarm.kafka.admin import create_topics
    from ragwarm.kafka.local import LocalKafka

    with LocalKafka(HomeSettings(), kafka_settings) as bootstrap:
        create_topics(bootstrap, kafka_settings.client_options())
        yield bootstrap


@pytest.fixture
def unique_name() -> Callable[[str], str]:
    """Factory of names no other test (or earlier run) uses: `prefix.<12 hex>`."""

    def make(prefix: str = "test") -> str:
        return f"{prefix}.{uuid.uuid4().hex[:12]}"

    return make


@pytest.fixture
def new_topic(
    kafka_bootstrap: str, kafka_settings: KafkaSettings, unique_name: Callable[[str], str]
) -> Iterator[Callable[..., str]]:
    """Factory of fresh topics, `new_topic(prefix, partitions=1, config=None)`; deleted after."""
    from ragwarm.kafka.admin import create_topics, delete_topics
    from schemas.topics import TopicSpec

    made: list[str] = []

    def make(prefix: str = "test", partitions: int = 1, config: dict | None = None) -> str:
        # Tests stamp records with fixed dates in the past; the broker's time retention
        # (7 days) would delete them at its next check, which can fall mid-test.
        spec = TopicSpec(unique_name(prefix), "test", partitions,
                         {"retention.ms": "-1", **(config or {})})
        create_topics(kafka_bootstrap, kafka_settings.client_options(), [spec])
        made.append(spec.name)
        return spec.name

    yield make
    delete_topics(kafka_bootstrap, kafka_settings.client_options(), made)


@pytest.fixture
def kafka_producer(kafka_bootstrap: str, kafka_settings: KafkaSettings) -> Iterator[KafkaProducer]:
    """A kafka-python producer (bytes in, acks=all) closed after the test."""
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=kafka_bootstrap, acks="all", **kafka_settings.client_options()
    )
    yield producer
    producer.close()


# --- Worker processes ----------------------------------------------------------------------
@pytest.fixture(scope="session")
def worker_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., object]]:
    """Factory of `ragwarm worker` processes (tests/integration/worker_proc.py), not yet started.

    `worker_factory(worker_id, kafka_bootstrap=None, topic_prefix="", api_key=None, env={},
    args=[])` returns a `WorkerProc`; call `.start().wait_ready()`. Every process it made is
    stopped at the end of the session (tests may stop theirs earlier with `.stop()`).
    """
    from tests.integration.worker_proc import WorkerProc

    made: list[WorkerProc] = []
    workdir = tmp_path_factory.mktemp("workers")

    def make(worker_id: str, **kw: object) -> WorkerProc:
        proc = WorkerProc(workdir, worker_id, **kw)  # type: ignore[arg-type]
        made.append(proc)
        return proc

    yield make
    for proc in made:
        proc.stop()


# --- Topic namespaces and the streams app --------------------------------------------------
@pytest.fixture
def namespace(
    kafka_bootstrap: str, kafka_settings: KafkaSettings, unique_name: Callable[[str], str]
) -> Iterator[str]:
    """A fresh topic prefix with every ragwarm topic created; all its topics deleted after.

    Pass it as RAGWARM_KAFKA_TOPIC_PREFIX to the processes of a test (the streams app's
    changelog topics are named after its app id, which `StreamsApp` also prefixes).
    """
    from ragwarm.kafka.admin import create_topics, delete_topics, list_topics
    from schemas.topics import prefixed
    from tests.integration.streams_proc import STARTED as APPS
    from tests.integration.worker_proc import STARTED as WORKERS

    prefix = unique_name("t") + "."
    options = kafka_settings.client_options()
    create_topics(kafka_bootstrap, options, prefixed(prefix))
    yield prefix
    # Processes still using the namespace stop first, whatever the fixture order.
    for proc in [*WORKERS, *APPS]:
        if proc.topic_prefix == prefix:
            proc.stop()
    delete_topics(kafka_bootstrap, options,
                  [t for t in list_topics(kafka_bootstrap, options) if t.startswith(prefix)])


@pytest.fixture
def streams_factory(kafka_bootstrap: str, tmp_path) -> Iterator[Callable[..., object]]:
    """Factory of streams-app processes: `streams_factory(prefix, app_id, env={})`, not started."""
    from tests.integration.streams_proc import StreamsApp

    made: list[StreamsApp] = []

    def make(prefix: str, app_id: str, env: dict[str, str] | None = None) -> StreamsApp:
        app = StreamsApp(kafka_bootstrap, prefix, app_id, tmp_path, env)
        made.append(app)
        return app

    yield make
    for app in made:
        app.stop()
