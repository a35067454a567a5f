"""The client's side of the canonical-prompt contract: refuse a streams app that builds
prompts differently, naming the setting that differs."""

from __future__ import annotations

from pydantic import ValidationError

from ragwarm.client.wire import ClientError
from schemas.prefix import PromptParams

# The setting behind each parameter, so the error says what to change.
SETTING_OF: dict[str, str] = {
    "model": "RAGWARM_MODEL_LLM_NAME",
    "block_size": "the block size (schemas.prefix.BLOCK_SIZE)",
    "top_k": "RAGWARM_RAG_TOP_K",
    "system_prompt_sha256": "RAGWARM_RAG_SYSTEM_PROMPT",
}


class PromptMismatch(ClientError):
    """The streams app warms prefixes built with other parameters than this client's."""


def check_prompt(health: dict, ours: PromptParams, url: str) -> None:
    """Raise PromptMismatch unless the health view's prompt parameters equal `ours`."""
    published = (health.get("prompt") or {}).get("params")
    if published is None:
        raise PromptMismatch(f"the streams app at {url} publishes no prompt parameters on "
                             "/ragwarm/health (an older version?); upgrade it")
    try:
        theirs = PromptParams.model_validate(published)
    except ValidationError as exc:
        raise PromptMismatch(f"the streams app at {url} publishes prompt parameters this "
                             f"client cannot read: {exc}") from None
    differing = ours.differences(theirs)
    if differing:
        details = "; ".join(_describe(name, theirs, ours) for name in differing)
        raise PromptMismatch(f"the streams app at {url} builds prompts differently, so no "
                             f"warmed prefix would ever match: {details}. Set the same "
                             "value for both")


def _describe(name: str, theirs: PromptParams, ours: PromptParams) -> str:
    there, here = getattr(theirs, name), getattr(ours, name)
    if name == "system_prompt_sha256":
        there, here = f"sha256 {there[:12]}…", f"sha256 {here[:12]}…"
    return f"{SETTING_OF.get(name, name)} is {there!r} there and {here!r} here"
