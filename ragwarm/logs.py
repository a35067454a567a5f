"""Log output of every ragwarm process: readable text, or one JSON object a line for collectors."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class LogSettings(BaseSettings):
    """How processes log (`RAGWARM_LOG_*`)."""

    model_config = SettingsConfigDict(env_prefix="RAGWARM_LOG_", extra="forbid")

    format: Literal["text", "json"] = Field(
        default="text", description="`text` for people, `json` (one object a line) for collectors."
    )


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (UTC, ISO 8601), level, logger, message, exception."""

    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
        }
        if record.exc_info:
            body["exc"] = self.formatException(record.exc_info)
        return json.dumps(body, ensure_ascii=False, default=str)


def configure(level: int, settings: LogSettings | None = None) -> None:
    """Set up the root logger of a process in the configured format."""
    settings = settings or LogSettings()
    if settings.format == "json":
        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter())
        logging.basicConfig(level=level, handlers=[handler], force=True)
    else:
        logging.basicConfig(level=level, format=TEXT_FORMAT)


def faust_logging_config(settings: LogSettings | None = None) -> dict | None:
    """The `logging_config` for Faust's worker, which sets up logging again on its own."""
    if (settings or LogSettings()).format != "json":
        return None
    return {
        "merge": True,
        "formatters": {"json": {"()": "ragwarm.logs.JsonFormatter"}},
        "handlers": {"default": {"class": "logging.StreamHandler", "formatter": "json"}},
    }
