"""10,000 generated bad records at the decoders of every input topic: each is refused with a
reason (a `SchemaError` naming the field), none raises anything else, valid ones still pass.

The whole-system version (records on the real topics, dead letters, pids) is not here; this is
the part every consumer shares: `schemas.decode` and the worker's command dispatch.
"""

from __future__ import annotations

import json
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas import KbChange, QueryEvent, SchemaError, WarmupCommand, WorkerEvent, decode, encode
from workers.commands import CommandConsumer

PER_TOPIC = 2500  # x 4 input topics = 10,000 records
VALID = {
    KbChange: KbChange(op="upsert", doc_id="d.md", version=3, text="hello"),
    QueryEvent: QueryEvent(question="why?", prefix_hash="ab" * 16, block_hashes=["ab" * 16]),
    WarmupCommand: WarmupCommand(command_id="c1", op="prefill", token_ids=[1, 2, 3], ttl_s=60),
    WorkerEvent: WorkerEvent(worker_id="w1", kind="heartbeat", url="http://w1"),
}

odd_values = st.one_of(
    st.sampled_from([None, True, 2**70, -(2**63) - 1, -1, math.nan, math.inf, -math.inf, 1e308,
                     "", "x" * 1_000_001, [], {}]),
    st.text(max_size=20), st.lists(st.integers(), max_size=5),
    st.recursive(st.integers(), lambda inner: st.lists(inner, max_size=2), max_leaves=200),
)  # fmt: skip


def _deep(n: int) -> str:
    return "[" * n + "]" * n


@st.composite
def bad_record(draw: st.DrawFn, model: type) -> bytes:
    """A record that is not a valid `model` event: a valid one broken in one way, or junk."""
    base = json.loads(encode(VALID[model]))
    how = draw(st.sampled_from(["drop", "retype", "version", "extra", "raw"]))
    if how == "drop":
        field = draw(st.sampled_from(["schema_name", *_required(model)]))
        base.pop(field)
    elif how == "retype":
        base[draw(st.sampled_from(sorted(base)))] = draw(odd_values)
    elif how == "version":
        base["schema_version"] = draw(st.sampled_from([0, 4, 99, -1, "2", None, 2**64]))
    elif how == "extra":
        base[draw(st.text(min_size=1, max_size=8).filter(lambda k: k not in base))] = 1
    else:
        return draw(st.one_of(
            st.binary(max_size=64), st.just(b"\xff\xfe" + b"{}"), st.just(b"null"),
            st.just(_deep(100_000).encode()), st.just(b"x" * 4_000_001), st.just(b""),
        ))  # fmt: skip
    return json.dumps(base, allow_nan=True).encode()


def _required(model: type) -> list[str]:
    return [n for n, f in model.model_fields.items() if f.is_required()] or ["timestamp"]


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
    def run(raw: bytes) -> None:
        _refused_or_valid(raw, model)

    return run


test_kb_changes_fuzz = _fuzz(KbChange)
test_rag_queries_fuzz = _fuzz(QueryEvent)
test_worker_events_fuzz = _fuzz(WorkerEvent)
test_warmup_commands_fuzz = _fuzz(WarmupCommand)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bad_record(WarmupCommand))
def test_the_worker_refuses_bad_commands_without_stopping(raw: bytes) -> None:
    refused: list[str] = []
    handled: list[WarmupCommand] = []
    consumer = CommandConsumer(
        "x:1", {}, "w1", handled.append, on_malformed=lambda why, _cid: refused.append(why)
    )
    consumer._dispatch(raw)
    assert len(refused) + len(handled) <= 1
    if handled:
        assert isinstance(handled[0], WarmupCommand)
    else:
        assert not refused or refused[0]


def test_valid_records_pass() -> None:
    for model, event in VALID.items():
        assert decode(encode(event), model) == event
