"""Older schema versions are still read (as the current model); kb.changes keys."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from schemas import DeadLetter, WarmupCommand, WorkerEvent, decode, encode
from schemas.events import (
    DeadLetterV1,
    WarmupCommandV1,
    WorkerEventV1,
    WorkerEventV2,
    WorkerEventV3,
    WorkerEventV4,
)
from schemas.topics import TOPICS, kb_key


def test_v1_worker_event_reads_as_current_without_epoch():
    old = WorkerEventV1(worker_id="w", kind="ready", mem_total_bytes=10)
    event = decode(encode(old), WorkerEvent)
    assert type(event) is WorkerEvent
    assert event.schema_version == WorkerEvent.VERSION
    assert event.epoch is None
    assert event.mem_total_bytes == 10


def test_worker_event_round_trips_with_epoch_tier_and_node():
    event = WorkerEvent(
        worker_id="w", kind="ready", epoch=17, tier_prefixes=["ab" * 16], tier_bytes=7,
        node="node-a",
    )
    assert json.loads(encode(event))["schema_version"] == WorkerEvent.VERSION
    assert decode(encode(event)) == event


def test_a_v3_ready_reads_as_current_on_no_node():
    old = WorkerEventV3(worker_id="w", kind="ready", epoch=5, tier_prefixes=["cd" * 16])
    event = decode(encode(old), WorkerEvent)
    assert type(event) is WorkerEvent
    assert event.node is None and event.tier_prefixes == ["cd" * 16]


def test_a_v4_ready_keeps_its_node_and_has_no_questions():
    old = WorkerEventV4(worker_id="w", kind="ready", epoch=5, node="node-a")
    event = decode(encode(old), WorkerEvent)
    assert type(event) is WorkerEvent and event.schema_version == WorkerEvent.VERSION
    assert event.node == "node-a" and event.questions == []


def test_a_v2_ready_reads_as_current_with_no_disk_tier():
    old = WorkerEventV2(worker_id="w", kind="ready", epoch=5, warm_prefixes=["cd" * 16])
    event = decode(encode(old), WorkerEvent)
    assert type(event) is WorkerEvent
    assert event.tier_prefixes == [] and event.tier_bytes == 0
    assert event.warm_prefixes == ["cd" * 16] and event.epoch == 5


def test_v1_command_reads_without_expiry():
    old = WarmupCommandV1(command_id="c", op="prefill", token_ids=[1, 2])
    cmd = decode(encode(old), WarmupCommand)
    assert type(cmd) is WarmupCommand
    assert not cmd.expired(datetime.now(UTC))


def test_command_expiry():
    now = datetime.now(UTC)
    cmd = WarmupCommand(
        command_id="c", op="prefill", token_ids=[1], expires_at=now + timedelta(seconds=5)
    )
    assert not cmd.expired(now)
    assert cmd.expired(now + timedelta(seconds=5))


def test_v1_dead_letter_reads_as_v2():
    old = DeadLetterV1(source_topic="kb.changes", value_b64="eA==", reason="bad")
    letter = decode(encode(old), DeadLetter)
    assert type(letter) is DeadLetter
    assert not letter.truncated


def test_a_v2_record_is_not_read_as_v1_fields():
    raw = json.loads(encode(WorkerEvent(worker_id="w", kind="ready", epoch=1)))
    raw["schema_version"] = 1
    with pytest.raises(ValueError, match="epoch"):
        decode(json.dumps(raw).encode())


def test_kb_changes_is_compacted_and_keyed_by_tenant_and_doc():
    assert TOPICS["kb.changes"].config["cleanup.policy"] == "compact"
    assert kb_key("default", "a.md") == b"a.md"
    assert kb_key("acme", "a.md") != kb_key("default", "a.md")
    assert kb_key("acme", "a.md") != kb_key("acm", "ea.md")


def test_v2_carries_every_kind_and_v1_stays_as_published():
    refused = WorkerEvent(worker_id="w", kind="refused", reason="too long", epoch=3)
    assert decode(encode(refused)) == refused
    v1_kinds = set(WorkerEventV1.model_fields["kind"].annotation.__args__)
    v2_kinds = set(WorkerEvent.model_fields["kind"].annotation.__args__)
    assert v1_kinds < v2_kinds and {"refused", "expired"} <= v2_kinds - v1_kinds
    assert "signature" not in WorkerEventV1.model_fields


def test_v2_command_reads_as_v3():
    from schemas.events import WarmupCommandV2

    old = WarmupCommandV2(command_id="c", op="prefill", token_ids=[1, 2])
    cmd = decode(encode(old), WarmupCommand)
    assert type(cmd) is WarmupCommand
    assert cmd.schema_version == WarmupCommand.VERSION
    assert cmd.opening_ids == []


def test_chunk_prefill_needs_the_chunk_its_opening_and_exactly_one_ref():
    ref = {"chunk_id": "doc#0", "content_hash": "a" * 64}
    cmd = WarmupCommand(command_id="c", op="prefill_chunk", token_ids=[5, 6],
                        opening_ids=[1, 2], chunk_refs=[ref])
    assert decode(encode(cmd)) == cmd
    for missing, kw in (("token_ids", {"token_ids": []}), ("opening_ids", {"opening_ids": []}),
                        ("chunk_refs", {"chunk_refs": [ref, ref]})):
        fields = {"token_ids": [5], "opening_ids": [1], "chunk_refs": [ref]} | kw
        with pytest.raises(ValueError, match=missing):
            WarmupCommand(command_id="c", op="prefill_chunk", **fields)


def test_a_v5_prefill_reads_as_kept_in_device_memory():
    from schemas.events import WarmupCommandV5

    old = WarmupCommandV5(command_id="c", op="prefill", token_ids=[1, 2])
    cmd = decode(encode(old), WarmupCommand)
    assert cmd.schema_version == WarmupCommand.VERSION and cmd.placement == "device"


def test_a_tier_placement_round_trips_on_a_prefill_only():
    cmd = WarmupCommand(command_id="c", op="prefill", token_ids=[1, 2], placement="tier")
    assert decode(encode(cmd)) == cmd
    with pytest.raises(ValueError, match="placement"):
        WarmupCommand(command_id="c", op="release", prefix_hash="ab" * 16, placement="tier")


def test_a_v5_worker_event_reads_as_one_with_no_tier_size():
    from schemas.events import WorkerEventV5

    old = WorkerEventV5(worker_id="w", kind="heartbeat", tier_bytes=9)
    event = decode(encode(old), WorkerEvent)
    assert event.tier_total_bytes == 0 and event.tier_bytes == 9
