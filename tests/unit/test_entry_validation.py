"""One validation for every entry point: Kafka commands meet the HTTP bounds before compute."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragwarm.client.ingest import Skipped, file_change
from schemas import DeadLetter, SchemaError, WarmupCommand, decode, encode
from schemas.deadletter import Origin
from schemas.events import MAX_TTL_S, MAX_VERSION, KbChange
from tests.unit.worker_fakes import runtime_and_sink
from workers.commands import CommandConsumer, addressing

HASH = "ab" * 16


def prefill(**fields: object) -> WarmupCommand:
    return WarmupCommand(command_id="c1", op="prefill", **{"token_ids": [1] * 8, **fields})


@pytest.mark.parametrize(
    ("token_ids", "why"),
    [([1, 2, 3, 500, 4, 5, 6, 7], "outside the vocabulary"), ([1] * 41, "more than the limit")],
)
def test_a_kafka_prefill_outside_the_bounds_is_refused_before_compute(token_ids, why) -> None:
    runtime, sink = runtime_and_sink()
    assert runtime.apply(prefill(token_ids=token_ids)) == "refused"
    refused = [e for e in sink.events if e.kind == "refused"]
    assert len(refused) == 1 and refused[0].command_id == "c1" and why in refused[0].reason
    assert len(runtime.engine.cache) == 0 and "stored" not in sink.kinds()


def test_a_valid_kafka_prefill_is_stored() -> None:
    runtime, sink = runtime_and_sink()
    assert runtime.apply(prefill()) == "stored"
    assert "refused" not in sink.kinds()


@pytest.mark.parametrize("ttl", ["Infinity", "NaN", "-1", "0", str(MAX_TTL_S * 2)])
def test_a_ttl_must_be_finite_positive_and_bounded(ttl: str) -> None:
    body = json.loads(prefill().model_dump_json())
    raw = json.dumps(body)[:-1] + f', "ttl_s": {ttl}}}'
    raw = raw.replace('"ttl_s": null, ', "")
    with pytest.raises(SchemaError, match="ttl_s"):
        decode(raw, WarmupCommand)


def test_versions_are_bounded_to_int64() -> None:
    KbChange(op="delete", doc_id="d", version=MAX_VERSION)
    with pytest.raises(ValueError, match="version"):
        KbChange(op="delete", doc_id="d", version=MAX_VERSION + 1)


def test_a_malformed_command_for_this_worker_is_refused_and_dead_lettered() -> None:
    calls: list[tuple[str, str | None]] = []
    letters: list[tuple[DeadLetter, bytes | None]] = []
    handled: list[WarmupCommand] = []
    consumer = CommandConsumer("x:1", {}, "w1", handled.append,
                               on_malformed=lambda r, c: calls.append((r, c)),
                               on_dead_letter=lambda x, k: letters.append((x, k)))  # fmt: skip
    bad = b'{"schema_name":"warmup_command","command_id":"c9","op":"prefill","ttl_s":Infinity}'
    consumer._dispatch(bad, Origin("warmup.commands", 3, 17, b"key", bad))
    consumer._dispatch(bad.replace(b'"op"', b'"worker_id":"w2","op"'))  # another worker's
    consumer._dispatch(encode(prefill()))
    assert len(calls) == 1 and calls[0][1] == "c9"
    assert len(handled) == 1 and len(letters) == 1
    # The letter of the streams app: origin, the decoder's reason and field, the payload.
    letter, key = letters[0]
    with pytest.raises(SchemaError) as refused:
        decode(bad, WarmupCommand)
    assert key == b"key" and letter.reason == str(refused.value) == calls[0][0]
    assert letter.error_field == refused.value.field == "ttl_s"
    assert (letter.source_topic, letter.partition, letter.offset) == ("warmup.commands", 3, 17)
    assert base64.b64decode(letter.value_b64) == bad and decode(encode(letter)) == letter
    runtime, sink = runtime_and_sink()
    runtime.send(runtime.refused_event(calls[0][0], calls[0][1]))
    assert sink.events[-1].kind == "refused" and sink.events[-1].reason


def test_a_command_id_that_cannot_be_sent_back_is_left_out_of_the_refusal() -> None:
    # JSON may spell a lone surrogate; no event can carry it (found by the topic fuzz).
    bad = b'{"schema_name":"warmup_command","command_id":"\\ud800","op":"prefill"}'
    assert addressing(bad) == (None, None)
    runtime, sink = runtime_and_sink()
    letters: list[DeadLetter] = []
    consumer = CommandConsumer("x:1", {}, "w1", lambda c: None,
                               on_malformed=lambda r, c: runtime.send(runtime.refused_event(r, c)),
                               on_dead_letter=lambda x, _k: letters.append(x))  # fmt: skip
    consumer._dispatch(bad)
    assert sink.events[-1].kind == "refused" and sink.events[-1].command_id is None
    assert len(letters) == 1


def test_a_record_that_fails_its_handling_never_stops_the_consumer() -> None:
    def refuse(_reason: str, _cid: str | None) -> None:
        raise RuntimeError("the event could not be built")

    letters: list[DeadLetter] = []
    consumer = CommandConsumer("x:1", {}, "w1", lambda c: None, on_malformed=refuse,
                               on_dead_letter=lambda x, _k: letters.append(x))  # fmt: skip
    consumer._dispatch_safely(Origin("warmup.commands", 0, 5, None, b"{"))
    assert len(letters) == 1  # dead-lettered first, then the refusal failed: logged, skipped


@given(st.binary(max_size=200))
def test_addressing_never_raises(value: bytes) -> None:
    cid, wid = addressing(value)
    assert cid is None or isinstance(cid, str) and cid
    assert wid is None or isinstance(wid, str)


def test_ingest_skips_symlinks_out_of_the_folder_and_fifos(tmp_path: Path) -> None:
    root, outside = tmp_path / "kb", tmp_path / "secret.md"
    root.mkdir()
    outside.write_text("not for the KB")
    (root / "inside.md").write_text("fine")
    (root / "leak.md").symlink_to(outside)
    (root / "alias.md").symlink_to(root / "inside.md")
    os.mkfifo(root / "pipe.md")
    leak = file_change(root, root / "leak.md", "t", 1000)
    pipe = file_change(root, root / "pipe.md", "t", 1000)
    assert isinstance(leak, Skipped) and leak.kind == "outside the folder"
    assert isinstance(pipe, Skipped) and pipe.kind == "not a regular file"
    alias = file_change(root, root / "alias.md", "t", 1000)
    assert isinstance(alias, KbChange) and alias.text == "fine"
