"""The OpenAPI documents are generated from the code and list exactly the routes it serves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ragwarm.cli.openapi import OUT_DIR, ROUTES, render

ROOT = Path(__file__).resolve().parents[2]
AIOHTTP = r'web\.(get|post)\("([^"]+)"'
SOURCES = {
    "worker": (AIOHTTP, [ROOT / "workers" / "service.py"]),
    "gateway": (AIOHTTP, [ROOT / "ragwarm" / "gateway" / "app.py"]),
}


def streams_routes() -> set[tuple[str, str]]:
    """Faust pages: a function page is a GET; a View class page has the methods it defines.

    Most views are registered from `streams.views.pages`; a few modules add their own
    `app.page` (metrics, scheduled warmup): both are read.
    """
    from types import SimpleNamespace

    from faust.web import View

    from streams.settings import StreamsSettings
    from streams.views import pages

    found = set()
    for route, page in pages(SimpleNamespace(settings=StreamsSettings())).items():  # type: ignore[arg-type]
        if isinstance(page, type) and issubclass(page, View):
            found |= {(m, route) for m in ("get", "post") if m in vars(page)}
        else:
            found.add(("get", route))
    for path in (ROOT / "streams").glob("*.py"):
        text = path.read_text()
        for match in re.finditer(r'app\.page\("([^"]+)"\)\s*\n\s*(async def|class)', text):
            route, kind = match.groups()
            if kind == "async def":
                found.add(("get", route))
                continue
            body = text[match.end():].split("\n    @app.page", 1)[0]
            found |= {(m, route) for m in re.findall(r"async def (get|post)\(", body)}
    return found | view_routes()


def view_routes() -> set[tuple[str, str]]:
    """The pages of `streams.views`, which registers them from one table."""
    from types import SimpleNamespace

    from streams.settings import StreamsSettings
    from streams.views import pages

    deps = SimpleNamespace(settings=StreamsSettings())  # pages read only settings when built
    found = set()
    for route, page in pages(deps).items():  # type: ignore[arg-type]
        if isinstance(page, type):
            found |= {(m, route) for m in ("get", "post") if m in vars(page)}
        else:
            found.add(("get", route))
    return found


def served(service: str) -> set[tuple[str, str]]:
    if service == "streams":
        return streams_routes()
    pattern, files = SOURCES[service]
    return {m for f in files for m in re.findall(pattern, f.read_text())}


@pytest.mark.parametrize("service", sorted(ROUTES))
def test_the_document_lists_exactly_the_served_routes(service: str) -> None:
    listed = {(method, path) for method, path, _, _ in ROUTES[service]}
    served_routes = {(m, re.sub(r"\{(\w+)\}", r"{\1}", p)) for m, p in served(service)}
    assert listed == served_routes


@pytest.mark.parametrize("service", sorted(ROUTES))
def test_the_committed_document_is_current(service: str) -> None:
    committed = (ROOT / OUT_DIR / f"{service}.json").read_text()
    assert committed == render(service), "regenerate with: ragwarm openapi"
