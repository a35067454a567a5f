"""Every component's settings class, and the check that each RAGWARM_ variable names a setting.

pydantic-settings ignores environment variables it does not know, so a misspelt one
(`RAGWARM_STREAMS_TTL_SECONDS`) would silently leave the default in force; this check
turns that into an error with the nearest valid name.
"""

from __future__ import annotations

import difflib
import importlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pydantic import BaseModel
from pydantic_settings import BaseSettings

PREFIX = "RAGWARM_"

# module:class of every component's settings; docs/configuration.md's table is generated
# from these.
SETTINGS: tuple[str, ...] = (
    "ragwarm.settings:HomeSettings",
    "ragwarm.settings:SecuritySettings",
    "ragwarm.settings:KafkaSettings",
    "ragwarm.settings:ModelSettings",
    "ragwarm.settings:StackSettings",
    "ragwarm.logs:LogSettings",
    "ragwarm.kafka.local:LocalKafkaSettings",
    "rag.settings:RagSettings",
    "rag.settings:QdrantSettings",
    "workers.settings:WorkerSettings",
    "streams.settings:StreamsSettings",
    "ragwarm.client.settings:ClientSettings",
    "ragwarm.gateway.settings:GatewaySettings",
    "ragwarm.bench.strategies.settings:StrategySettings",
)


@dataclass(frozen=True)
class Unknown:
    """A RAGWARM_ variable no setting reads, and the valid name closest to it (if any)."""

    name: str
    suggestion: str | None

    def __str__(self) -> str:
        hint = f" (did you mean {self.suggestion}?)" if self.suggestion else ""
        return f"{self.name}{hint}"


def settings_classes() -> list[type[BaseSettings]]:
    found = []
    for target in SETTINGS:
        module, _, name = target.partition(":")
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue  # a component not installed in this checkout
    return found


def variable_names(cls: type[BaseSettings]) -> list[str]:
    """The environment variables `cls` reads, nested models as `<field><delimiter>`."""
    prefix = cls.model_config.get("env_prefix", "")
    delimiter = cls.model_config.get("env_nested_delimiter")
    names = []
    for name, field in cls.model_fields.items():
        full = f"{prefix}{name}".upper()
        names.append(full)
        if delimiter and _is_model(field.annotation):
            names.append(f"{full}{delimiter}")
    return names


def _is_model(annotation: object) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def unknown_variables(environ: Mapping[str, str], valid: Iterable[str]) -> list[Unknown]:
    """RAGWARM_ variables of `environ` that are not in `valid`, each with a suggestion.

    A valid name ending in a nested delimiter accepts every variable it starts.
    """
    exact = {v for v in valid if v.startswith(PREFIX)}
    nested = tuple(v for v in exact if not v[-1].isalnum())
    known = sorted(v for v in exact if v[-1].isalnum())
    unknown = []
    for name in sorted(environ):
        if not name.startswith(PREFIX) or name in exact or name.startswith(nested or ("\0",)):
            continue
        unknown.append(Unknown(name, nearest(name, known)))
    return unknown


def nearest(name: str, known: Iterable[str]) -> str | None:
    """The valid name sharing the most words with `name`, then the most similar spelling.

    Shared words come first so `RAGWARM_STREAMS_TTL_SECONDS` finds `…_PREFIX_TTL_S`
    rather than the merely similar-looking `…_PARTITIONS`.
    """
    scored = [(_score(name, candidate), candidate) for candidate in known]
    best = max(scored, default=None)
    return best[1] if best and best[0] >= 0.6 else None


def _score(name: str, candidate: str) -> float:
    words, other = _words(name), _words(candidate)
    spelling = difflib.SequenceMatcher(None, "_".join(words), "_".join(other)).ratio()
    return len(set(words) & set(other)) + spelling


def _words(name: str) -> list[str]:
    return name.removeprefix(PREFIX).split("_")


def environment_problems(environ: Mapping[str, str] | None = None) -> list[Unknown]:
    """Unknown RAGWARM_ variables of the process environment (or `environ`)."""
    valid = [n for cls in settings_classes() for n in variable_names(cls)]
    return unknown_variables(os.environ if environ is None else environ, valid)


def problems_message(problems: list[Unknown]) -> str:
    listed = "\n".join(f"  {p}" for p in problems)
    return (f"unknown RAGWARM_ variables (no setting reads them; see `ragwarm config`):\n"
            f"{listed}")
