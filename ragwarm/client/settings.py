"""Settings of the RAG client (`RAGWARM_CLIENT_*`): where the streams app is, pools, timeouts."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class ClientSettings(BaseSettings):
    """The RAG client: streams app URL, tenant, generation, keep-alive pools and retries."""

    model_config = SettingsConfigDict(env_prefix="RAGWARM_CLIENT_", extra="forbid")

    streams_url: str = Field(
        default="http://127.0.0.1:6066",
        description="Base URL of the streams app's web views (retrieval and routing).",
    )
    tenant: str = Field(default="default", min_length=1, description="Tenant of the queries.")
    max_tokens: int = Field(default=64, ge=1, description="Tokens generated per answer.")
    temperature: float = Field(
        default=0.0, ge=0.0, le=2.0, description="Sampling temperature; 0 is greedy."
    )
    api_key: SecretStr | None = Field(
        default=None,
        description="Bearer token sent to the workers and the streams app's views (if they "
        "require one); a tenant-bound key must grant `tenant`.",
    )
    connect_timeout_s: float = Field(default=5.0, gt=0, description="TCP connect timeout.")
    read_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="Longest wait for the next bytes of a response (a cold prefill on CPU "
        "can take seconds).",
    )
    pool_connections: int = Field(
        default=4, ge=1, description="Keep-alive connections kept open per host."
    )
    pool_max: int = Field(default=16, ge=1, description="Most connections open per host.")
    keepalive_s: float = Field(
        default=60.0,
        gt=0,
        description="Idle time before a pooled connection is closed (below the servers' 75 s).",
    )
    max_attempts: int = Field(
        default=3, ge=1, description="Workers tried per query before giving up."
    )
    emit_queries: bool = Field(
        default=True, description="Publish one QueryEvent per answered query to rag.queries."
    )
    retrieval: Literal["streams", "qdrant", "auto"] = Field(
        default="auto",
        description="Where questions are retrieved. `qdrant`: straight from the Qdrant server "
        "at RAGWARM_QDRANT_URL (the one the streams app indexes into), so queries keep "
        "being answered while the streams app is down; the client then loads the embedding "
        "model itself (memory, start-up time). `streams`: through the streams app's "
        "/ragwarm/retrieve (no embedder in the client, but no answer while the app is down). "
        "`auto`: qdrant when RAGWARM_QDRANT_URL is set, else streams.",
    )
    worker_table_max_age_s: float = Field(
        default=300.0,
        gt=0,
        description="When the streams app cannot route, the client routes by load to the "
        "workers it last learned; a table older than this is still used (a dead worker is "
        "skipped by failover) but the answer's routing says `stale-table`.",
    )
