"""Pure parts of the worker's HTTP and Kafka contract: validation, bounds, framing, parsing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import SimpleNamespace

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import SchemaError, WarmupCommand, encode
from workers.api import (
    DONE,
    ApiError,
    CompletionRequest,
    Limits,
    check_completion,
    check_prompt,
    completion_body,
    parse,
    parse_warm_set,
    sse,
    usage,
)
from workers.commands import parse_command
from workers.engines.remote import (
    RemoteError,
    cached_from_usage,
    parse_sse,
    prometheus_counter,
    stream_events,
)
from workers.kv.sizing import kv_bytes_per_token
from workers.metrics import Served, WorkerMetrics

LIMITS = Limits(max_prompt_tokens=100, max_tokens=20, context_tokens=110, vocab_size=1000)


def completion(**body) -> CompletionRequest:
    return parse(CompletionRequest, {"prompt": "hi", **body})


def refused(fn, *args, **kw) -> ApiError:
    with pytest.raises(ApiError) as info:
        fn(*args, **kw)
    assert 400 <= info.value.status < 500 and info.value.message
    return info.value


# -- requests -------------------------------------------------------------------------


def test_missing_prompt_names_the_field() -> None:
    err = refused(parse, CompletionRequest, {"max_tokens": 3})
    assert err.param == "prompt" and err.message.startswith("prompt:")


def test_body_must_be_an_object() -> None:
    assert "JSON object" in refused(parse, CompletionRequest, [1, 2]).message


def test_unknown_openai_fields_are_ignored() -> None:
    req = completion(user="me", top_k=5, frequency_penalty=0.0)
    assert req.single_prompt() == "hi"


def test_a_batch_of_one_is_unwrapped_larger_batches_refused() -> None:
    assert completion(prompt=[[1, 2, 3]]).single_prompt() == [1, 2, 3]
    assert completion(prompt=["a"]).single_prompt() == "a"
    assert "one prompt" in refused(completion(prompt=["a", "b"]).single_prompt).message


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"max_tokens": 21}, "max_tokens"),
        ({"echo": True}, "echo"),
        ({"stop": "\n"}, "stop"),
        ({"top_p": 0.5}, "top_p"),
    ],
)
def test_unsupported_or_oversized_options(body: dict, param: str) -> None:
    assert refused(check_completion, completion(**body), LIMITS).param == param


@pytest.mark.parametrize(
    ("body", "param"),
    [({"n": 2}, "n"), ({"temperature": 2.5}, "temperature"), ({"max_tokens": 0}, "max_tokens")],
)
def test_out_of_range_values(body: dict, param: str) -> None:
    assert refused(parse, CompletionRequest, {"prompt": "x", **body}).param == param


def test_prompt_bounds() -> None:
    assert "empty" in refused(check_prompt, [], LIMITS).message
    assert "limit of 100" in refused(check_prompt, [1] * 101, LIMITS).message
    assert "context" in refused(check_prompt, [1] * 100, LIMITS, max_tokens=20).message
    assert "vocabulary" in refused(check_prompt, [1, 1000], LIMITS).message
    check_prompt([1] * 90, LIMITS, max_tokens=20)


def test_cache_salt_stands_for_an_unset_tenant() -> None:
    assert completion(cache_salt="acme").tenant == "acme"
    assert completion(cache_salt="acme", tenant="globex").tenant == "globex"
    assert completion().tenant == "default"


# -- responses ------------------------------------------------------------------------


def test_usage_reports_cached_tokens_and_ttft() -> None:
    u = usage(40, 5, 32, 12.3456)
    assert u["total_tokens"] == 45
    assert u["prompt_tokens_details"] == {"cached_tokens": 32, "blended_tokens": 0,
                                          "approx_cached_tokens": 0}
    assert u["ttft_ms"] == 12.346
    assert usage(40, 5, 16, 1.0, 12)["prompt_tokens_details"]["blended_tokens"] == 12
    assert usage(40, 5, 32, 1.0, 0, 16)["prompt_tokens_details"]["approx_cached_tokens"] == 16


def test_completion_body_is_openai_shaped() -> None:
    body = completion_body("cmpl-1", "m", "text", "length", usage(1, 1, 0, 1.0), created=7)
    assert body["object"] == "text_completion" and body["created"] == 7
    assert body["choices"] == [
        {"index": 0, "text": "text", "logprobs": None, "finish_reason": "length"}
    ]
    assert "usage" not in completion_body("cmpl-1", "m", "t", None, None)


def test_error_body_shape() -> None:
    body = ApiError(401, "no", kind="authentication_error").body()
    assert body == {
        "error": {"message": "no", "type": "authentication_error", "param": None, "code": None}
    }


@given(st.dictionaries(st.text(), st.text() | st.integers() | st.none(), max_size=5))
def test_sse_frames_are_one_data_line_that_round_trips(payload: dict) -> None:
    frame = sse(payload)
    assert frame.startswith(b"data: ") and frame.endswith(b"\n\n")
    line = frame[:-2]
    assert b"\n" not in line and b"\r" not in line  # JSON escapes line breaks
    assert json.loads(line[6:]) == payload


def events(body: bytes, content_type: str = "text/event-stream") -> Iterator:
    """The events of a streamed response with this body."""
    return stream_events(httpx.Response(200, headers={"content-type": content_type},
                                        content=body))


def test_done_frame() -> None:
    assert DONE == b"data: [DONE]\n\n"
    body = sse({"n": 1}) + b": a comment\n\n" + DONE + sse({})
    assert list(parse_sse(events(body))) == [{"n": 1}]


def test_a_payload_over_several_data_lines_is_one_event() -> None:
    body = b'event: completion\ndata: {"n":\ndata: 2}\n\n' + DONE
    assert list(parse_sse(events(body))) == [{"n": 2}]


def test_error_in_a_stream_raises() -> None:
    with pytest.raises(RemoteError, match="boom"):
        list(parse_sse(events(b'data: {"error": {"message": "boom"}}\n\n')))


def test_a_response_that_is_not_a_stream_is_an_error() -> None:
    with pytest.raises(RemoteError, match="did not stream events"):
        list(parse_sse(events(b'{"error": "overloaded"}', "application/json")))


# -- warm set -------------------------------------------------------------------------


def test_warm_set_formats() -> None:
    jsonl = '{"prompt": "a", "tenant": "t"}\n\n[1, 2, 3]\n"plain text"\n'
    items = parse_warm_set(jsonl)
    assert [(i.prompt, i.token_ids, i.tenant, i.pin) for i in items] == [
        ("a", None, "t", True),
        (None, [1, 2, 3], "default", True),
        ("plain text", None, "default", True),
    ]
    as_list = parse_warm_set(json.dumps([{"token_ids": [5], "pin": False}, "x"]))
    assert [(i.token_ids, i.pin) for i in as_list] == [([5], False), (None, True)]
    assert len(parse_warm_set(json.dumps({"items": ["x", "y"]}))) == 2
    assert parse_warm_set("[1, 2]")[0].token_ids == [1, 2]
    assert parse_warm_set("  \n") == []


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('{"prompt": "a"}\n{oops\n', "line 2"),
        ('[{"prompt": "a", "token_ids": [1]}]', "item 1"),
        ('["a", {"tenant": "t"}]', "item 2"),
        ('[{"prompt": "a", "colour": "red"}]', "colour"),
        ("[true]", "item 1"),
    ],
)
def test_warm_set_errors_name_the_place(text: str, where: str) -> None:
    with pytest.raises(ValueError, match=where):
        parse_warm_set(text)


# -- commands -------------------------------------------------------------------------


def test_commands_for_this_worker_or_everyone() -> None:
    def cmd(worker_id: str | None) -> bytes:
        return encode(
            WarmupCommand(command_id="c", op="release", prefix_hash="ab" * 16, worker_id=worker_id)
        )

    assert parse_command(cmd(None), "w1") is not None
    assert parse_command(cmd("w1"), "w1") is not None
    assert parse_command(cmd("w2"), "w1") is None


@pytest.mark.parametrize(
    "value",
    [None, b"\xff", b"[]", b'{"schema_name": "warmup_command", "command_id": "c", "op": "x"}'],
)
def test_malformed_commands_raise_schema_errors(value: bytes | None) -> None:
    with pytest.raises(SchemaError):
        parse_command(value, "w1")


# -- remote counters ------------------------------------------------------------------

EXPOSITION = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 120.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 30.0
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9
vllm:gpu_prefix_cache_hits 64
"""


