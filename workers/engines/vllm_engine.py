"""In-process vLLM (`enable_prefix_caching=True`) behind the engine protocol; vllm imported lazily.

vLLM keeps the KV in its own block pool and reuses it by block hash. Warmup is a request
with `max_tokens=1` over the prefix, which leaves its blocks in that pool. vLLM cannot
drop one prefix: invalidation frees our bookkeeping only, and `clear()` (an explicit
order to drop everything) calls `reset_prefix_cache()`. Stale KV can never be hit:
prefix identity is the token sequence, so a changed chunk gives different tokens and
different block hashes; the stale blocks just age out of vLLM's LRU.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from workers.engines.base import Request, ServerKVEngine, keep_by_prefill
from workers.engines.protocol import GenerationResult, GenerationStep, KeepPrompt
from workers.kv.cache import CacheEntry
from workers.kv.sizing import cache_for, kv_bytes_per_token
from workers.settings import WorkerSettings

NEEDS = "needs vllm and a CUDA device"


def vllm_available() -> bool:
    """True when vllm is importable and torch sees a CUDA device."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def load_vllm_engine(path: Path, settings: WorkerSettings) -> VllmEngine:
    """Start vLLM on a local HF model directory with prefix caching on."""
    if not vllm_available():
        raise RuntimeError(f"engine `vllm` {NEEDS}; install `ragwarm[vllm]` on a GPU host")
    from vllm import LLM

    dtype = "auto" if settings.dtype == "auto" else settings.dtype
    llm = LLM(
        model=str(path),
        tokenizer=str(path),
        enable_prefix_caching=True,
        gpu_memory_utilization=settings.vllm_gpu_memory_utilization,
        max_model_len=settings.vllm_max_model_len,
        dtype=dtype,
        block_size=settings.block_size,
    )
    return VllmEngine(
        llm, model_id=settings.model_id or Path(path).resolve().name, settings=settings
    )


class VllmEngine(ServerKVEngine):
    """vLLM's LLM object driven step by step, so tokens stream as they are sampled."""

    def __init__(self, llm: Any, *, model_id: str, settings: WorkerSettings) -> None:
        import torch

        self.llm = llm
        self.model_id = model_id
        self.device = "cuda"
        self.block_size = settings.block_size
        self.tokenizer = llm.get_tokenizer()
        model_config = llm.llm_engine.model_config
        self.max_model_len = int(model_config.max_model_len)
        self.vocab_size = len(self.tokenizer)
        self.kv_bytes_per_token = kv_bytes_per_token(
            model_config.hf_config, model_config.dtype.itemsize
        )
        kv_cap = min(settings.kv_bytes, self._pool_bytes(llm) or settings.kv_bytes)
        total = int(torch.cuda.mem_get_info()[1])
        self.cache = cache_for(settings, total, kv_cap)
        self._held: dict[str, int] = {}
        self._ids = itertools.count()

    def _pool_bytes(self, llm: Any) -> int | None:
        cache_config = llm.llm_engine.cache_config
        blocks = getattr(cache_config, "num_gpu_blocks", None)
        if not blocks:
            return None
        return int(blocks) * int(cache_config.block_size) * self.kv_bytes_per_token

    # -- cache -----------------------------------------------------------------------

    def clear(self, *, command_id: str | None = None) -> list[CacheEntry]:
        """Drop every entry and every cached block in vLLM."""
        removed = self.cache.clear(command_id=command_id)
        self.sync()
        self.llm.reset_prefix_cache()
        return removed

    def _warm(self, tokens: list[int], tenant: str) -> int:
        # `tenant` unused: in-process requests carry no cache salt, as before.
        out = self._run(tokens, max_tokens=1, temperature=0.0)
        return min(int(getattr(out, "num_cached_tokens", 0) or 0), len(tokens))

    def _run(self, tokens: list[int], *, max_tokens: int, temperature: float) -> Any:
        outs = self.llm.generate(
            [{"prompt_token_ids": tokens}],
            self._params(max_tokens, temperature),
            use_tqdm=False,
        )
        return outs[0]

    def _params(self, max_tokens: int, temperature: float, stop_ids: Iterable[int] | None = None,
                seed: int | None = None, top_k: int | None = None):
        from vllm import SamplingParams

        extra: dict[str, Any] = {"stop_token_ids": list(stop_ids)} if stop_ids is not None else {}
        if seed is not None:
            extra["seed"] = seed
        if top_k is not None:
            extra["top_k"] = top_k
        return SamplingParams(max_tokens=max_tokens, temperature=temperature, **extra)

    # -- generation ------------------------------------------------------------------

    def _generate(self, request: Request) -> Iterator[GenerationStep]:
        entry, _ = self._lookup(self.block_hashes(request.prompt, tenant=request.tenant))
        params = self._params(
            request.max_tokens, request.temperature, request.stop_ids, request.seed,
            request.top_k,
        )
        return self._stream(request.prompt, params, entry, request.tenant, request.keep)

    def _stream(
        self,
        prompt: list[int],
        params: Any,
        entry: CacheEntry | None,
        tenant: str,
        keep: KeepPrompt | None,
    ) -> Iterator[GenerationStep]:
        engine = self.llm.llm_engine
        request_id = f"ragwarm-{next(self._ids)}"
        stops = frozenset(params.stop_token_ids or ()) | {self.tokenizer.eos_token_id}
        run = _Run(prompt, entry, stops, time.perf_counter())
        engine.add_request(request_id, {"prompt_token_ids": prompt}, params)
        try:
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if out.request_id == request_id:
                        for step in run.take(out):
                            if keep is not None:  # vLLM cached the blocks; add the entry
                                step = keep_by_prefill(self, step, prompt, tenant, keep)
                            yield step
                        if out.finished:
                            return
        finally:
            if engine.has_unfinished_requests():
                engine.abort_request([request_id])


class _Run:
    """Cumulative vLLM outputs of one request turned into one step per new token."""

    def __init__(
        self, prompt: list[int], entry: CacheEntry | None, stops: frozenset[int], start: float
    ) -> None:
        self.prompt, self.entry, self.stops, self.start = prompt, entry, stops, start
        self.ids: list[int] = []
        self.text = ""
        self.ttft = 0.0
        self.index = 0

    def take(self, out: Any) -> Iterator[GenerationStep]:
        completion = out.outputs[0]
        new_ids = list(completion.token_ids)[len(self.ids) :]
        delta = completion.text[len(self.text) :]
        self.ids, self.text = list(completion.token_ids), completion.text
        if not new_ids and not out.finished:
            return
        self.ttft = self.ttft or time.perf_counter() - self.start
        tokens = new_ids or [-1]
        for i, token in enumerate(tokens):
            last = out.finished and i == len(tokens) - 1
            result = self._result(out, completion.finish_reason) if last else None
            yield GenerationStep(self.index, token, delta if i == 0 else "", result)
            self.index += 1

    def _result(self, out: Any, finish_reason: str | None) -> GenerationResult:
        ids = self.ids
        if finish_reason == "stop" and ids and ids[-1] in self.stops:
            ids = ids[:-1]  # the protocol reports completion tokens without the stop token
        return GenerationResult(
            token_ids=tuple(ids),
            text=self.text,
            prompt_tokens=len(self.prompt),
            cached_tokens=int(getattr(out, "num_cached_tokens", 0) or 0),
            prefix_hash=self.entry.prefix_hash if self.entry else None,
            ttft_s=self.ttft,
            total_s=time.perf_counter() - self.start,
            finish_reason="length" if finish_reason == "length" else "stop",
        )
