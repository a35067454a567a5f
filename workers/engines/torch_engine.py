"""The PyTorch/transformers engine: KV kept per block, shared by every prompt holding it."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache
from transformers.cache_utils import DynamicLayer

from workers.calibration import blend_setting, load_calibration, reuse_mode
from workers.engines.base import PrefixEngine, Request
from workers.engines.blend import Selection, as_cache
from workers.engines.chunk_reuse import ChunkBlender
from workers.engines.kv_blocks import (
    KV,
    BlockKV,
    chain_cache,
    cut_blocks,
    join,
    resolve_kv_dtype,
)
from workers.engines.kv_tier import KVTier
from workers.engines.protocol import GenerationResult, GenerationStep, KeepPrompt, PrefillResult
from workers.engines.tiered import Tiered
from workers.engines.tiers import open_tier
from workers.kv.budgets import (
    boot_warmup_tokens,
    chunk_spans,
    default_memory_bandwidth,
    prefill_chunk_tokens,
    quantization_method,
)
from workers.kv.cache import CacheEntry, PrefixCache, WarmupRefused
from workers.kv.chunk_kv import DonorIndex
from workers.kv.plan import KVPlan
from workers.kv.sizing import cache_for, kv_bytes_per_token
from workers.kv.tier_journal import TierJournal
from workers.settings import WorkerSettings

log = logging.getLogger(__name__)

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


def blend_selection(settings: WorkerSettings, model_id: str) -> Selection | None:
    """How this worker blends chunk KV (None: it does not), as the model's quality gate
    decides (`workers.calibration`); logs one line saying why."""
    calibration = load_calibration(model_id, settings.chunk_calibration)
    share, reason = blend_setting(settings, calibration)
    forced = reuse_mode(settings.chunk_reuse) == "on"
    log.log(logging.WARNING if forced else logging.INFO, "%s", reason)
    return None if share is None else Selection(method=settings.chunk_selection, share=share)


def load_torch_engine(
    path: Path,
    settings: WorkerSettings,
    *,
    cache: PrefixCache | None = None,
    tier_path: Path | None = None,
) -> TorchEngine:
    """Load an HF causal LM directory (never from a hub) into a ready engine; with
    `disk_tier` on, its tier (in `disk_tier_path`, else `tier_path`) is scanned first, and
    with `host_tier_bytes` it gets a host-memory tier."""
    torch.set_num_threads(settings.threads or os.cpu_count() or 1)
    device = resolve_device(settings.device)
    model: Any = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=resolve_dtype(settings.dtype, device), local_files_only=True
    )
    model.to(device)
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model_id = settings.model_id or Path(path).resolve().name
    tier = open_tier(model, settings, tier_path)
    return TorchEngine(
        model, tokenizer, model_id=model_id, settings=settings, cache=cache, tier=tier
    )


@dataclass(frozen=True)
class Pending:
    """A chain's KV waiting for the cache's admission: `kv` covers the whole chain; its
    blocks from `first` on were computed (the ones before it were stored when it began)."""

    kv: KV | None
    first: int
    n_blocks: int
    approx_from: int | None = None  # blocks from here on hold a blend's KV


class TorchEngine(Tiered, PrefixEngine[Pending]):
    """Runs a transformers causal LM and keeps the KV of the blocks the cache holds.

    Tensors live here, per block hash (`_blocks`); the cache decides which blocks stay and
    names the ones it freed, which `sync` drops.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        model_id: str,
        settings: WorkerSettings,
        cache: PrefixCache | None = None,
        tier: KVTier | None = None,
    ) -> None:
        self.model = model.eval()
        # Blocks are stored in `kv_dtype` and computed on in the model's dtype.
        self.kv_dtype = resolve_kv_dtype(settings.kv_dtype, model.dtype)
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.device = str(next(model.parameters()).device)
        self.block_size = settings.block_size
        self.prefill_chunk_tokens = (
            settings.prefill_chunk_tokens or default_prefill_chunk(self.device)
        )
        _require_full_attention(model.config)
        self.boot_warmup_tokens = (
            default_boot_warmup(model, self.device, self.max_model_len, settings)
            if settings.boot_warmup
            else 0
        )
        # `is None`, not `or`: an empty cache is falsy (it has a length).
        self.cache = cache if cache is not None else _default_cache(self.device, settings)
        if self.cache.block_size != self.block_size:
            raise ValueError(f"cache block_size {self.cache.block_size} != {self.block_size}")
        self._held: dict[str, Pending] = {}  # unused: KV is kept per block
        # Called between a prompt's forward passes (`workers.engine_lock`: a warmup lets a
        # waiting request go first), returns the seconds it gave away; None: back to back.
        self.between_passes: Callable[[], float] | None = None
        self._blocks: dict[str, BlockKV] = {}
        self.tier = tier
        self._tier_view: tuple[int, list[str]] = (-1, [])
        if tier is not None:
            self.cache.tier = TierJournal(write_through=tier.durable)
        self._stop_ids = _eos_ids(model, tokenizer)
        self.donors = DonorIndex(self.block_size)
        self.chunks = ChunkBlender(
            self, blend_selection(settings, model_id), gate=settings.chunk_blend_gate
        )

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
        return kv_bytes_per_token(self.model.config, self.kv_dtype.itemsize)

    # -- cache -----------------------------------------------------------------------

    @property
    def block_bytes(self) -> int:
        return self.kv_bytes_per_token * self.block_size

    def stored_blocks(self, prefix_hash: str) -> list[BlockKV] | None:
        """The block tensors of a cached prefix (read-only; for tests and benchmarks)."""
        self.sync()
        entry = self.cache.get(prefix_hash)
        if entry is None or any(h not in self._blocks for h in entry.block_hashes):
            return None
        return self._chain(list(entry.block_hashes))

    def stored_kv(self, prefix_hash: str) -> KV | None:
        """A copy of a cached prefix's KV, joined from its blocks (for tests and benchmarks)."""
        blocks = self.stored_blocks(prefix_hash)
        return None if blocks is None else join(blocks, self.model.dtype)

    def apply(self, plan: KVPlan) -> int:
        """Write the blocks the plan stores to the KV tier (the evicted ones spill, stale
        ones leave it), then drop the tensors of the blocks it frees; the bytes freed."""
        self._store(plan.store)
        return sum(self._blocks.pop(h).nbytes for h in plan.free if h in self._blocks)

    def _held_bytes(self, held: Pending) -> int:
        return held.n_blocks * self.block_bytes

    def _prefix_kv(self, tokens: list[int], hashes: list[str], tenant: str) -> tuple[Pending, int]:
        """KV of exactly `tokens`, computing only the blocks no cached chain holds."""
        have = self._held_run(hashes, tenant)
        if have == len(hashes):
            return Pending(None, have, have), 0
        base = have * self.block_size
        past = chain_cache(
            self.model.config, self._chain(hashes[:have]), base, self.model.dtype
        )
        self._forward(tokens[base:], past)
        return Pending(_freeze(past), have, len(hashes)), len(tokens) - base

    def _keep(self, entry: CacheEntry, held: Pending) -> None:
        """Store the tensors of the entry's blocks that are not stored yet."""
        chain = entry.block_hashes
        # From the first block, not `held.first`: a prefill that let requests run between its
        # passes may find blocks it started from evicted meanwhile; its KV still has them.
        missing = [i for i in range(len(chain)) if chain[i] not in self._blocks]
        if not missing or held.kv is None:
            return
        first = missing[0]
        blocks = cut_blocks(
            held.kv, first, len(chain) - first, self.block_size, self.kv_dtype
        )
        for h, block in zip(chain[first:], blocks, strict=True):
            self._blocks.setdefault(h, block)

    def _stored_run(self, hashes: list[str]) -> int:
        """How many leading `hashes` have tensors here (all of them, unless the cache was
        filled by someone else)."""
        return next((i for i, h in enumerate(hashes) if h not in self._blocks), len(hashes))

    def held_run(self, hashes: list[str], *, hit: bool) -> list[BlockKV]:
        """The leading blocks of `hashes` held here; `hit`: a lookup (counts a use, touches
        the policy), else a peek."""
        _, matched = self._lookup(hashes) if hit else self.cache.peek(hashes)
        return self._chain(hashes[: self._stored_run(hashes[:matched])])

    def _held_blocks(self, chain: tuple[str, ...]) -> int:
        held = len(self.held_run(list(chain), hit=False))
        return min(held, self.cache.pool.exact_run(chain))

    def _chain(self, hashes: list[str]) -> list[BlockKV]:
        return [self._blocks[h] for h in hashes]

    # -- generation ------------------------------------------------------------------

    def _generate(self, request: Request) -> Iterator[GenerationStep]:
        prompt, tenant, keep = request.prompt, request.tenant, request.keep
        stops = frozenset(request.stop_ids) if request.stop_ids is not None else self._stop_ids
        start = time.perf_counter()
        hashes = self.block_hashes(prompt, tenant=tenant)
        entry, have = self._reusable(hashes, tenant)
        # The cached head holds its chunks' KV too (a warmup's prefix, which came with no
        # chunk positions): donated now that a request says where they stand.
        self._donate(tenant, prompt, request.chunks, hashes[:have])
        # At least the last prompt token must run through the model to give logits.
        cached = min(have * self.block_size, len(prompt) - 1)
        approx_cached = max(0, cached - self.cache.pool.exact_run(hashes[:have]) * self.block_size)
        past, logits, blended = self._prompt_kv(request, self._chain(hashes[:have]), cached)
        # References, not copies: decoding rebinds the layers to new tensors (torch.cat).
        # A blended prompt is stored too, its blocks past the exact head marked approximate:
        # a later ask of it reads the KV this answer was computed from, which passed the
        # model's blend gate; they donate no chunks and keep the mark in a tier (`Block.approx`).
        store = keep and have < len(hashes)
        approx_from = cached // self.block_size if blended else None
        pending = Pending(_freeze(past), have, len(hashes), approx_from) if store else None
        stored: PrefillResult | None = None
        stream, out, ttft = _TextStream(self.tokenizer), [], 0.0
        # A seeded request samples from its own generator: reproducible, whatever ran before.
        rng = None if request.seed is None else torch.Generator().manual_seed(request.seed)
        for index in range(request.max_tokens):
            token = _pick(logits, request.temperature, rng, request.top_k)
            if index == 0:
                ttft = time.perf_counter() - start
            stopped = token in stops
            if not stopped:
                out.append(token)
            text = "" if stopped else stream.push(token)
            final = stopped or index == request.max_tokens - 1
            if pending is not None and keep is not None and (index > 0 or final):
                # Stored once the first token is out, so caching never delays it.
                stored = self._keep_prompt(pending, hashes, request, cached)
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
                    blended_tokens=blended,
                    approx_cached_tokens=approx_cached,
                )
                yield GenerationStep(index, token, text + stream.flush(), result)
                return
            yield GenerationStep(index, token, text)
            logits = self._forward([token], past)

    def _prompt_kv(
        self, request: Request, exact: list[BlockKV], cached: int
    ) -> tuple[DynamicCache, torch.Tensor, int]:
        """The prompt's KV after the exact prefix, the last logits, and the tokens blended
        from chunk KV (0 when the prompt was computed normally)."""
        blended = self.chunks.blend(request, exact, cached)
        if blended is not None:
            result, n_blended = blended
            return as_cache(self.model, result.kv), result.logits, n_blended
        past = chain_cache(self.model.config, exact, cached, self.model.dtype)
        return past, self._forward(request.prompt[cached:], past), 0

    def _keep_prompt(
        self, pending: Pending, hashes: list[str], request: Request, cached: int
    ) -> PrefillResult | None:
        """Store the prompt's new full blocks from the request's own KV as request blocks
        (evictable; warm prefixes stay as they are) and donate its chunks; None when refused."""
        start, keep = time.perf_counter(), cast(KeepPrompt, request.keep)
        spans = request.chunks
        try:
            entry, evicted = self.cache.admit(
                tenant=request.tenant,
                hashes=hashes,
                nbytes=self._held_bytes(pending),
                chunk_refs=[*keep.chunk_refs, *(s.ref for s in spans)],
                ttl_s=keep.ttl_s,
                kind="request",
                chunk_starts={s.ref: s.start for s in spans},
                approx_from=pending.approx_from,
            )
        except WarmupRefused:
            return None  # the answer matters more than caching its prompt
        computed = len(hashes) * self.block_size - cached
        stored = self._record(entry, pending, evicted, computed, start)
        self._donate(request.tenant, request.prompt, spans, hashes)
        return stored

    # -- model -----------------------------------------------------------------------

    def _forward(self, tokens: list[int], past: DynamicCache) -> torch.Tensor:
        """Run `tokens` after `past` (which grows), `prefill_chunk_tokens` a pass; the
        logits of the last position."""
        began = time.perf_counter()
        with torch.inference_mode():
            for start, end in chunk_spans(len(tokens), self.prefill_chunk_tokens):
                if start and self.between_passes is not None:
                    began += self.between_passes()  # the compute-cost sample excludes it
                ids = torch.tensor([tokens[start:end]], dtype=torch.long, device=self.device)
                out = self.model(
                    input_ids=ids, past_key_values=past, use_cache=True, logits_to_keep=1
                )
            logits = out.logits[0, -1]
        if len(tokens) >= self.block_size:  # a decode step's cost is mostly not per token
            self.chunks.costs.saw_prefill(len(tokens), time.perf_counter() - began)
        self._saw_compute(len(tokens), began)
        return logits


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


