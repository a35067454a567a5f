"""The streams app on a simulated clock: dict tables, one in-order queue, a RAG port that
indexes nothing itself, and a runner for handlers that never wait.

The benchmarks (`ragwarm bench strategies`, `replay --evaluate`) and the streams unit tests
share this harness. It depends on `streams/` and `schemas/` alone: whatever feeds it (the
real store, a query log) is handed in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from schemas import ChunkRef, KbChange, QueryEvent, WarmupCommand, WorkerEvent
from schemas.prefix import PromptParams
from streams.decide.records import DocLink, PrefixOp, ReadyRewarm
from streams.decide.synthetic import SynthesisPrompt
from streams.handle.deps import StreamTables
from streams.handle.ports import WarmPrefix

Item = PrefixOp | DocLink | WorkerEvent | KbChange | QueryEvent | ReadyRewarm


def run_sync(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a handler that never waits: in the simulator every send and store call is
    immediate, so the coroutine finishes on its first step."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("a streams handler waited on I/O inside the simulator")


def dict_tables() -> StreamTables:
    """The app's tables as plain dicts (Faust changelog tables in the app)."""
    return StreamTables(docs={}, doc_prefixes={}, prefixes={}, workers={})


class RagSource(Protocol):
    """The query side of `streams.handle.ports.RagPort`: what the simulated app retrieves from."""

    def prefix_for_question(self, question: str, tenant: str) -> WarmPrefix | None: ...

    def prefix_for_refs(self, refs: Sequence[ChunkRef], tenant: str) -> WarmPrefix | None: ...

    def refs_current(self, refs: Sequence[ChunkRef], tenant: str) -> bool: ...

    def chunk_tokens(self, refs: Sequence[ChunkRef], tenant: str) -> dict[str, list[int]]: ...

    def opening_ids(self) -> list[int]: ...

    def question_ids(self, question: str) -> list[int]: ...

    def search(self, question: str, tenant: str, k: int) -> list[dict]: ...

    def synthesis_prompt(
        self, refs: Sequence[ChunkRef], tenant: str, max_tokens: int
    ) -> SynthesisPrompt | None: ...

    def prompt_params(self) -> PromptParams: ...


class SimRag:
    """The simulated app's `RagPort` over a `RagSource` (the real store, or a query log).

    The simulator indexes each change once for every app it runs, so `index` hands back
    the chunks it was given (`handing`) instead of writing the shared store again.
    `doc_states` is the `docs` table as the KB-change agent leaves it at the start.
    """

    def __init__(self, source: RagSource,
                 doc_states: Callable[[str], dict[str, dict]] = lambda tenant: {}) -> None:
        self.source = source
        self._doc_states = doc_states
        self.handed: dict[str, str] | None = None  # chunk id -> content hash of the change
        self.versions: dict[tuple[str, str], int | None] = {}  # what `index` handed back

    def fork(self) -> SimRag:
        """Another app's port over the same source: its own record of what it indexed."""
        return SimRag(self.source, self._doc_states)

    @contextmanager
    def handing(self, chunks: dict[str, str] | None) -> Iterator[None]:
        """Within the block, `index` hands back `chunks` (None: the change was not applied)."""
        self.handed = chunks
        try:
            yield
        finally:
            self.handed = None

    def doc_states(self, tenant: str) -> dict[str, dict]:
        return self._doc_states(tenant)

    def index(self, change: KbChange) -> dict[str, str] | None:
        if self.handed is None:
            return None
        self.versions[(change.tenant, change.doc_id)] = change.version
        return dict(self.handed)

    def index_many(self, changes: Sequence[KbChange]) -> list[dict[str, str] | None]:
        return [self.index(c) for c in changes]

    def indexed_versions(self) -> dict[tuple[str, str], int | None]:
        return dict(self.versions)

    def prefix_for_question(self, question: str, tenant: str) -> WarmPrefix | None:
        return self.source.prefix_for_question(question, tenant)

    def prefix_for_refs(self, refs: Sequence[ChunkRef], tenant: str) -> WarmPrefix | None:
        return self.source.prefix_for_refs(refs, tenant)

    def refs_current(self, refs: Sequence[ChunkRef], tenant: str) -> bool:
        return self.source.refs_current(refs, tenant)

    def chunk_tokens(self, refs: Sequence[ChunkRef], tenant: str) -> dict[str, list[int]]:
        return self.source.chunk_tokens(refs, tenant)

    def opening_ids(self) -> list[int]:
        return self.source.opening_ids()

    def question_ids(self, question: str) -> list[int]:
        return self.source.question_ids(question)

    def search(self, question: str, tenant: str, k: int) -> list[dict]:
        return self.source.search(question, tenant, k)

    def synthesis_prompt(
        self, refs: Sequence[ChunkRef], tenant: str, max_tokens: int
    ) -> SynthesisPrompt | None:
        return self.source.synthesis_prompt(refs, tenant, max_tokens)

    def prompt_params(self) -> PromptParams:
        return self.source.prompt_params()


class SimOutbox:
    """Topics as one FIFO queue; commands reach the worker (`command`) as they are sent."""

    def __init__(self, queue: deque[Item], command: Callable[[WarmupCommand], Any]) -> None:
        self.queue = queue
        self._command = command

    async def op(self, op: PrefixOp) -> None:
        self.queue.append(op)

    async def link(self, link: DocLink) -> None:
        self.queue.append(link)

    async def command(self, cmd: WarmupCommand) -> None:
        self._command(cmd)

    async def ready(self, req: ReadyRewarm) -> None:
        self.queue.append(req)  # one process holds every partition
