"""An OpenAI-compatible server (vLLM, SGLang, or a ragwarm worker) as an engine, over HTTP.

The server keeps the KV; this adapter keeps the bookkeeping. Warmup is a completion with
`max_tokens=1` over the prefix, which makes the server's automatic prefix caching hold it.
Cached tokens come from `usage.prompt_tokens_details.cached_tokens` when the server sends
it, else from the delta of its Prometheus counters `vllm:prefix_cache_hits` (a delta is
only exact while no other client uses the server). vLLM cannot drop one prefix:
invalidation frees bookkeeping only. llama.cpp's server can erase a slot, which keeps one
sequence: with `remote_erase_slots`, dropping a prefix erases the slots whose prompt starts
with it (docs/llama-cpp.md says where the two views still drift). Stale KV is never hit
either way, because prefix identity is the token sequence and changed chunks tokenize
differently.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
from httpx_sse import EventSource, ServerSentEvent, SSEError
from prometheus_client.parser import text_string_to_metric_families

from workers.engines.base import Request, ServerKVEngine, keep_by_prefill
from workers.engines.protocol import GenerationResult, GenerationStep
from workers.kv.cache import CacheEntry
from workers.kv.plan import KVPlan
from workers.kv.sizing import DTYPE_BYTES, cache_for, kv_bytes_per_token
from workers.settings import WorkerSettings

QUERIES = ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries")
HITS = ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits")
def prometheus_counter(text: str, names: Sequence[str]) -> float | None:
    """Sum over labels of the first counter in `names` present in a Prometheus exposition
    (`name_total`, or plain `name` where a server exposes it untyped); None when absent."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    for name in names:
        for sample_name in (f"{name}_total", name):
            if sample_name in totals:
                return totals[sample_name]
    return None


def parse_sse(events: Iterable[ServerSentEvent]) -> Iterator[dict[str, Any]]:
    """JSON payloads of a stream's events (parsed by httpx-sse), up to `[DONE]`; an error
    payload raises."""
    for event in events:
        if event.data == "[DONE]":
            return
        if not event.data:
            continue
        payload = json.loads(event.data)
        if "error" in payload:
            raise RemoteError(f"server error during stream: {payload['error']}")
        yield payload


def stream_events(response: httpx.Response) -> Iterator[ServerSentEvent]:
    """The server-sent events of a streamed response; a response of another content type
    is the server's error, not a stream."""
    try:
        yield from EventSource(response).iter_sse()
    except SSEError as exc:
        raise RemoteError(f"the server did not stream events: {exc}") from None


def cached_from_usage(usage: dict[str, Any] | None) -> int | None:
    """`usage.prompt_tokens_details.cached_tokens`, or None when the server leaves it out."""
    details = (usage or {}).get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens")
    return int(cached) if cached is not None else None


def slots_holding(
    slots: Sequence[dict[str, Any]],
    dropped: Mapping[str, str],
    hashes_of: Callable[[str, str], Sequence[str]],
) -> list[int]:
    """Ids of llama.cpp slots that hold a dropped prefix, or may.

    `dropped` maps each dropped prefix hash to its tenant; `hashes_of(prompt, tenant)` are
    the block hashes of a slot's prompt text as that tenant would have sent it. llama.cpp
    shows a slot's last prompt only when started with LLAMA_SERVER_SLOTS_DEBUG=1: then a
    slot is named when its prompt starts with a dropped prefix. Otherwise every slot holding
    tokens is named (a reset: the server offers nothing finer). `n_prompt_tokens` is what the
    slot's KV holds; an erased slot keeps showing its last prompt with 0 tokens held.
    """
    if not dropped:
        return []
    tenants = set(dropped.values())
    found = []
    for slot in slots:
        prompt = slot.get("prompt")
        if not slot.get("n_prompt_tokens"):
            continue  # holds nothing: never used, or erased
        if isinstance(prompt, str):
            if prompt and any(set(hashes_of(prompt, t)) & dropped.keys() for t in tenants):
                found.append(int(slot["id"]))
        else:  # holds tokens it does not show
            found.append(int(slot["id"]))
    return found


class RemoteError(RuntimeError):
    """The server refused a request or could not be reached."""