def default_prefill_chunk(device: str) -> int:
    """The seed's prefill chunk for the device's class, read from its memory."""
    accelerator = not device.startswith("cpu")
    return prefill_chunk_tokens(device_memory(device), accelerator=accelerator)


def default_boot_warmup(model: Any, device: str, context: int, settings: WorkerSettings) -> int:
    """The seed's warmup token amount for this model on this device (`boot_warmup_tokens`):
    its weights as loaded, the quantization its config names, the device's bandwidth."""
    accelerator = not device.startswith("cpu")
    bandwidth = settings.memory_bandwidth or default_memory_bandwidth(
        device_memory(device), accelerator=accelerator
    )
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    quantization = quantization_method(model.config.to_dict())
    return boot_warmup_tokens(context, bandwidth, weights, quantization)


def _default_cache(device: str, settings: WorkerSettings) -> PrefixCache:
    return cache_for(settings, device_memory(device))


def _layers(past: DynamicCache) -> list[DynamicLayer]:
    # _require_full_attention made sure every layer is a DynamicLayer.
    return cast(list[DynamicLayer], past.layers)


def _freeze(past: DynamicCache) -> KV:
    """The tensors a request cache ended with, to store as an entry's KV."""
    kv = [(layer.keys, layer.values) for layer in _layers(past)]
    if any(k is None or v is None for k, v in kv):
        raise RuntimeError("a cache layer was never filled")
    return tuple((cast(torch.Tensor, k), cast(torch.Tensor, v)) for k, v in kv)


def _pick(logits: torch.Tensor, temperature: float, rng: torch.Generator | None = None,
          top_k: int | None = None) -> int:
    with torch.inference_mode():
        if temperature <= 0:
            return int(torch.argmax(logits))
        if top_k is not None and top_k < logits.shape[-1]:
            # Everything below the k-th likeliest token is never drawn.
            floor = torch.topk(logits, top_k).values[..., -1:]
            logits = logits.masked_fill(logits < floor, float("-inf"))
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        if rng is None:
            return int(torch.multinomial(probs, 1))
        # The generator lives on the CPU, so its draws do not depend on the device.
        return int(torch.multinomial(probs.cpu(), 1, generator=rng))


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