def test_prometheus_counters_sum_labels_and_fall_back_to_old_names() -> None:
    queries = ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries")
    hits = ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits")
    assert prometheus_counter(EXPOSITION, queries) == 150.0
    assert prometheus_counter(EXPOSITION, hits) == 64.0
    assert prometheus_counter(EXPOSITION, ("sglang:nothing",)) is None


def test_cached_tokens_from_usage() -> None:
    assert cached_from_usage({"prompt_tokens_details": {"cached_tokens": 48}}) == 48
    assert cached_from_usage({"prompt_tokens_details": None}) is None
    assert cached_from_usage(None) is None


def test_kv_bytes_per_token_from_an_hf_config() -> None:
    config = {
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "hidden_size": 576,
    }
    assert kv_bytes_per_token(config, 2) == 2 * 30 * 3 * 64 * 2
    assert kv_bytes_per_token({"text_config": config}, 4) == 2 * 30 * 3 * 64 * 4
    # The same function reads a config object (the torch and vLLM engines pass one).
    assert kv_bytes_per_token(SimpleNamespace(**config), 2) == 2 * 30 * 3 * 64 * 2


# -- metrics --------------------------------------------------------------------------


def test_metrics_count_hits_misses_and_cold_starts() -> None:
    m = WorkerMetrics(worker_id="w", model_name="m")
    m.observe(
        Served(prompt_tokens=40, cached_tokens=0, full_blocks=2, ttft_s=1.0, cache_was_empty=True)
    )
    m.observe(
        Served(prompt_tokens=40, cached_tokens=32, full_blocks=2, ttft_s=0.1, cache_was_empty=False)
    )
    m.observe(
        Served(prompt_tokens=10, cached_tokens=0, full_blocks=0, ttft_s=0.1, cache_was_empty=False)
    )
    r = m.registry
    assert r.get_sample_value("ragwarm_worker_cold_starts_total") == 1
    assert r.get_sample_value("ragwarm_worker_kv_cache_misses_total") == 1  # short can't miss
    assert r.get_sample_value("warmup_hit_rate") == pytest.approx(1 / 3)  # seed 000's alias
    assert r.get_sample_value("vllm:prefix_cache_queries_total", {"model_name": "m"}) == 90
    assert r.get_sample_value("vllm:prefix_cache_hits_total", {"model_name": "m"}) == 32
    assert r.get_sample_value("first_token_latency_count") == 3
    assert b"first_token_latency_bucket" in m.render()