class RemoteEngine(ServerKVEngine):
    """Engine protocol over an OpenAI-compatible server; calls are synchronous (httpx)."""

    def __init__(
        self,
        client: httpx.Client,
        tokenizer: Any,
        *,
        model_id: str,
        served_model: str,
        kv_bytes_per_token: int,
        max_model_len: int,
        settings: WorkerSettings,
    ) -> None:
        self.client = client
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.served_model = served_model
        self.device = f"remote:{client.base_url}"
        self.block_size = settings.block_size
        self.max_model_len = max_model_len
        self.vocab_size = len(tokenizer)
        self.kv_bytes_per_token = kv_bytes_per_token
        self.cache = cache_for(settings, None)
        self._held: dict[str, int] = {}
        # Learned from the first answer: does the server put cached_tokens in usage?
        self._usage_reports_cache: bool | None = None
        self.erase_slots = settings.remote_erase_slots
        self.erased_slots = 0  # slots erased on the server so far
        self._tenants: dict[str, str] = {}  # prefix hash -> tenant, for matching slots

    # -- cache -----------------------------------------------------------------------

    def _keep(self, entry: CacheEntry, held: int) -> None:
        super()._keep(entry, held)
        self._tenants[entry.prefix_hash] = entry.tenant

    def apply(self, plan: KVPlan) -> int:
        dropped = {k: self._tenants.pop(k, "default") for k in plan.gone if k in self._held}
        freed = super().apply(plan)
        if dropped and self.erase_slots:
            self.erased_slots += self._erase_slots(dropped)
        return freed

    def _erase_slots(self, dropped: Mapping[str, str]) -> int:
        """Erase the server's slots that hold a dropped prefix (llama.cpp's `/slots`)."""
        response = self.client.get("/slots")
        if response.status_code != 200:
            raise RemoteError(f"{response.status_code} from /slots: {response.text[:300]}")
        ids = slots_holding(
            response.json(),
            dropped,
            lambda prompt, tenant: self.block_hashes(self.tokenize(prompt), tenant=tenant),
        )
        for slot_id in ids:
            erased = self.client.post(f"/slots/{slot_id}", params={"action": "erase"})
            if erased.status_code != 200:
                raise RemoteError(
                    f"{erased.status_code} erasing slot {slot_id}: {erased.text[:300]}"
                )
        return len(ids)

    def server_counters(self) -> tuple[float, float] | None:
        """(prefix cache queries, hits) in tokens from the server's /metrics, if it has them."""
        response = self.client.get("/metrics")
        if response.status_code != 200:
            return None
        queries = prometheus_counter(response.text, QUERIES)
        hits = prometheus_counter(response.text, HITS)
        return None if queries is None or hits is None else (queries, hits)

    def _warm(self, tokens: list[int], tenant: str) -> int:
        """Run the prefix through the server (max_tokens=1); how many tokens it had cached."""
        before = self.server_counters()
        payload = {"prompt": tokens, "max_tokens": 1, "temperature": 0.0, **_salt(tenant)}
        body = self._post(payload)
        cached = cached_from_usage(body.get("usage"))
        if cached is None and before is not None:
            after = self.server_counters()
            cached = int(after[1] - before[1]) if after is not None else 0
        return min(cached or 0, len(tokens))

    def _post(self, payload: dict[str, Any]) -> dict[str, Any]:
        response = self.client.post("/v1/completions", json={"model": self.served_model, **payload})
        if response.status_code != 200:
            raise RemoteError(f"{response.status_code} from the server: {response.text[:500]}")
        return response.json()

    # -- generation ------------------------------------------------------------------

    def _generate(self, request: Request) -> Iterator[GenerationStep]:
        if request.stop_ids is not None:
            raise ValueError("the remote engine stops at the server's EOS; stop_ids unsupported")
        self._lookup(self.block_hashes(request.prompt, tenant=request.tenant))  # LRU, hits
        return self._stream(request)

    def _stream(self, request: Request) -> Iterator[GenerationStep]:
        prompt, tenant, keep = request.prompt, request.tenant, request.keep
        start = time.perf_counter()
        before = self.server_counters() if self._usage_reports_cache is not True else None
        payload = {
            "model": self.served_model,
            "prompt": prompt,
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            # OpenAI-compatible servers (vLLM, SGLang, llama.cpp) take a sampling seed.
            **({"seed": request.seed} if request.seed is not None else {}),
            **({"top_k": request.top_k} if request.top_k is not None else {}),
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
            **_salt(tenant),
        }
        run = _StreamState(start)
        with self.client.stream("POST", "/v1/completions", json=payload) as response:
            if response.status_code != 200:
                raise RemoteError(
                    f"{response.status_code} from the server: {response.read()[:500]!r}"
                )
            for chunk in parse_sse(stream_events(response)):
                yield from run.take(chunk)
        cached = cached_from_usage(run.usage)
        self._usage_reports_cache = cached is not None
        if cached is None and before is not None:
            after = self.server_counters()
            cached = int(after[1] - before[1]) if after is not None else 0
        step = run.finish(self, len(prompt), min(cached or 0, len(prompt)))
        yield step if keep is None else keep_by_prefill(self, step, prompt, tenant, keep)


