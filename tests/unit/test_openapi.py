"""The OpenAPI documents are generated from the code and list exactly the routes it serves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ragwarm.cli.openapi import OUT_DIR, ROUTES, render, streams_routes

ROOT = Path(__file__).resolve().parents[2]
AIOHTTP = r'web\.(get|post)\("([^"]+)"'
SOURCES = {
    "worker": (AIOHTTP, [ROOT / "workers" / "service.py"]),
    "gateway": (AIOHTTP, [ROOT / "ragwarm" / "gateway" / "app.py"]),
}


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
