"""The seed's warmup budget rules (seed 000), each tested against the figure it quotes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.kv.budgets import (
    BOOT_DECODE_TOKENS,
    boot_warmup_tokens,
    chunk_spans,
    default_memory_bandwidth,
    prefill_chunk_tokens,
    quantization_method,
    quantized_warmup,
    warmup_token_amount,
)
from workers.kv.memory import GiB


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


def test_bandwidth_defaults_by_device_class() -> None:
    # The seed's cards at their datasheet figures; a CPU at two DDR4-3200 channels.
    assert default_memory_bandwidth(24 * GiB) == 600e9  # A10G
    assert default_memory_bandwidth(80 * GiB) == 2039e9  # A100-80G
    assert default_memory_bandwidth(32 * GiB) == 1555e9  # between the two: A100-40GB
    assert default_memory_bandwidth(0, accelerator=False) == 51.2e9


def test_boot_warmup_on_the_seeds_setup() -> None:
    # Seed 000: DeepSeek-V2 7B (14 GB in FP16) on an A10G (600 GB/s), a 4k context:
    # min(4096 × 25%, 600e9 / (14e9 × 2)) = 21 tokens; "AWQ +12%, GPTQ +8%" round up.
    assert boot_warmup_tokens(4096, 600e9, 14_000_000_000, "none") == 21
    assert boot_warmup_tokens(4096, 600e9, 14_000_000_000, "awq") == 24  # 21 × 1.12 = 23.5
    assert boot_warmup_tokens(4096, 600e9, 14_000_000_000, "gptq") == 23  # 21 × 1.08 = 22.7


def test_boot_warmup_of_smollm2() -> None:
    # SmolLM2-135M in float32 (538 MB) on a CPU: the bandwidth term, 51.2e9 / 1.076e9 = 47.
    assert boot_warmup_tokens(8192, 51.2e9, 538_000_000, "none") == 47
    # In bfloat16 on an 80 GB card the context rule wins: 8192 × 25% = 2048.
    assert boot_warmup_tokens(8192, 2039e9, 269_000_000, "none") == 2048


def test_boot_warmup_leaves_room_for_the_decode_step() -> None:
    # A quarter of the context plus 12% still fits; a tiny context keeps the decode step.
    assert boot_warmup_tokens(8, 0, 0, "awq") == 3  # ceil(2 × 1.12)
    assert boot_warmup_tokens(2, 0, 0, "awq") == 0
    assert boot_warmup_tokens(4, 0, 0, "awq") + BOOT_DECODE_TOKENS <= 4
