"""The seed's warmup budget rules (seed 000), each tested against the figure it quotes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.budgets import (
    chunk_spans,
    prefill_chunk_tokens,
    progressive_steps,
    quantization_method,
    quantized_warmup,
    warmup_token_amount,
)
from workers.memory import GiB


def test_warmup_amount_is_a_quarter_of_the_context_when_bandwidth_allows() -> None:
    # 8k context, 600 GB/s, 270 MB of weights: the bandwidth cap (600e9 / 540e6 = 1,111) wins.
    assert warmup_token_amount(8192, 600e9, 270_000_000) == 1111
    assert warmup_token_amount(8192, 6e12, 270_000_000) == 2048  # "context_window × 25%"


def test_unknown_bandwidth_leaves_the_context_rule() -> None:
    assert warmup_token_amount(4096, 0, 1) == 1024


@pytest.mark.parametrize(("method", "expected"), [("none", 1000), ("awq", 1120), ("gptq", 1080)])
def test_quantized_models_warm_more(method: str, expected: int) -> None:
    # Seed: "FP16 +0%, AWQ +12%, GPTQ +8%".
    assert quantized_warmup(1000, method) == expected


def test_unknown_quantization_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="awq, gptq, none"):
        quantized_warmup(10, "int3")


def test_quantization_is_read_from_the_model_config() -> None:
    assert quantization_method({"quantization_config": {"quant_method": "AWQ"}}) == "awq"
    assert quantization_method({"quantization_config": {"quant_method": "bitsandbytes"}}) == "none"
    assert quantization_method({}) == "none"


def test_prefill_chunks_by_device_class() -> None:
    # Seed: "A10G 512–768, A100-80G 1,024–1,536".
    assert prefill_chunk_tokens(24 * GiB) in range(512, 769)
    assert prefill_chunk_tokens(80 * GiB) in range(1024, 1537)
    assert prefill_chunk_tokens(0, accelerator=False) == 512


@given(st.integers(0, 5000), st.integers(1, 2000))
def test_chunk_spans_cover_the_prompt_once(n: int, chunk: int) -> None:
    spans = chunk_spans(n, chunk)
    assert [i for s, e in spans for i in range(s, e)] == list(range(n))
    assert all(e - s <= chunk for s, e in spans)


@given(st.lists(st.integers(), max_size=50), st.integers(1, 6))
def test_progressive_steps_keep_order_and_count(items: list[int], steps: int) -> None:
    waves = progressive_steps(items, steps)
    assert [x for wave in waves for x in wave] == items
    assert len(waves) <= steps


def test_three_waves_by_default() -> None:
    # Seed router: "warmup_steps 3 (progressive)".
    assert progressive_steps(list(range(7))) == [[0, 1, 2], [3, 4, 5], [6]]
