"""The worker's HTTP contract, pure: request models, bounds, response bodies and SSE framing."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from schemas import MAX_TTL_S, ChunkRef
from workers.kv.chunk_kv import ChunkSpan, check_spans

Tenant = Annotated[str, StringConstraints(min_length=1, max_length=1024)]
DONE = b"data: [DONE]\n\n"


class ApiError(Exception):
    """A request the worker refuses: HTTP status, OpenAI error type and a message."""

    def __init__(
        self, status: int, message: str, *, kind: str = "invalid_request_error", param: str = ""
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param or None

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.kind, self.param)


def error_body(message: str, kind: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape: `{"error": {"message", "type", "param", "code"}}`."""
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = True


class ChunkSpanIn(BaseModel):
    """Where one retrieved chunk's block stands in the prompt: token positions [start, end)
    of the prompt's token ids, with the chunk's identity (its chunk KV is keyed by it)."""

    model_config = ConfigDict(extra="forbid")

    chunk_id: Annotated[str, StringConstraints(min_length=1, max_length=512)]
    content_hash: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16,128}$")]
    start: int = Field(ge=0)
    end: int = Field(ge=1)


class CompletionRequest(BaseModel):
    """The supported subset of OpenAI's `POST /v1/completions`, plus `tenant`."""

    # Clients send many optional OpenAI fields (user, top_k...); unknown ones are ignored.
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int = Field(default=16, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=1)
    best_of: int | None = Field(default=None, ge=1, le=1)
    echo: bool = Field(default=False, description="unsupported")
    logprobs: int | None = Field(default=None, le=0)
    stop: str | list[str] | None = None
    tenant: Tenant = "default"
    # Non-standard: the chunks the prompt was built from, recorded on the reactive entry
    # so an invalidation by chunk reaches it; and vLLM's switch for returning token ids.
    chunk_refs: list[ChunkRef] = Field(default_factory=list, max_length=256)
    return_token_ids: bool = False
    # Non-standard: where the retrieved chunks stand (token positions; the prompt must be
    # token ids), so a worker holding their chunk KV can blend it; `chunk_reuse` false opts
    # this request out of blending (exact prefix reuse only).
    chunk_spans: list[ChunkSpanIn] = Field(default_factory=list, max_length=256)
    chunk_reuse: bool = True
    # vLLM's per-request prefix-cache namespace; it stands for `tenant` when that is unset.
    cache_salt: Tenant | None = None

    @model_validator(mode="after")
    def _salt_is_tenant(self) -> CompletionRequest:
        if self.cache_salt and "tenant" not in self.model_fields_set:
            self.tenant = self.cache_salt
        return self

    def single_prompt(self) -> str | list[int]:
        """The one prompt of the request (a batch of one is unwrapped)."""
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], str | list):
            if len(p) != 1:
                raise ApiError(400, "only one prompt per request is supported", param="prompt")
            return p[0]  # type: ignore[return-value]
        return p  # type: ignore[return-value]

    @property
    def include_usage(self) -> bool:
        return self.stream_options is None or self.stream_options.include_usage


class PrefillRequest(BaseModel):
    """`POST /v1/prefill` (non-standard): store the block-aligned prefix of a prompt."""

    model_config = ConfigDict(extra="forbid")

    token_ids: list[Annotated[int, Field(ge=0, strict=True)]] | None = None
    prompt: str | None = None
    tenant: Tenant = "default"
    chunk_refs: list[ChunkRef] = Field(default_factory=list, max_length=256)
    ttl_s: float | None = Field(default=None, gt=0, le=MAX_TTL_S, allow_inf_nan=False)
    pin: bool = False

    def source(self) -> str | list[int]:
        """The prompt to prefill: its token ids or its text (exactly one must be given)."""
        if self.token_ids is not None and self.prompt is None:
            return self.token_ids
        if self.prompt is not None and self.token_ids is None:
            return self.prompt
        raise ApiError(400, "give exactly one of token_ids or prompt", param="token_ids")


@dataclass(frozen=True)
class Limits:
    """Request bounds enforced before any model work."""

    max_prompt_tokens: int
    max_tokens: int
    context_tokens: int
    vocab_size: int


