"""The gateway's OpenAI wire format, pure: requests, the question, tenants, bodies, SSE chunks."""

from __future__ import annotations

import hmac
import json
import time
import uuid
from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ragwarm.client.rag import Answer

DONE = b"data: [DONE]\n\n"
MAX_STOPS = 4  # OpenAI's limit on stop sequences


class GatewayError(Exception):
    """A request the gateway refuses: HTTP status, OpenAI error type, code and message."""

    def __init__(self, status: int, message: str, *, kind: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.code, self.param = (
            status, message, kind, code, param)

    def body(self) -> dict[str, Any]:
        """OpenAI's error shape, which the official SDKs turn into their exception types."""
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}


# --- requests ------------------------------------------------------------------------------
class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class _Request(BaseModel):
    # The SDKs send many optional fields (user, metadata…); unknown ones are ignored, but
    # every field that changes the answer is either honoured or refused (`check_sampling`).
    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    seed: int | None = None
    logprobs: bool | int | None = None
    top_logprobs: int | None = Field(default=None, ge=0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=1)
    stop: str | list[str] | None = Field(default=None, max_length=MAX_STOPS)
    tools: list[Any] | None = None
    question_field: ClassVar[str]  # the field the question comes from, named in refusals

    @abstractmethod
    def question(self) -> str:
        """The question this request asks (the last user message, or the prompt)."""

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def token_limit(self) -> int | None:
        """The most tokens to generate, from whichever field the API names it by."""
        return self.max_tokens

    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text or "" for p in self.content if p.type == "text")
        return self.content or ""


class ChatRequest(_Request):
    """`POST /v1/chat/completions`: the last user message is the question."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    question_field: ClassVar[str] = "messages"

    def question(self) -> str:
        users = [m.text().strip() for m in self.messages if m.role == "user"]
        if not users or not users[-1]:
            raise GatewayError(400, "the messages need a user message with text",
                               param="messages")
        return users[-1]

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Request):
    """`POST /v1/completions`: the prompt is the question (a batch of one is unwrapped)."""

    prompt: str | list[str]
    question_field: ClassVar[str] = "prompt"

    def question(self) -> str:
        prompt = self.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise GatewayError(400, "only one prompt per request is supported",
                                   param="prompt")
            prompt = prompt[0]
        if not prompt.strip():
            raise GatewayError(400, "the prompt is empty", param="prompt")
        return prompt.strip()


@dataclass(frozen=True)
class Served:
    """The model the gateway serves and the other names it answers to (aliases)."""

    model_id: str
    aliases: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return (self.model_id, *(a for a in self.aliases if a != self.model_id))

    def check(self, name: str) -> None:
        if name not in self.names:
            known = ", ".join(f"`{n}`" for n in self.names)
            raise GatewayError(404, f"The model `{name}` does not exist; this gateway serves "
                               f"{known}", code="model_not_found", param="model")


@dataclass(frozen=True)
class Limits:
    """Bounds on one request, and the temperature used when a request gives none."""

    max_tokens: int
    max_question_chars: int
    default_temperature: float = 0.0


def parse_request(model: type[_Request], body: Any, served: Served, limits: Limits) -> Any:
    """Validate a body; refuse what the gateway does not implement, with the field named."""
    if not isinstance(body, dict):
        raise GatewayError(400, "the request body must be a JSON object")
    try:
        req = model.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ()))
        raise GatewayError(400, f"{loc or 'body'}: {err.get('msg', 'invalid')}",
                           param=loc or None) from None
    served.check(req.model)
    if req.tools:
        raise GatewayError(400, "tools are not supported", param="tools")
    if any(not s for s in req.stops()):
        raise GatewayError(400, "a stop sequence is empty", param="stop")
    check_sampling(req, limits.default_temperature)
    if (req.token_limit() or 0) > limits.max_tokens:
        raise GatewayError(400, f"max_tokens={req.token_limit()} exceeds this gateway's limit "
                           f"of {limits.max_tokens}", param="max_tokens")
    question = req.question()
    if len(question) > limits.max_question_chars:
        raise GatewayError(400, f"the question has {len(question)} characters, more than this "
                           f"gateway's limit of {limits.max_question_chars}",
                           param=req.question_field, code="question_too_long")
    return req


def check_sampling(req: _Request, default_temperature: float) -> None:
    """Sampling fields the workers cannot honour are refused unless they change nothing.

    The workers sample with temperature only (no nucleus, penalties, bias, log
    probabilities, or seed), so `top_p=1`, zero penalties, `logprobs=false` and a seed at
    temperature 0 (greedy: every answer is the same, whatever the seed) are accepted.
    """
    temperature = default_temperature if req.temperature is None else req.temperature
    refusals = {
        "top_p": req.top_p is not None and req.top_p < 1.0,
        "seed": req.seed is not None and temperature > 0,
        "logprobs": req.logprobs is not None and req.logprobs is not False,
        "top_logprobs": bool(req.top_logprobs),
        "frequency_penalty": bool(req.frequency_penalty),
        "presence_penalty": bool(req.presence_penalty),
        "logit_bias": bool(req.logit_bias),
    }
    for param, refused in refusals.items():
        if refused:
            raise GatewayError(400, f"{param}={getattr(req, param)!r} is not supported: "
                               f"{UNSUPPORTED[param]}", param=param,
                               code="unsupported_parameter")


UNSUPPORTED = {
    "top_p": "the workers sample from the whole distribution; use temperature",
    "seed": "the workers cannot seed sampling; use temperature 0 for reproducible answers",
    "logprobs": "the workers return no log probabilities",
    "top_logprobs": "the workers return no log probabilities",
    "frequency_penalty": "the workers apply no penalties",
    "presence_penalty": "the workers apply no penalties",
    "logit_bias": "the workers apply no logit bias",
}


# --- tenants -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Keys:
    """Who may call: tenant -> key, an operator key acting for any tenant, the tenant header."""

    by_tenant: Mapping[str, str]
    operator: str | None
    header: str
    default_tenant: str

    @property
    def open(self) -> bool:
        return not self.by_tenant and self.operator is None


def tenant_for(keys: Keys, headers: Mapping[str, str]) -> str:
    """The tenant of a request, from its bearer key (or the header, for the operator key)."""
    named = (headers.get(keys.header) or "").strip() or None
    if keys.open:
        return named or keys.default_tenant
    given = _bearer(headers.get("Authorization") or "")
    if keys.operator is not None and _same(given, keys.operator):
        return named or keys.default_tenant
    for tenant, key in keys.by_tenant.items():
        if _same(given, key):
            if named is not None and named != tenant:
                raise GatewayError(403, f"this API key may not act for tenant `{named}`",
                                   kind="permission_error", code="tenant_forbidden")
            return tenant
    raise GatewayError(401, "Incorrect API key provided.", code="invalid_api_key")


def _bearer(value: str) -> str:
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _same(given: str, expected: str) -> bool:
    # An empty configured key would match a request that sends none (no header, "Bearer ").
    return bool(expected) and hmac.compare_digest(given.encode(), expected.encode())


# --- responses -----------------------------------------------------------------------------
def usage(answer: Answer) -> dict[str, Any]:
    """OpenAI usage with `prompt_tokens_details.cached_tokens`: what the worker reused; and,
    as the worker reports them (the SDKs keep unknown fields), `blended_tokens` (placed from
    chunk KV other prompts computed) and `approx_cached_tokens` (of the cached, those an
    earlier blended answer stored): how much of the answer's KV was approximate."""
    details = {"cached_tokens": answer.cached_tokens, "blended_tokens": answer.blended_tokens,
               "approx_cached_tokens": answer.approx_cached_tokens}
    return {
        "prompt_tokens": answer.prompt_tokens,
        "completion_tokens": answer.completion_tokens,
        "total_tokens": answer.prompt_tokens + answer.completion_tokens,
        "prompt_tokens_details": details,
    }


