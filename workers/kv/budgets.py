"""The seed's worker budget rules as pure functions: warmup token amount, quantization, chunks.

Each function quotes the figure it implements (seed 000, see ../shared/design.md "Facts from
the seeds"); the callers decide where a rule applies. The fleet's rules (3 progressive
warmup steps, a hot instance per node) are the streams app's: `streams.decide.progressive`,
`streams.decide.fleet.hot_targets`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from workers.kv.memory import GiB

# Seed: "warmup token amount = min(context_window × 25%, memory_bandwidth / (weight_bytes × 2))".
CONTEXT_WARMUP_SHARE = 0.25
# Seed: "quantized models need more warmup: FP16 +0%, AWQ +12%, GPTQ +8%".
QUANTIZATION_EXTRA = {"none": 0.0, "awq": 0.12, "gptq": 0.08}
# Seed: "vLLM prefill chunk size: A10G 512–768, A100-80G 1,024–1,536". A device class is read
# from its memory: up to a 24 GiB card (A10G) takes the A10G range, 40 GiB and up the A100's.
A10G_CHUNK = (512, 768)
A100_CHUNK = (1024, 1536)
A10G_CLASS_MAX_BYTES = 24 * GiB
A100_CLASS_MIN_BYTES = 40 * GiB
# CPUs (no accelerator memory) prefill in the A10G range's lower end: attention's cost per
# token there grows with the chunk, and a small chunk keeps a long prompt interruptible.
CPU_CHUNK = A10G_CHUNK[0]
# The warmup amount's bandwidth term needs the device's memory bandwidth; by device class,
# read from its memory like the prefill chunk, at the datasheet figure of the seed's cards:
# an A10G (600 GB/s) up to 24 GiB, an A100-40GB (1,555 GB/s) up to 40 GiB, an A100-80G
# (2,039 GB/s) above (an H100/H200 is faster: set it). A CPU: two DDR4-3200 channels
# (51.2 GB/s), a small server's or a VM's.
A10G_BANDWIDTH = 600e9
A100_40G_BANDWIDTH = 1555e9
A100_80G_BANDWIDTH = 2039e9
CPU_BANDWIDTH = 51.2e9
# Seed: "65% of a cold start is the first decode step": the boot warmup generates two
# tokens after its prompt, the second one being that first decode step.
BOOT_DECODE_TOKENS = 2


def warmup_token_amount(context_window: int, memory_bandwidth: float, weight_bytes: int) -> int:
    """The seed's warmup token amount: a quarter of the context, capped by bandwidth /
    (2 × weight bytes).

    With `memory_bandwidth` in bytes per second and `weight_bytes` in bytes the cap is half
    the weight-streaming passes the memory allows in a second: decoded tokens, one pass
    each (what it bounds: `boot_warmup_tokens`). An unknown bandwidth or weight size (0)
    leaves the context rule alone.
    """
    if context_window < 0 or memory_bandwidth < 0 or weight_bytes < 0:
        raise ValueError("context, bandwidth and weight bytes must be >= 0")
    by_context = int(context_window * CONTEXT_WARMUP_SHARE)
    if memory_bandwidth == 0 or weight_bytes == 0:
        return by_context
    return min(by_context, int(memory_bandwidth / (weight_bytes * 2)))


def default_memory_bandwidth(device_memory_bytes: int, *, accelerator: bool = True) -> float:
    """Bytes per second the device's memory delivers, by device class (see the constants)."""
    if not accelerator:
        return CPU_BANDWIDTH
    if device_memory_bytes <= A10G_CLASS_MAX_BYTES:
        return A10G_BANDWIDTH
    if device_memory_bytes < A100_CLASS_MIN_BYTES:
        return A100_40G_BANDWIDTH
    return A100_80G_BANDWIDTH


def boot_warmup_tokens(
    context_window: int, memory_bandwidth: float, weight_bytes: int, quantization: str
) -> int:
    """Prompt tokens of the throwaway request a worker runs before it reports ready.

    The seed's warmup token amount, with its quantization extra. What it bounds is the
    cold start of an instance, not the KV warmed: the seed lists it beside the cold start's
    causes (graph warmup, bandwidth contention while the weights are first read) and its
    split (65% in the first decode step), and its bandwidth term counts weight-streaming
    passes, the unit of decoding. Read as a KV budget it is absurd on the seed's own setup
    (600 GB/s over 2 × 14 GB of DeepSeek-V2 7B weights: 21 tokens, against RAG prefixes of
    a thousand); as one request's length it warms kernels and allocator at a realistic size
    without competing with the weights for the bus. Never more than the context minus the
    decode step (`BOOT_DECODE_TOKENS`).
    """
    amount = quantized_warmup(
        warmup_token_amount(context_window, memory_bandwidth, weight_bytes), quantization
    )
    return max(0, min(amount, context_window - BOOT_DECODE_TOKENS))


def quantization_method(config: Mapping[str, Any]) -> str:
    """`awq`, `gptq` or `none`, from a Hugging Face config's `quantization_config`."""
    quant = config.get("quantization_config") or {}
    method = str(quant.get("quant_method", "none")).lower()
    return method if method in QUANTIZATION_EXTRA else "none"


def quantized_warmup(tokens: int, method: str) -> int:
    """The warmup amount for a model quantized with `method` (rounded up: never less)."""
    try:
        extra = QUANTIZATION_EXTRA[method]
    except KeyError:
        valid = ", ".join(sorted(QUANTIZATION_EXTRA))
        raise ValueError(f"unknown quantization {method!r}; valid: {valid}") from None
    return math.ceil(tokens * (1.0 + extra))


def prefill_chunk_tokens(device_memory_bytes: int, *, accelerator: bool = True) -> int:
    """Default prefill chunk for a device class: the top of its seed range (fewer launches).

    Between the two classes (24–40 GiB cards) the A100 range's lower end applies.
    """
    if not accelerator:
        return CPU_CHUNK
    if device_memory_bytes <= A10G_CLASS_MAX_BYTES:
        return A10G_CHUNK[1]
    if device_memory_bytes < A100_CLASS_MIN_BYTES:
        return A100_CHUNK[0]
    return A100_CHUNK[1]


def chunk_spans(n_tokens: int, chunk: int) -> list[tuple[int, int]]:
    """[start, end) spans that prefill `n_tokens` in chunks of at most `chunk` tokens."""
    if chunk <= 0:
        raise ValueError("chunk must be > 0")
    return [(s, min(s + chunk, n_tokens)) for s in range(0, n_tokens, chunk)]