def parse(model: type[BaseModel], body: Any) -> Any:
    """Validate a JSON body into `model`; a 400 `ApiError` names the first bad field."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ()))
        raise ApiError(400, f"{loc or 'body'}: {err.get('msg', 'invalid')}", param=loc) from None


def check_completion(req: CompletionRequest, limits: Limits) -> None:
    """Refuse what the worker does not implement or what exceeds its bounds."""
    if req.echo:
        raise ApiError(400, "echo is not supported", param="echo")
    if req.stop:
        raise ApiError(400, "stop sequences are not supported", param="stop")
    if req.top_p < 1.0:
        raise ApiError(400, "top_p < 1 is not supported; sample with temperature", param="top_p")
    if req.max_tokens > limits.max_tokens:
        raise ApiError(
            400,
            f"max_tokens={req.max_tokens} exceeds this worker's limit of {limits.max_tokens}",
            param="max_tokens",
        )


def check_prompt(token_ids: Sequence[int], limits: Limits, *, max_tokens: int = 0) -> None:
    """Bounds on a tokenized prompt: non-empty, within limits, ids inside the vocabulary."""
    n = len(token_ids)
    if n == 0:
        raise ApiError(400, "the prompt is empty", param="prompt")
    if n > limits.max_prompt_tokens:
        raise ApiError(
            400,
            f"the prompt has {n} tokens, more than the limit of {limits.max_prompt_tokens}",
            param="prompt",
        )
    if n + max_tokens > limits.context_tokens:
        raise ApiError(
            400,
            f"prompt ({n}) + max_tokens ({max_tokens}) exceeds the model's context of "
            f"{limits.context_tokens} tokens",
            param="max_tokens",
        )
    bad = next((t for t in token_ids if not 0 <= t < limits.vocab_size), None)
    if bad is not None:
        raise ApiError(
            400,
            f"token id {bad} is outside the vocabulary [0, {limits.vocab_size})",
            param="prompt",
        )


def check_spans_of(req: CompletionRequest, prompt: str | list[int], n_prompt: int
                   ) -> tuple[ChunkSpan, ...]:
    """The request's chunk spans, checked against its prompt of `n_prompt` tokens."""
    if not req.chunk_spans:
        return ()
    if not isinstance(prompt, list):
        raise ApiError(400, "chunk_spans need the prompt as token ids (spans are token "
                       "positions; text would be tokenized here)", param="chunk_spans")
    try:
        spans = tuple(ChunkSpan((s.chunk_id, s.content_hash), s.start, s.end)
                      for s in req.chunk_spans)
        check_spans(spans, n_prompt)
    except ValueError as exc:
        raise ApiError(400, f"chunk_spans: {exc}", param="chunk_spans") from None
    return spans


def completion_id() -> str:
    return f"cmpl-{uuid.uuid4().hex}"


def usage(
    prompt_tokens: int, completion_tokens: int, cached: int, ttft_ms: float, blended: int = 0,
    approx_cached: int = 0,
) -> dict:
    """OpenAI usage with `prompt_tokens_details.cached_tokens`, and non-standard `ttft_ms`,
    `prompt_tokens_details.blended_tokens` (placed from chunk KV, not computed) and
    `prompt_tokens_details.approx_cached_tokens` (of the cached, those an earlier blended
    answer stored)."""
    details = {"cached_tokens": cached, "blended_tokens": blended,
               "approx_cached_tokens": approx_cached}
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": details,
        "ttft_ms": round(ttft_ms, 3),
    }


def completion_body(
    cid: str, model: str, text: str, finish: str | None, usage_: dict | None, created: int = 0
) -> dict:
    """A `text_completion` object; a stream chunk when `usage_` is None."""
    body: dict[str, Any] = {
        "id": cid,
        "object": "text_completion",
        "created": created or int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
    }
    if usage_ is not None:
        body["usage"] = usage_
    return body


def usage_chunk(cid: str, model: str, usage_: dict, created: int = 0) -> dict:
    """The last stream chunk when usage is included: no choices, just usage."""
    return {
        "id": cid,
        "object": "text_completion",
        "created": created or int(time.time()),
        "model": model,
        "choices": [],
        "usage": usage_,
    }


def sse(data: dict) -> bytes:
    """One server-sent event carrying a JSON object."""
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


class WarmSetError(ValueError):
    """A startup warm set that cannot be read; the message names the line or item."""


def parse_warm_set(text: str) -> list[PrefillRequest]:
    """Items of a warm set file: a JSON list (or `{"items": [...]}`) or JSON lines.

    An item is a prefill object (`token_ids` or `prompt`, `tenant`, `chunk_refs`, `ttl_s`,
    `pin`), a bare string (a prompt) or a bare list of token ids. Items are pinned unless
    they say `"pin": false`: the warm set is warmup-owned.
    """
    stripped = text.strip()
    if not stripped:
        return []
    try:
        whole = json.loads(stripped)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, dict) and "items" in whole:
        whole = whole["items"]
    if isinstance(whole, list) and not all(_is_token(x) for x in whole):
        raw = list(whole)
    elif whole is not None:
        raw = [whole]
    else:
        raw = [_json_line(line, n) for n, line in enumerate(stripped.splitlines(), 1)]
    return [_warm_item(x, n) for n, x in enumerate(raw, 1) if x is not None]


def _is_token(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _json_line(line: str, n: int) -> Any:
    if not line.strip():
        return None
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise WarmSetError(f"line {n}: not JSON: {exc}") from None


def _warm_item(item: Any, n: int) -> PrefillRequest:
    if isinstance(item, str):
        item = {"prompt": item}
    elif isinstance(item, list):
        item = {"token_ids": item}
    if not isinstance(item, dict):
        raise WarmSetError(f"item {n}: expected an object, a string or a list of token ids")
    try:
        req = PrefillRequest.model_validate({"pin": True, **item})
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ()))
        raise WarmSetError(f"item {n}: {loc}: {err.get('msg')}") from None
    try:
        req.source()
    except ApiError as exc:
        raise WarmSetError(f"item {n}: {exc.message}") from None
    return req
