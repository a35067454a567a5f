"""Settings of the OpenAI-compatible gateway (`RAGWARM_GATEWAY_*`): listen address, keys, limits."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class GatewaySettings(BaseSettings):
    """The gateway: where it listens, which API key belongs to which tenant, request bounds."""

    model_config = SettingsConfigDict(env_prefix="RAGWARM_GATEWAY_", extra="forbid")

    host: str = Field(default="127.0.0.1", description="Interface the gateway listens on.")
    port: int = Field(default=8088, ge=1, le=65535, description="Port of the gateway.")
    keys: dict[str, SecretStr] = Field(
        default_factory=dict,
        description='Tenant -> API key, as JSON: {"acme": "sk-..."}. A key serves its tenant '
        "only. With no keys and no operator key, any key is accepted (local use).",
    )
    operator_key: SecretStr | None = Field(
        default=None,
        description="A key that may act for any tenant, named by the tenant header.",
    )
    tenant_header: str = Field(
        default="X-Ragwarm-Tenant", description="Header naming the tenant of an operator request."
    )
    max_tokens: int = Field(
        default=512, ge=1, description="Most tokens one request may ask for."
    )
    # A question is embedded and put in the prompt before the worker's own bounds apply.
    max_question_chars: int = Field(
        default=8000, ge=1, description="Most characters of a question (the last user "
        "message, or the prompt); a longer one is refused with 400.",
    )
    model_aliases: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Other model names answered by the served model, comma-separated "
        "(gpt-4o-mini,gpt-4o), so apps written for another API change only the base URL.",
    )
    open_retry_s: float = Field(
        default=2.0, gt=0, description="Wait between attempts to reach the streams app at start."
    )

    retrieval: Literal["streams", "replica", "qdrant", "auto"] = Field(
        default="auto",
        description="Where questions are retrieved (docs/architecture.md, The query path). "
        "`qdrant`: the Qdrant server at RAGWARM_QDRANT_URL; `replica`: the gateway's own "
        "in-memory copy of the index, rebuilt from rag.chunks at start (memory: every chunk "
        "and vector; the embedding model loads in the gateway); `streams`: the streams "
        "app's /ragwarm/retrieve (nothing is answered while it is down); `auto`: qdrant "
        "with a URL, else the replica once it has caught up, the streams app before.",
    )
    follow_workers: bool = Field(
        default=True,
        description="Keep the gateway's own worker table from worker.events and route by it "
        "(by the longest held prefix, as the streams app does), so routing does not wait "
        "on the streams app; off: every route is asked of the app.",
    )
    worker_events_secret: SecretStr | None = Field(
        default=None,
        description="The master signing secret (as RAGWARM_STREAMS_WORKER_EVENTS_SECRET): "
        "worker events not signed with their worker's key derived from it are ignored, so "
        "a writer of worker.events cannot name the URL prompts go to.",
    )
    view_quiet_s: float = Field(
        default=15.0, gt=0,
        description="No worker event for this long (three heartbeats) and the table is not "
        "fresh: routes are asked of the streams app, else go by load (`fallback:stale-view`).",
    )
    worker_stale_s: float = Field(
        default=30.0, gt=0, description="Heartbeat age that marks a worker gone (as "
        "RAGWARM_STREAMS_WORKER_STALE_S).",
    )
    view_replay_s: float = Field(
        default=60.0, gt=0,
        description="How far back worker.events is read at start: a heartbeat lists all a "
        "worker holds, so a few heartbeats' worth rebuilds the table.",
    )

    @field_validator("keys")
    @classmethod
    def _no_empty_key(cls, keys: dict[str, SecretStr]) -> dict[str, SecretStr]:
        empty = sorted(t for t, k in keys.items() if not k.get_secret_value())
        if empty:
            raise ValueError(f"empty API key for tenant(s) {', '.join(empty)}: an empty key "
                             "would match a request that sends none; give a key or drop it")
        return keys

    @field_validator("operator_key")
    @classmethod
    def _operator_key_not_empty(cls, key: SecretStr | None) -> SecretStr | None:
        if key is not None and not key.get_secret_value():
            raise ValueError("the operator key is empty: unset it or give a key")
        return key

    @field_validator("model_aliases", mode="before")
    @classmethod
    def _split_aliases(cls, value: object) -> object:
        if isinstance(value, str):
            return [name.strip() for name in value.split(",") if name.strip()]
        return value

