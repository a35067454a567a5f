"""Settings of the OpenAI-compatible gateway (`RAGWARM_GATEWAY_*`): listen address, keys, limits."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


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
    open_retry_s: float = Field(
        default=2.0, gt=0, description="Wait between attempts to reach the streams app at start."
    )
