"""The streams app's views and the workers as one httpx MockTransport handler, and a
RagClient over it: what the client tests (`test_client*.py`) run the client against."""

from __future__ import annotations

import json

import httpx

from rag.prompt import PromptBuilder
from ragwarm.client.core import ClientConfig
from ragwarm.client.rag import RagClient
from ragwarm.client.settings import ClientSettings
from schemas import QueryEvent, decode, encode
from tests.unit.conftest import WordTokenizer

HASH = "ab" * 32
CHUNKS = [
    {
        "chunk_id": "docs/faq.md#0",
        "content_hash": HASH,
        "doc_id": "docs/faq.md",
        "text": "Reset the admin password with argocd account update-password.",
        "score": 0.9,
        "version": 27,
    },
    {
        "chunk_id": "docs/faq.md#1",
        "content_hash": "cd" * 32,
        "doc_id": "docs/faq.md",
        "text": "Disable the admin user with admin.enabled false.",
        "score": 0.8,
        "version": 27,
    },
]


def sse_chunk(text: str, finish: str | None = None) -> str:
    return json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": finish}]})


BROKEN = b"data: " + sse_chunk("Hi").encode() + b"\n\n"  # cut off before finish and [DONE]


def sse_body(text: str = "Hi there", cached: int = 16) -> bytes:
    usage = {
        "prompt_tokens": 60,
        "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": cached},
        "ttft_ms": 3.5,
    }
    events = [
        sse_chunk("Hi"),
        sse_chunk(text[2:], "length"),
        json.dumps({"choices": [], "usage": usage}),
        "[DONE]",
    ]
    return "".join(f"data: {e}\n\n" for e in events).encode()


class FakeCluster:
    """The streams app's views and the workers as one httpx MockTransport handler."""

    def __init__(self, chosen: str | None, behaviour: dict[str, object]):
        self.chosen = chosen
        self.behaviour = behaviour  # worker id -> "ok" | status code | bytes | Exception
        self.calls: list[str] = []
        self.bodies: list[dict] = []

    def url(self, worker_id: str) -> str:
        return f"http://{worker_id}.test"

    def __call__(self, request: httpx.Request) -> httpx.Response:
        host, path = request.url.host, request.url.path
        self.calls.append(f"{host}{path}")
        if host == "streams.test":
            return self.streams(path, request)
        worker = host.removesuffix(".test")
        if path.startswith("/health"):
            return httpx.Response(200, json={"status": "live"})
        self.bodies.append(json.loads(request.content))
        outcome = self.behaviour[worker]
        if isinstance(outcome, Exception):
            raise outcome
        if isinstance(outcome, int):
            return httpx.Response(outcome, json={"error": {"message": f"status {outcome}"}})
        content = outcome if isinstance(outcome, bytes) else sse_body()
        return httpx.Response(200, content=content, headers={"content-type": "text/event-stream"})

    def streams(self, path: str, request: httpx.Request) -> httpx.Response:
        workers = [{"worker_id": w, "url": self.url(w), "ready": True} for w in self.behaviour]
        if path == "/ragwarm/retrieve":
            return httpx.Response(200, json={"chunks": CHUNKS})
        if path == "/ragwarm/route":
            chosen = self.chosen
            return httpx.Response(
                200,
                json={
                    "worker_id": chosen,
                    "url": self.url(chosen) if chosen else None,
                    "matched_blocks": 2 if chosen else 0,
                    "workers": [{"worker_id": w["worker_id"], "url": w["url"]} for w in workers],
                },
            )
        if path == "/ragwarm/workers":
            return httpx.Response(200, json={"workers": workers})
        return httpx.Response(200, json={"status": "ok"})


class ListEmitter:
    def __init__(self):
        self.events: list[QueryEvent] = []

    def emit(self, event: QueryEvent) -> None:
        self.events.append(decode(encode(event), QueryEvent))

    def close(self) -> None:
        pass


def make_client(cluster: FakeCluster, **settings) -> tuple[RagClient, ListEmitter]:
    transport = httpx.MockTransport(cluster)
    config = ClientSettings(streams_url="http://streams.test", max_tokens=4, **settings)
    streams = httpx.Client(base_url=config.streams_url, transport=transport)
    emitter = ListEmitter()
    client = RagClient(
        ClientConfig(config, "m"),
        PromptBuilder(WordTokenizer(), "Answer from context."),
        streams,
        emitter=emitter,
        transport=transport,
    )  # type: ignore[arg-type]
    return client, emitter


class DownCluster(FakeCluster):
    """A FakeCluster whose streams app can be taken down: refused, timing out or 5xx."""

    def __init__(self, chosen, behaviour):
        super().__init__(chosen, behaviour)
        self.down: object = None  # None (up) | an exception to raise | a status code

    def streams(self, path, request):
        if self.down is None:
            return super().streams(path, request)
        if isinstance(self.down, Exception):
            raise self.down
        return httpx.Response(int(self.down), text="the app is restarting")
