"""The PyTorch/transformers engine: prefix KV kept as tensors and reused without copying."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache
from transformers.cache_utils import DynamicLayer

from workers.cache import CacheEntry, PrefixCache, WarmupRefused
from workers.engines.base import (
    GenerationResult,
    GenerationStep,
    KeepPrompt,
    PrefillResult,
    PrefixEngine,
    Request,
)
from workers.memory import plan_budget
from workers.settings import WorkerSettings

# Per layer (keys, values), each [1, kv_heads, tokens, head_dim]; never modified once stored.
KV = tuple[tuple[torch.Tensor, torch.Tensor], ...]

# Context length assumed when the model config names none.
FALLBACK_CONTEXT = 8192
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> str:
    """`auto` becomes cuda when a CUDA device is present, else cpu."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("RAGWARM_WORKER_DEVICE=cuda but torch sees no CUDA device")
    return name


def resolve_dtype(name: str, device: str) -> torch.dtype:
    """`auto` is float32 on CPU (fastest there) and bfloat16 on CUDA."""
    if name == "auto":
        return torch.float32 if device == "cpu" else torch.bfloat16
    return _DTYPES[name]


def device_memory(device: str) -> int:
    """Total memory of the device the KV lives on (physical RAM for the CPU)."""
    if device.startswith("cuda"):
        return int(torch.cuda.mem_get_info(torch.device(device))[1])
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def load_torch_engine(
    path: Path, settings: WorkerSettings, *, cache: PrefixCache | None = None
) -> TorchEngine:
    """Load an HF causal LM directory (never from a hub) into a ready engine."""
    torch.set_num_threads(settings.threads or os.cpu_count() or 1)
    device = resolve_device(settings.device)
    model: Any = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=resolve_dtype(settings.dtype, device), local_files_only=True
    )
    model.to(device)
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model_id = settings.model_id or Path(path).resolve().name
    return TorchEngine(model, tokenizer, model_id=model_id, settings=settings, cache=cache)


