"""Typed settings of the RAG layer: chunking, retrieval, the prompt, and the Qdrant connection."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant. Answer the question using only the context below. "
    "If the context does not contain the answer, say that you do not know."
)


class RagSettings(BaseSettings):
    """How documents are chunked and embedded, and how the canonical prompt is built."""

    model_config = SettingsConfigDict(env_prefix="RAGWARM_RAG_", extra="forbid")

    chunk_tokens: int = Field(
        default=256, ge=16, le=4096, description="Most LLM tokens in one chunk."
    )
    chunk_overlap: int = Field(
        default=0,
        ge=0,
        description="LLM tokens of whole trailing lines repeated at the next chunk's start.",
    )
    top_k: int = Field(default=3, ge=1, le=64, description="Chunks retrieved per question.")
    system_prompt: str = Field(
        default=DEFAULT_SYSTEM_PROMPT, min_length=1, description="First part of every prompt."
    )
    collection: str = Field(
        default="ragwarm_chunks",
        pattern=r"^[A-Za-z0-9_-]{1,200}$",
        description="Qdrant collection of chunk vectors (document versions go to <name>_docs).",
    )
    embed_batch_size: int = Field(default=32, ge=1, le=4096, description="Texts per embed call.")
    embed_threads: int = Field(
        default=1,
        ge=0,
        description="Torch threads while embedding (0: torch's default).",
    )
    embed_precision: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto",
        description="Embedding math: auto uses bfloat16 on CPUs with native bf16, else float32.",
    )

    @model_validator(mode="after")
    def _overlap_fits(self) -> RagSettings:
        if self.chunk_overlap >= self.chunk_tokens:
            raise ValueError("chunk_overlap must be smaller than chunk_tokens")
        return self


class QdrantSettings(BaseSettings):
    """Where vectors live: local mode on a disk path, or a Qdrant server when `url` is set."""

    model_config = SettingsConfigDict(env_prefix="RAGWARM_QDRANT_", extra="forbid")

    url: str | None = Field(
        default=None, description="Qdrant server URL; unset means local mode on `path`."
    )
    api_key: SecretStr | None = Field(default=None, description="API key of the Qdrant server.")
    path: Path | None = Field(
        default=None,
        description="Directory of the local-mode store (one process at a time may open it); "
        "default: $RAGWARM_HOME/qdrant.",
    )
    timeout_s: int = Field(default=30, ge=1, description="Request timeout against a server.")
    local_sync: Literal["normal", "full"] = Field(
        default="normal",
        description="Local mode's disk syncs: normal commits to a write-ahead log without "
        "waiting for the disk (a process crash loses nothing; after a power cut, remove the "
        "store's folder and the app rebuilds it from Kafka); full syncs every point written.",
    )

    @property
    def local(self) -> bool:
        return self.url is None
