"""A blocking client for a long-lived process whose queries must not wait on the streams app:
the gateway's query path (`ragwarm.client.independent`: its own view of `worker.events` and
its own replica of `rag.chunks`) behind `RagClient`'s interface. One event loop in a thread
of its own runs every call, so threads may share one client.

`RagClient` asks the streams app to retrieve and route (and, while it is down, routes by
load to the workers it last learned); this one keeps answering warm while the app restarts,
at the cost of the gateway's start-up (it reads both topics to their ends) and, for the
replica, the embedding model in the process. Build the `OwnPath` from the gateway's settings
(`ragwarm.gateway.app.own_path(GatewaySettings())`) so the view verifies signed worker events
as the gateway does.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

from ragwarm.client.independent import GatewayClient, OwnPath, open_gateway_client
from ragwarm.client.rag import Answer, PreparedQuery
from ragwarm.client.settings import ClientSettings
from ragwarm.settings import KafkaSettings, ModelSettings

T = TypeVar("T")


class StandaloneClient:
    """`query`, `prepare`, `ask` and `close` as `RagClient` has them, run by a
    `GatewayClient`; a context manager."""

    def __init__(self, client: GatewayClient, loop: asyncio.AbstractEventLoop,
                 thread: threading.Thread) -> None:
        self.client, self._loop, self._thread = client, loop, thread

    @classmethod
    def open(cls, settings: ClientSettings, kafka: KafkaSettings,
             path: OwnPath) -> StandaloneClient:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="gateway-client", daemon=True)
        thread.start()
        try:
            client = asyncio.run_coroutine_threadsafe(
                open_gateway_client(path, settings, ModelSettings(), kafka), loop).result()
        except BaseException:
            loop.call_soon_threadsafe(loop.stop)
            raise
        return cls(client, loop, thread)

    @property
    def prompts(self) -> Any:
        return self.client.prompts

    def wait_replica(self, timeout_s: float) -> bool:
        """Whether the index replica caught up on rag.chunks within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while not self.client.replica_ready:
            if self.client.replica is None or time.monotonic() > deadline:
                return False
            time.sleep(0.5)
        return True

    def query(self, question: str, tenant: str | None = None,
              max_tokens: int | None = None) -> Answer:
        """Answer one question (retrieved and routed without the streams app if need be)."""
        return self._run(self.client.query(question, tenant, max_tokens))

    def prepare(self, question: str, tenant: str | None = None) -> PreparedQuery:
        return self._run(self.client.prepare(question, tenant))

    def ask(self, prepared: PreparedQuery, max_tokens: int | None = None,
            started: float | None = None) -> Answer:
        return self._run(self.client.ask(prepared, max_tokens, started=started))

    def close(self) -> None:
        try:
            self._run(self.client.aclose())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> StandaloneClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()