class _StreamState:
    """Turns stream chunks into steps, holding the last one back for the final result."""

    def __init__(self, start: float) -> None:
        self.start = start
        self.ttft = 0.0
        self.ids: list[int] = []
        self.text: list[str] = []
        self.finish_reason = "length"
        self.usage: dict[str, Any] | None = None
        self._held: GenerationStep | None = None
        self._index = 0

    def take(self, chunk: dict[str, Any]) -> Iterator[GenerationStep]:
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if choice.get("finish_reason"):
                self.finish_reason = "stop" if choice["finish_reason"] != "length" else "length"
            ids = choice.get("token_ids")
            text = choice.get("text") or ""
            for i, token in enumerate(ids if ids else ([-1] if text else [])):
                yield from self._push(token, text if i == 0 else "")

    def _push(self, token: int, text: str) -> Iterator[GenerationStep]:
        if not self.ttft:
            self.ttft = time.perf_counter() - self.start
        if self._held is not None:
            yield self._held
        if token >= 0:
            self.ids.append(token)
        self.text.append(text)
        self._held = GenerationStep(self._index, token, text)
        self._index += 1

    def finish(self, engine: RemoteEngine, prompt_tokens: int, cached: int) -> GenerationStep:
        if not self.ids and self.text:
            self.ids = engine.tokenize("".join(self.text))  # the server sent no token ids
        result = GenerationResult(
            token_ids=tuple(self.ids),
            text="".join(self.text),
            prompt_tokens=prompt_tokens,
            cached_tokens=cached,
            prefix_hash=None,
            ttft_s=self.ttft or time.perf_counter() - self.start,
            total_s=time.perf_counter() - self.start,
            finish_reason=self.finish_reason,  # type: ignore[arg-type]
        )
        last = self._held or GenerationStep(0, -1, "")
        return GenerationStep(last.index, last.token_id, last.text, result)


def _salt(tenant: str) -> dict[str, str]:
    """vLLM's `cache_salt` keeps tenants' prefix caches apart (a ragwarm worker reads it as
    the tenant); the default tenant sends none, so plain servers see a plain request."""
    return {} if tenant == "default" else {"cache_salt": tenant}


def connect_remote_engine(
    settings: WorkerSettings, model_dir: Path, *, tokenizer: Any
) -> RemoteEngine:
    """Connect to `settings.remote_url`; the tokenizer and KV size come from `model_dir`."""
    if not settings.remote_url:
        raise RemoteError("engine `remote` needs RAGWARM_WORKER_REMOTE_URL (or --remote-url)")
    headers = {}
    if settings.remote_api_key is not None:
        headers["Authorization"] = f"Bearer {settings.remote_api_key.get_secret_value()}"
    client = httpx.Client(
        base_url=settings.remote_url.rstrip("/"),
        headers=headers,
        timeout=settings.remote_timeout_s,
    )
    card = _model_card(client, settings.remote_model, settings.remote_timeout_s)
    config = json.loads((model_dir / "config.json").read_text())
    return RemoteEngine(
        client,
        tokenizer,
        model_id=settings.model_id or card["id"],
        served_model=card["id"],
        kv_bytes_per_token=kv_bytes_per_token(config, DTYPE_BYTES.get(settings.dtype, 2)),
        max_model_len=int(card.get("max_model_len") or config.get("max_position_embeddings", 4096)),
        settings=settings,
    )


def _model_card(client: httpx.Client, wanted: str | None, wait_s: float) -> dict[str, Any]:
    """The served model's card; waits up to `wait_s` for a server that is still starting."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            response = client.get("/v1/models")
            if response.status_code not in (502, 503, 504):
                break
            problem = f"{response.status_code} from {client.base_url}/v1/models"
        except httpx.TransportError as exc:
            problem = f"cannot reach {client.base_url}: {exc}"
        if time.monotonic() > deadline:
            raise RemoteError(problem)
        time.sleep(1.0)
    if response.status_code != 200:
        raise RemoteError(f"{response.status_code} from {client.base_url}/v1/models")
    cards = response.json().get("data") or []
    for card in cards:
        if wanted is None or card.get("id") == wanted:
            return card
    names = ", ".join(c.get("id", "?") for c in cards)
    raise RemoteError(f"model {wanted!r} not served by {client.base_url}; it serves: {names}")
