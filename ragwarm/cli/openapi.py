"""OpenAPI 3.1 documents of the worker, gateway and streams HTTP APIs (`ragwarm openapi`).

Request bodies come from the pydantic models the servers validate with; the paths are listed
here and a test checks them against the routes each server registers, so both stay in sync.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from pydantic import BaseModel

from ragwarm.gateway.protocol import ChatRequest
from ragwarm.gateway.protocol import CompletionRequest as GatewayCompletion
from ragwarm.settings import REPO_ROOT
from streams.shell.views.bodies import RetrieveBody, RouteBody
from workers.api import CompletionRequest, PrefillRequest

OUT_DIR = Path("docs") / "openapi"
JSON = "application/json"
ERROR = {"type": "object", "properties": {"error": {"type": "object", "properties": {
    "message": {"type": "string"}, "type": {"type": "string"},
    "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}

Body = type[BaseModel] | None
# service -> [(method, path, summary, request body)]
ROUTES: dict[str, list[tuple[str, str, str, Body]]] = {
    "worker": [
        ("get", "/health/live", "200 while the process runs.", None),
        ("get", "/health/ready", "200 once the model is loaded and the hot set warmed; else 503.",
         None),
        ("get", "/metrics", "Prometheus metrics (ragwarm_*, vllm:* and the seed's names).", None),
        ("get", "/v1/models", "The served model (OpenAI shape).", None),
        ("get", "/v1/cache", "Cached prefixes, bytes, budgets.", None),
        ("post", "/v1/completions", "OpenAI completions, streaming or not, with cached_tokens.",
         CompletionRequest),
        ("post", "/v1/prefill", "Store the block-aligned prefix of a prompt (non-standard).",
         PrefillRequest),
    ],
    "gateway": [
        ("get", "/health", "200 once the gateway can serve, else 503 with the reason (vLLM's "
         "probe).", None),
        ("get", "/health/live", "200 while the process runs.", None),
        ("get", "/health/ready", "200 once the streams app answered and the tokenizer loaded.",
         None),
        ("get", "/metrics", "Prometheus metrics (ragwarm_gateway_*): requests by route and "
         "status, latency, cached tokens, retrieval latency, failovers.", None),
        ("get", "/v1/models", "The model the gateway serves, then its aliases.", None),
        ("post", "/v1/chat/completions", "Retrieval + canonical prompt + warm worker; the last "
         "user message is the question.", ChatRequest),
        ("post", "/v1/completions", "The same with the prompt as the question.",
         GatewayCompletion),
    ],
    "streams": [
        ("get", "/ragwarm/health", "200 while the app runs, with the canonical-prompt "
         "parameters clients must match.", None),
        ("get", "/ragwarm/health/ready", "503 until the tables are recovered and the index "
         "matches them.", None),
        ("get", "/ragwarm/stats", "Pipeline counters and table sizes.", None),
        ("get", "/ragwarm/workers", "The worker table.", None),
        ("get", "/ragwarm/hot", "The hot set and the top prefixes and questions.", None),
        ("get", "/ragwarm/docs", "Document versions, chunk hashes and dependent prefixes.", None),
        ("get", "/ragwarm/prefixes/{prefix_hash}", "One prefix: state and holders.", None),
        ("get", "/metrics", "Prometheus metrics (ragwarm_streams_*).", None),
        ("post", "/ragwarm/route", "The worker holding the longest prefix of a prompt.",
         RouteBody),
        ("post", "/ragwarm/retrieve", "Top-k chunks of a question, with their text.",
         RetrieveBody),
        ("post", "/ragwarm/warmup", "Warm this instance's hot set now (scheduled warmups).",
         None),
    ],
}
TITLES = {"worker": "ragwarm worker", "gateway": "ragwarm gateway (OpenAI-compatible)",
          "streams": "ragwarm streams app views"}


def document(service: str) -> dict[str, Any]:
    """The OpenAPI document of one service."""
    paths: dict[str, dict[str, Any]] = {}
    for method, path, summary, body in ROUTES[service]:
        operation: dict[str, Any] = {"summary": summary, "responses": {
            "200": {"description": "OK"},
            "default": {"description": "Error", "content": {JSON: {"schema": ERROR}}}}}
        if path.endswith("}"):
            name = path.rsplit("{", 1)[1].rstrip("}")
            operation["parameters"] = [{"name": name, "in": "path", "required": True,
                                        "schema": {"type": "string"}}]
        if body is not None:
            operation["requestBody"] = {"required": True, "content": {
                JSON: {"schema": body.model_json_schema()}}}
        paths.setdefault(path, {})[method] = operation
    return {"openapi": "3.1.0", "info": {"title": TITLES[service], "version": "0.1.0"},
            "paths": paths}


def streams_routes() -> set[tuple[str, str]]:
    """(method, path) of every streams view, read from the views the app registers."""
    from types import SimpleNamespace
    from typing import cast

    from streams.handle.handlers import HandlerDeps
    from streams.settings import StreamsSettings
    from streams.shell.metrics_view import METRICS_PATH
    from streams.shell.views import pages

    found = {("get", METRICS_PATH)}
    # Only the paths and view classes are read, no view runs: settings are all it needs.
    deps = cast(HandlerDeps, SimpleNamespace(settings=StreamsSettings()))
    for path, page in pages(deps).items():
        if isinstance(page, type):  # a View: the methods it defines
            found |= {(m, path) for m in ("get", "post", "put", "delete") if m in vars(page)}
        else:
            found.add(("get", path))
    return found


def render(service: str) -> str:
    return json.dumps(document(service), indent=2, sort_keys=True) + "\n"


@click.command()
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Folder to write to [docs/openapi of the checkout].")
def openapi(out: Path | None) -> None:
    """Write the OpenAPI documents of the worker, gateway and streams views."""
    folder = out or REPO_ROOT / OUT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    for service in ROUTES:
        (folder / f"{service}.json").write_text(render(service))
        click.echo(f"wrote {folder / f'{service}.json'}")
