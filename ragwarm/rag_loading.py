"""The streams app's RAG layer opened in the background, so Faust starts without waiting for it.

Loading the tokenizer imports torch through transformers, and the embedder and the local index
follow: 12 s on a quiet 2-core machine, about 30 s under load, all of it before Faust began
to join its group (issue 40). Behind `LoadingRag` the app joins its group, recovers its
tables and serves the views that need no model (health, route, state) meanwhile; the calls that
need the RAG layer wait for it on the store thread, where every such call runs
(`HandlerDeps.blocking`), never on the event loop.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from schemas.prefix import PromptParams

log = logging.getLogger(__name__)

# The RagPort and ReplicaStore methods (streams.handle.ports): each is forwarded to the loaded
# service once it is there.
FORWARDED = frozenset({
    "index", "index_many", "prefix_for_question", "prefixes_for_questions", "prefix_for_refs",
    "refs_current", "chunk_tokens", "opening_ids", "question_ids", "synthesis_prompt",
    "search", "indexed_versions", "take_outgoing", "apply_replicated", "replica_offsets",
    "save_replica_offsets",
})


class RagLoadFailed(RuntimeError):
    """The RAG layer could not be loaded (a model or the local index would not open)."""


class LoadingRag:
    """A `RagPort` whose service (`ragwarm.rag_port.RagService`) `open` builds on a thread of
    its own. A call blocks until the service is there, then runs on it; `prompt_params`
    comes from the settings (`params`), so the health view answers at once."""

    def __init__(self, open_service: Callable[[Callable[[str], None]], Any],
                 params: PromptParams, replicated: bool) -> None:
        self._open, self._params = open_service, params
        self._service: Future = Future()
        self._lock = threading.Lock()  # `replicated` and `count_embedding` race the load
        self._replicated = replicated
        self._stats: Counter | None = None
        self._part: str | None = "tokenizer"  # what is loading now; None once loaded
        self.error: BaseException | None = None

    def start(self, on_failure: Callable[[BaseException], None] = lambda exc: None) -> None:
        """Begin loading; `on_failure` is called on the loading thread if it fails."""

        def load() -> None:
            try:
                service = self._open(self._loading)
            except BaseException as exc:  # noqa: BLE001 - handed over whole, to every caller
                log.exception("the RAG layer failed to load (%s)", self._part)
                self.error = exc
                self._service.set_exception(exc)
                on_failure(exc)
                return
            with self._lock:
                service.replicated = self._replicated
                if self._stats is not None:
                    service.count_embedding(self._stats)
                self._part = None
                self._service.set_result(service)
            log.info("the RAG layer is loaded (tokenizer, embedder, index)")

        threading.Thread(target=load, name="ragwarm-rag-load", daemon=True).start()

    def _loading(self, part: str) -> None:
        self._part = part

    def loading(self) -> str | None:
        """The part loading now (`tokenizer`, `embedder`, `index`), `failed` after a failure,
        None once every part is loaded."""
        return "failed" if self.error is not None else self._part

    def loaded(self, timeout_s: float | None = None) -> Any:
        """The service, once loaded (blocking); RagLoadFailed when loading failed."""
        try:
            return self._service.result(timeout_s)
        except TimeoutError:
            raise
        except BaseException as exc:
            raise RagLoadFailed(f"the RAG layer failed to load: {exc}") from exc

    @property
    def replicated(self) -> bool:
        return self._replicated

    @replicated.setter
    def replicated(self, value: bool) -> None:
        with self._lock:
            self._replicated = value
            if self._service.done() and self.error is None:
                self._service.result().replicated = value

    def count_embedding(self, stats: Counter) -> None:
        """As `RagService.count_embedding`, applied once the service is loaded."""
        with self._lock:
            self._stats = stats
            if self._service.done() and self.error is None:
                self._service.result().count_embedding(stats)

    def prompt_params(self) -> PromptParams:
        return self._params

    def close(self) -> None:
        """Close the service if it was loaded; a load still running is left to finish (its
        thread is a daemon, and the store it may open is closed with the process)."""
        if self._service.done() and self.error is None:
            self._service.result().close()

    def __getattr__(self, name: str) -> Any:
        if name not in FORWARDED:
            raise AttributeError(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return getattr(self.loaded(), name)(*args, **kwargs)

        call.__name__ = name  # HandlerDeps.blocking names its timings after the function
        return call