def extension(answer: Answer) -> dict[str, Any]:
    """ragwarm's own figures (the SDKs keep unknown fields): where it ran, how warm it was."""
    return {
        "worker_id": answer.worker_id, "ttft_ms": round(answer.ttft_ms, 3),
        "e2e_ttft_ms": round(answer.e2e_ttft_ms, 3), "prefix_tokens": answer.prefix_tokens,
        "prefix_hash": answer.prefix_hash, "matched_blocks": answer.matched_blocks,
        "doc_ids": list(answer.doc_ids), "failed_workers": list(answer.failed_workers),
        "qid": answer.qid, "routing": answer.routing,
    }


@dataclass(frozen=True)
class Reply:
    """One response being written: chat or text completion, its id, model and creation time."""

    chat: bool
    model: str
    rid: str
    created: int

    @classmethod
    def new(cls, chat: bool, model: str) -> Reply:
        prefix = "chatcmpl-" if chat else "cmpl-"
        return cls(chat, model, prefix + uuid.uuid4().hex, int(time.time()))

    def _head(self, chunk: bool) -> dict[str, Any]:
        kind = "chat.completion" if self.chat else "text_completion"
        return {"id": self.rid, "object": kind + (".chunk" if chunk and self.chat else ""),
                "created": self.created, "model": self.model}

    def body(self, answer: Answer) -> dict[str, Any]:
        """The whole, non-streamed response."""
        choice: dict[str, Any] = {"index": 0, "finish_reason": answer.finish_reason,
                                  "logprobs": None}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": answer.text}
        else:
            choice["text"] = answer.text
        return {**self._head(False), "choices": [choice], "usage": usage(answer),
                "ragwarm": extension(answer)}

    def chunk(self, text: str, finish_reason: str | None = None,
              role: bool = False) -> dict[str, Any]:
        """One streamed piece of the answer (chat: a delta; the first carries the role)."""
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason, "logprobs": None}
        if self.chat:
            choice["delta"] = {"role": "assistant", "content": text} if role else (
                {"content": text} if text else {})
        else:
            choice["text"] = text
        return {**self._head(True), "choices": [choice]}

    def usage_chunk(self, answer: Answer) -> dict[str, Any]:
        """The last chunk when `stream_options.include_usage`: no choices, the usage."""
        return {**self._head(True), "choices": [], "usage": usage(answer),
                "ragwarm": extension(answer)}


def sse(body: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def models_body(served: Served, created: int) -> dict[str, Any]:
    """`/v1/models`: the served model and each alias, as vLLM lists its served names."""
    return {"object": "list", "data": [
        {"id": name, "object": "model", "created": created, "owned_by": "ragwarm",
         "root": served.model_id} for name in served.names]}
