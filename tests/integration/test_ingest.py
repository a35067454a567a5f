"""`ragwarm ingest` against the real broker: folders and traces land on the topic as KbChange."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from kafka.consumer.fetcher import ConsumerRecord

from ragwarm.client.ingest import ingest
from ragwarm.client.producer import KbProducer
from ragwarm.settings import KafkaSettings
from schemas import KbChange, decode
from schemas.topics import kb_key
from tests.integration.kafka_read import read_topic

pytestmark = pytest.mark.integration


def _run(bootstrap: str, *args: str) -> Result:
    env = {"RAGWARM_KAFKA_BOOTSTRAP": bootstrap}
    return CliRunner().invoke(ingest, list(args), env=env, catch_exceptions=False)


def _read_all(bootstrap: str, topic: str, expected: int) -> list[ConsumerRecord]:
    return read_topic(bootstrap, topic, expected, timeout_s=30)


def test_folder_sends_good_files_and_reports_bad_ones(
    kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic("ingest", partitions=2)
    (tmp_path / "guide").mkdir()
    (tmp_path / "guide" / "setup.md").write_text("# Setup\nRun the installer.\n")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "image.md").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    (tmp_path / "huge.md").write_text("x" * 5000)

    result = _run(
        kafka_bootstrap, str(tmp_path), "--topic", topic, "--tenant", "acme", "--max-bytes", "4096"
    )

    assert result.exit_code == 0, result.output
    assert "skipped latin1.txt: not UTF-8" in result.output
    assert "skipped image.md: " in result.output
    assert "skipped huge.md: too large (5000 bytes > 4096)" in result.output
    assert "sent:     1" in result.output and "skipped:  3" in result.output
    records = _read_all(kafka_bootstrap, topic, 1)
    assert len(records) == 1
    change = decode(records[0].value, KbChange)
    assert records[0].key == kb_key("acme", "guide/setup.md")
    assert (change.doc_id, change.tenant, change.op) == ("guide/setup.md", "acme", "upsert")
    assert change.text == "# Setup\nRun the installer.\n"
    assert change.version == (tmp_path / "guide" / "setup.md").stat().st_mtime_ns


def test_reingesting_an_unchanged_folder_repeats_the_versions(
    kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic("ingest")
    (tmp_path / "a.md").write_text("alpha")
    (tmp_path / "b.md").write_text("beta")
    for _ in range(2):
        assert _run(kafka_bootstrap, str(tmp_path), "--topic", topic).exit_code == 0
    changes = [decode(r.value, KbChange) for r in _read_all(kafka_bootstrap, topic, 4)]
    first, second = changes[:2], changes[2:]
    assert [(c.doc_id, c.version, c.text) for c in first] == [
        (c.doc_id, c.version, c.text) for c in second
    ]


def test_a_trace_lands_keyed_by_doc_id_with_seq_as_version(
    kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic("ingest", partitions=3)
    rows = [
        {
            "seq": 3,
            "timestamp": "2024-01-01T00:00:00Z",
            "op": "upsert",
            "doc_id": "docs/a.md",
            "text": "A0",
            "initial": True,
            "commit": "c1",
            "files": ["x", "y"],
        },
        {
            "seq": 5,
            "timestamp": "2024-01-01T00:00:00Z",
            "op": "upsert",
            "doc_id": "docs/b.md",
            "text": "B0",
            "initial": True,
            "commit": "c1",
        },
        {
            "seq": 9,
            "timestamp": "2024-02-01T00:00:00Z",
            "op": "upsert",
            "doc_id": "docs/a.md",
            "text": "A1",
            "initial": False,
            "commit": "c2",
        },
        {
            "seq": 12,
            "timestamp": "2024-03-01T00:00:00Z",
            "op": "delete",
            "doc_id": "docs/b.md",
            "text": None,
            "initial": False,
            "commit": "c3",
        },
    ]
    trace = tmp_path / "events.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))

    result = _run(kafka_bootstrap, str(trace), "--topic", topic)

    assert result.exit_code == 0, result.output
    records = _read_all(kafka_bootstrap, topic, 4)
    by_seq = {decode(r.value, KbChange).version: r for r in records}
    assert sorted(by_seq) == [3, 5, 9, 12]
    for row in rows:
        record = by_seq[row["seq"]]
        change = decode(record.value, KbChange)
        assert record.key == row["doc_id"].encode()
        assert (change.op, change.doc_id, change.text) == (row["op"], row["doc_id"], row["text"])
        assert change.metadata["commit"] == row["commit"]
        assert record.timestamp == int(change.timestamp.timestamp() * 1000)
    # One document's changes share a partition, so they are consumed in version order.
    assert by_seq[3].partition == by_seq[9].partition


def test_initial_only_and_limit(
    kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic("ingest")
    rows = [
        {
            "seq": i,
            "timestamp": "2024-01-01T00:00:00Z",
            "op": "upsert",
            "doc_id": f"d{i}",
            "text": f"t{i}",
            "initial": i < 3,
        }
        for i in range(6)
    ]
    trace = tmp_path / "events.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert _run(kafka_bootstrap, str(trace), "--topic", topic, "--initial-only").exit_code == 0
    assert _run(kafka_bootstrap, str(trace), "--topic", topic, "--limit", "2").exit_code == 0
    versions = [decode(r.value, KbChange).version for r in _read_all(kafka_bootstrap, topic, 5)]
    assert versions == [0, 1, 2, 0, 1]


def test_nothing_sendable_exits_non_zero(
    kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic("ingest")
    (tmp_path / "bad.md").write_bytes(b"\xff\xfe\x00")
    result = _run(kafka_bootstrap, str(tmp_path), "--topic", topic)
    assert result.exit_code == 1
    assert "skipped bad.md" in result.output and "nothing could be sent" in result.output


def test_missing_topic_is_refused_not_auto_created(
    kafka_bootstrap: str, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    (tmp_path / "a.md").write_text("alpha")
    result = _run(kafka_bootstrap, str(tmp_path), "--topic", unique_name("absent"))
    assert result.exit_code == 1
    assert "does not exist" in result.output


def test_unreachable_kafka_names_the_fix(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("alpha")
    result = _run("127.0.0.1:1", str(tmp_path))
    assert result.exit_code == 1
    assert "not reachable at 127.0.0.1:1" in result.output
    assert "ragwarm kafka start" in result.output and "RAGWARM_KAFKA_BOOTSTRAP" in result.output


def test_kb_producer_reports_deliveries(
    kafka_bootstrap: str, kafka_settings: KafkaSettings, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("producer", partitions=2)
    with KbProducer(kafka_bootstrap, kafka_settings.client_options(), topic) as producer:
        for version in range(5):
            producer.send(KbChange(op="upsert", doc_id="doc", version=version, text=f"v{version}"))
        report = producer.flush()
    assert (report.delivered, report.failed) == (5, ())
    records = _read_all(kafka_bootstrap, topic, 5)
    assert [decode(r.value, KbChange).version for r in records] == [0, 1, 2, 3, 4]
    assert {r.key for r in records} == {b"doc"}
