"""Settings of the OpenAI-compatible gateway (`RAGWARM_GATEWAY_*`): listen address, keys, limits."""

from __future__ import annotations

from typing import Annotated

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
