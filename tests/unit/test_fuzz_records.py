"""10,000 generated bad records at the decoders of every input topic: each is refused with a
reason (a `SchemaError` naming the field), none raises anything else, valid ones still pass.

The records are the strategies of tests/fuzz_records.py. The whole-system version (records on
the real topics, dead letters, pids) is tests/integration/test_fuzz_topics.py; this is the
part every consumer shares: `schemas.decode` and the worker's command dispatch.
"""

from __future__ import annotations

import json
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings

from schemas import KbChange, QueryEvent, SchemaError, WarmupCommand, WorkerEvent, decode, encode
from tests.fuzz_records import VALID, Drawn, bad_record
from tests.unit.worker_fakes import runtime_and_sink
from workers.commands import CommandConsumer
from workers.runtime import WorkerRuntime

PER_TOPIC = 2500  # x 4 input topics = 10,000 records


@cache
def _runtime() -> WorkerRuntime:
    return runtime_and_sink()[0]


def _refused_or_valid(raw: bytes, model: type) -> None:
    try:
        event = decode(raw, model)
    except SchemaError as exc:
        assert exc.message and exc.field
        return
    # A mutation may leave a record valid (a field at another valid value): then it is one.
    assert isinstance(event, model)
    decode(encode(event), model)


def _fuzz(model: type):  # noqa: ANN202 - a hypothesis test function
    @settings(max_examples=PER_TOPIC, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(bad_record(model))
    def run(record: Drawn) -> None:
        _refused_or_valid(record.raw, model)

    return run


test_kb_changes_fuzz = _fuzz(KbChange)
test_rag_queries_fuzz = _fuzz(QueryEvent)
test_worker_events_fuzz = _fuzz(WorkerEvent)
test_warmup_commands_fuzz = _fuzz(WarmupCommand)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bad_record(WarmupCommand))
def test_the_worker_refuses_bad_commands_without_stopping(record: Drawn) -> None:
    refused: list[str] = []
    letters: list[str] = []
    handled: list[WarmupCommand] = []
    runtime = _runtime()

    def refuse(why: str, command_id: str | None) -> None:
        # What the worker does (ragwarm/cli/worker.py): a `refused` event to the sender.
        runtime.send(runtime.refused_event(why, command_id))
        refused.append(why)

    consumer = CommandConsumer(
        "x:1", {}, "w1", handled.append, on_malformed=refuse,
        on_dead_letter=lambda letter, _key: letters.append(encode(letter) and letter.reason),
    )
    consumer._dispatch(record.raw)
    assert len(refused) + len(handled) <= 1
    if handled:
        assert isinstance(handled[0], WarmupCommand)
    else:
        # Refused and dead-lettered with the same reason (a truncated payload's letter adds
        # its size), or another worker's to refuse.
        assert len(letters) == len(refused)
        assert all(r and x.startswith(r) for x, r in zip(letters, refused, strict=True))


def test_valid_records_pass() -> None:
    for model, event in VALID.items():
        assert decode(encode(event), model) == event


def test_a_huge_unknown_schema_name_is_quoted_short() -> None:
    """Seen as a Hypothesis example: a 100 KB schema_name made the refusal and the dead
    letter's reason (cut to its own size) disagree."""
    raw = json.dumps({"schema_name": "x" * 100_000, "schema_version": 1}).encode()
    with pytest.raises(SchemaError) as caught:
        decode(raw, WarmupCommand)
    assert len(str(caught.value)) < 500
    assert "100000 chars" in str(caught.value)
