"""The configuration tree of one CLI run: every component's settings, each read once, and
where each value in effect came from.

`main` puts one tree on the click context; the commands take their settings from it
(`tree_of(ctx).kafka`) instead of building them again, and `ragwarm config` prints it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import click
from pydantic import AliasChoices
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from ragwarm.settings import HomeSettings, KafkaSettings, ModelSettings, StackSettings

S = TypeVar("S", bound=BaseSettings)
Source = Literal["default", "env"]


@dataclass(frozen=True)
class Setting:
    """One setting in effect: the variable that sets it, its value (secrets masked), the value's
    source, and the default it replaced."""

    component: str
    variable: str
    value: Any
    source: Source
    default: Any


class ConfigTree:
    """Every component's settings for one run, each read from the environment on first use.

    Lazy on purpose: a command validates only the settings it needs, so a bad
    RAGWARM_WORKER_* value does not stop `ragwarm topics list`.
    """

    def __init__(self) -> None:
        self._loaded: dict[type[BaseSettings], BaseSettings] = {}

    def get(self, cls: type[S]) -> S:
        if cls not in self._loaded:
            self._loaded[cls] = cls()
        return self._loaded[cls]  # type: ignore[return-value]

    @property
    def home(self) -> HomeSettings:
        return self.get(HomeSettings)

    @property
    def kafka(self) -> KafkaSettings:
        return self.get(KafkaSettings)

    @property
    def models(self) -> ModelSettings:
        return self.get(ModelSettings)

    @property
    def stack(self) -> StackSettings:
        return self.get(StackSettings)


def tree_of(ctx: click.Context | None = None) -> ConfigTree:
    """The run's tree (set by `main`), or a fresh one for a command invoked on its own."""
    ctx = ctx or click.get_current_context(silent=True)
    found = ctx.find_object(ConfigTree) if ctx else None
    return found or ConfigTree()


def env_names(cls: type[BaseSettings], name: str, field: FieldInfo) -> list[str]:
    """The variables that set field `name` of `cls`, in pydantic-settings' order (upper case)."""
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [c.upper() for c in alias.choices if isinstance(c, str)]
    if isinstance(alias, str):
        return [alias.upper()]
    return [f"{cls.model_config.get('env_prefix', '')}{name}".upper()]


def source_of(names: list[str], environ: Mapping[str, str]) -> Source:
    """"env" when the environment sets any of `names` (case-insensitively, as pydantic-settings
    reads it), else "default"."""
    present = {k.upper() for k in environ}
    return "env" if any(n in present for n in names) else "default"


def effective(settings: BaseSettings, environ: Mapping[str, str] | None = None) -> list[Setting]:
    """Each field of `settings` with its value in effect and its source, secrets masked.

    A nested component's settings are skipped: they are listed under their own class.
    """
    environ = os.environ if environ is None else environ
    cls = type(settings)
    # JSON mode prints a SecretStr as '**********', so no secret leaves this function.
    values = settings.model_dump(mode="json")
    defaults = cls.model_construct().model_dump(mode="json")  # construct reads no environment
    rows = []
    for name, field in cls.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseSettings):
            continue
        names = env_names(cls, name, field)
        rows.append(Setting(cls.__name__, names[0], values[name], source_of(names, environ),
                            defaults.get(name)))
    return rows