class TorchEngine(PrefixEngine[KV]):
    """Runs a transformers causal LM and keeps the KV of prefixes the cache admitted."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        model_id: str,
        settings: WorkerSettings,
        cache: PrefixCache | None = None,
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.device = str(next(model.parameters()).device)
        self.block_size = settings.block_size
        _require_full_attention(model.config)
        # `is None`, not `or`: an empty cache is falsy (it has a length).
        self.cache = cache if cache is not None else _default_cache(self.device, settings)
        if self.cache.block_size != self.block_size:
            raise ValueError(f"cache block_size {self.cache.block_size} != {self.block_size}")
        self._held: dict[str, KV] = {}
        self._stop_ids = _eos_ids(model, tokenizer)

    # -- tokens ----------------------------------------------------------------------

    @property
    def max_model_len(self) -> int:
        cfg = self.model.config.get_text_config(decoder=True)
        found = (getattr(cfg, key, None) for key in _CONTEXT_KEYS)
        return int(next((n for n in found if n), FALLBACK_CONTEXT))

    @property
    def vocab_size(self) -> int:
        # Ids the embedding accepts and the tokenizer can decode.
        cfg = self.model.config.get_text_config(decoder=True)
        return min(len(self.tokenizer), int(cfg.vocab_size or len(self.tokenizer)))

    @property
    def kv_bytes_per_token(self) -> int:
        cfg = self.model.config.get_text_config(decoder=True)
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return 2 * cfg.num_hidden_layers * heads * head_dim * self.model.dtype.itemsize

    # -- cache -----------------------------------------------------------------------

    def stored_kv(self, prefix_hash: str) -> KV | None:
        """The tensors stored for a cached prefix (read-only; for tests and benchmarks)."""
        return self._held.get(prefix_hash)

    def _held_bytes(self, held: KV) -> int:
        return _nbytes(held)

    def _prefix_kv(self, tokens: list[int], hashes: list[str], tenant: str) -> tuple[KV, int]:
        kv = self._held.get(hashes[-1])
        return (kv, 0) if kv is not None else self._compute_prefix(tokens, hashes)

    def _compute_prefix(self, tokens: list[int], hashes: list[str]) -> tuple[KV, int]:
        """KV of exactly `tokens`, computing only what no cached prefix already holds."""
        # peek, not lookup: a warmup is not a hit and must not reorder eviction.
        entry, matched = self.cache.peek(hashes)
        base_kv = self._held.get(entry.prefix_hash) if entry is not None else None
        base = matched * self.block_size if base_kv is not None else 0
        if base_kv is not None and base == len(tokens):
            # A longer entry holds all of it: copy the slice so this entry owns its memory.
            return tuple(
                (k[..., :base, :].clone(), v[..., :base, :].clone()) for k, v in base_kv
            ), 0
        past = self._request_cache(base_kv, base)
        self._forward(tokens[base:], past)
        return _freeze(past), len(tokens) - base

    # -- generation ------------------------------------------------------------------

    def _generate(self, request: Request) -> Iterator[GenerationStep]:
        prompt, tenant, keep = request.prompt, request.tenant, request.keep
        stops = frozenset(request.stop_ids) if request.stop_ids is not None else self._stop_ids
        start = time.perf_counter()
        hashes = self.block_hashes(prompt, tenant=tenant)
        entry, matched = self._reusable(hashes)
        # At least the last prompt token must run through the model to give logits.
        cached = min(matched, len(prompt) - 1)
        past = self._request_cache(self._held[entry.prefix_hash] if entry else None, cached)
        logits = self._forward(prompt[cached:], past)
        # References, not copies: decoding rebinds the layers to new tensors (torch.cat).
        pending = _freeze(past) if keep and matched < len(hashes) * self.block_size else None
        stored: PrefillResult | None = None
        stream, out, ttft = _TextStream(self.tokenizer), [], 0.0
        for index in range(request.max_tokens):
            token = _pick(logits, request.temperature)
            if index == 0:
                ttft = time.perf_counter() - start
            stopped = token in stops
            if not stopped:
                out.append(token)
            text = "" if stopped else stream.push(token)
            final = stopped or index == request.max_tokens - 1
            if pending is not None and keep is not None and (index > 0 or final):
                # Stored once the first token is out, so caching never delays it.
                stored = self._keep_prompt(pending, hashes, tenant, keep, cached)
                pending = None
            if final:
                result = GenerationResult(
                    token_ids=tuple(out),
                    text=stream.text(),
                    prompt_tokens=len(prompt),
                    cached_tokens=cached,
                    prefix_hash=entry.prefix_hash if entry else None,
                    ttft_s=ttft,
                    total_s=time.perf_counter() - start,
                    finish_reason="stop" if stopped else "length",
                    stored=stored,
                )
                yield GenerationStep(index, token, text + stream.flush(), result)
                return
            yield GenerationStep(index, token, text)
            logits = self._forward([token], past)

    def _reusable(self, hashes: list[str]) -> tuple[CacheEntry | None, int]:
        """The cached entry to reuse and how many leading prompt tokens its KV holds."""
        entry, matched = self._lookup(hashes)
        if entry is None or entry.prefix_hash not in self._held:
            return None, 0
        return entry, matched * self.block_size

    def _keep_prompt(
        self, prompt_kv: KV, hashes: list[str], tenant: str, keep: KeepPrompt, cached: int
    ) -> PrefillResult | None:
        """Store the prompt's full blocks from the request's own KV; None when refused."""
        start = time.perf_counter()
        n_tokens = len(hashes) * self.block_size
        kv = _head(prompt_kv, n_tokens)
        try:
            entry, evicted = self.cache.admit(
                tenant=tenant,
                hashes=hashes,
                nbytes=_nbytes(kv),
                chunk_refs=keep.chunk_refs,
                ttl_s=keep.ttl_s,
            )
        except WarmupRefused:
            return None  # the answer matters more than caching its prompt
        return self._record(entry, kv, evicted, n_tokens - cached, start)

    # -- model -----------------------------------------------------------------------

    def _request_cache(self, kv: KV | None, n_tokens: int) -> DynamicCache:
        """A fresh cache whose layers start as views of stored KV (no copy).

        The model appends with torch.cat, which makes new tensors: the stored ones stay intact.
        """
        past = DynamicCache(config=self.model.config)
        if kv is None or n_tokens == 0:
            return past
        for layer, (keys, values) in zip(_layers(past), kv, strict=True):
            layer.lazy_initialization(keys, values)
            layer.keys = keys[..., :n_tokens, :]
            layer.values = values[..., :n_tokens, :]
        return past

    def _forward(self, tokens: list[int], past: DynamicCache) -> torch.Tensor:
        """Run `tokens` after `past` (which grows); the logits of the last position."""
        with torch.inference_mode():
            ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
            out = self.model(input_ids=ids, past_key_values=past, use_cache=True, logits_to_keep=1)
            return out.logits[0, -1]


class _TextStream:
    """Incremental detokenization that never splits a multi-byte character."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._emitted = 0

    def text(self) -> str:
        return str(self._tokenizer.decode(self._ids, skip_special_tokens=True))

    def push(self, token: int) -> str:
        self._ids.append(token)
        text = self.text()
        # Byte-level BPE: a character may span tokens; U+FFFD marks an unfinished one.
        if text.endswith("\ufffd"):
            return ""
        return self._take(text)

    def flush(self) -> str:
        return self._take(self.text())

    def _take(self, text: str) -> str:
        delta = text[self._emitted :]
        self._emitted = len(text)
        return delta


