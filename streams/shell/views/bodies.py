"""Request bodies of the views as pydantic models, and reading one from raw bytes."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

MAX_BODY_BYTES = 1_000_000
MAX_HASHES = 4096
MAX_K = 50
MAX_QUESTION_CHARS = 8192

# A faust page: a View subclass or an `async def (web, request, ...)` handler.
Page = type | Callable[..., Any]
B = TypeVar("B", bound=BaseModel)


class BadRequest(Exception):
    """A request the view refuses: the HTTP status and a message saying what is wrong."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class RouteBody(BaseModel):
    """POST /ragwarm/route: the block hashes of a prompt."""

    model_config = ConfigDict(extra="forbid")

    block_hashes: list[StrictStr] = Field(max_length=MAX_HASHES)


class RetrieveBody(BaseModel):
    """POST /ragwarm/retrieve: a question, its tenant (or the default) and how many chunks."""

    model_config = ConfigDict(extra="forbid")

    question: StrictStr = Field(min_length=1, max_length=MAX_QUESTION_CHARS,
                                pattern=r"\S")  # not only whitespace
    tenant: StrictStr | None = None
    k: StrictInt = Field(default=3, ge=1, le=MAX_K)


def parse_body(raw: bytes, model: type[B]) -> B:
    """The body as `model`; BadRequest (413 or 400) with a message naming the field."""
    if len(raw) > MAX_BODY_BYTES:
        raise BadRequest(413, f"body larger than {MAX_BODY_BYTES} bytes")
    try:
        data = json.loads(raw or b"{}")
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(400, f"body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest(400, "body: expected a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise BadRequest(400, validation_message(exc)) from None


def validation_message(exc: ValidationError) -> str:
    """'field: what is wrong' for every error, joined."""
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(p) for p in error["loc"]) or "body"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)