def _default_cache(device: str, settings: WorkerSettings) -> PrefixCache:
    budget = plan_budget(device_memory(device), settings.kv_bytes, max_entries=settings.max_entries)
    return PrefixCache(
        budget,
        policy=settings.eviction_policy,
        default_ttl_s=settings.ttl_s,
        block_size=settings.block_size,
    )


def _layers(past: DynamicCache) -> list[DynamicLayer]:
    # _require_full_attention made sure every layer is a DynamicLayer.
    return cast(list[DynamicLayer], past.layers)


def _freeze(past: DynamicCache) -> KV:
    """The tensors a request cache ended with, to store as an entry's KV."""
    kv = [(layer.keys, layer.values) for layer in _layers(past)]
    if any(k is None or v is None for k, v in kv):
        raise RuntimeError("a cache layer was never filled")
    return tuple((cast(torch.Tensor, k), cast(torch.Tensor, v)) for k, v in kv)


def _head(kv: KV, n_tokens: int) -> KV:
    """The first `n_tokens` of `kv`: the tensors themselves when that is all of them, else
    copies, so an entry never keeps a longer request's memory alive."""
    if all(k.shape[-2] == n_tokens for k, _ in kv):
        return kv
    return tuple((k[..., :n_tokens, :].clone(), v[..., :n_tokens, :].clone()) for k, v in kv)


def _pick(logits: torch.Tensor, temperature: float) -> int:
    with torch.inference_mode():
        if temperature <= 0:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        return int(torch.multinomial(probs, 1))


def _nbytes(kv: KV) -> int:
    return sum(k.nbytes + v.nbytes for k, v in kv)


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), tokenizer):
        eos = getattr(source, "eos_token_id", None)
        ids.update(eos if isinstance(eos, list | tuple) else [] if eos is None else [eos])
    return frozenset(int(i) for i in ids)


def _require_full_attention(config: Any) -> None:
    """Stored prefixes are plain full-attention KV; sliding or linear layers are refused."""
    layers = DynamicCache(config=config).layers
    odd = {type(layer).__name__ for layer in layers if type(layer) is not DynamicLayer}
    if odd:
        raise ValueError(f"the torch engine supports full-attention models only, not {sorted(odd)}")
