"""Shared fakes of the unit tests: a stand-in tokenizer and the streams handlers' port and deps."""

from __future__ import annotations

import re
import zlib
from collections.abc import AsyncIterator, Sequence

import pytest
from aiohttp.test_utils import TestClient

from schemas import ChunkRef, KbChange, QueryEvent, WarmupCommand
from streams.decide.hot import HotTracker
from streams.decide.records import DocLink, DocState, PrefixOp, WorkerState, doc_key
from streams.handle import handlers
from streams.handle.ports import WarmPrefix
from streams.settings import StreamsSettings
from streams.sim import dict_tables, run_sync
from tests.unit.worker_fakes import GatedLifecycle, serve, wait_ready

# GPT-2 style pre-tokenization: a word keeps its leading space, whitespace runs stay apart.
_PIECES = re.compile(r"'(?:[sdmt]|ll|ve|re)| ?\w+| ?[^\s\w]+|\s+(?!\S)|\s+")


class WordTokenizer:
    """Splits like GPT-2's pre-tokenizer and maps each piece to a stable id (no vocabulary).

    Joined strings tokenize differently from their parts (``"a\\n\\n" + "b"`` vs
    ``"a\\n\\nb"``), as with a real BPE tokenizer, which is what boundary tests need.
    """

    vocab_size = 1 << 20

    def __init__(self) -> None:
        self._pieces: dict[int, str] = {}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = []
        for piece in _PIECES.findall(text):
            token = zlib.crc32(piece.encode("utf-8")) % self.vocab_size
            # Two pieces may share a crc: the later one takes the next free id, so that
            # decode gives the text back (a property test found one such pair).
            while self._pieces.setdefault(token, piece) != piece:
                token = (token + 1) % self.vocab_size
            ids.append(token)
        return ids

    def decode(self, ids: list[int]) -> str:
        return "".join(self._pieces[i] for i in ids)


# -- the streams handlers' fakes: a RAG port, an outbox, and the deps over dict tables ------

P1 = "a" * 64
REFS = [ChunkRef(chunk_id="d.md#0", content_hash="1" * 64)]


class Port:
    """A RAG port over a fixed set of current chunks, recording what it was asked."""

    def __init__(self, current: dict[tuple[str, str], str]) -> None:
        self.current = current  # (tenant, chunk id) -> content hash
        self.calls: list[str] = []
        self.tails: dict[str, list[int]] = {}  # question -> its tokens after the prefix

    def index(self, change):
        raise AssertionError("not used here")

    def prefix_for_question(self, question: str, tenant: str) -> WarmPrefix | None:
        self.calls.append("prefix_for_question")
        return None

    def prefix_for_refs(self, refs: Sequence[ChunkRef], tenant: str) -> WarmPrefix | None:
        self.calls.append("prefix_for_refs")
        if not self.refs_current(refs, tenant):
            return None
        return WarmPrefix(prefix_hash=P1, token_ids=[7] * 32, chunk_refs=list(refs))

    def refs_current(self, refs: Sequence[ChunkRef], tenant: str) -> bool:
        return all(self.current.get((tenant, r.chunk_id)) == r.content_hash for r in refs)

    def question_ids(self, question: str) -> list[int]:
        return self.tails.get(question, [])

    def search(self, question, tenant, k):
        return []


class Outbox:
    def __init__(self) -> None:
        self.ops: list[PrefixOp] = []
        self.links: list[DocLink] = []
        self.commands: list[WarmupCommand] = []
        self.readies: list = []
        self.pipeline: handlers.HandlerDeps | None = None

    async def op(self, op: PrefixOp) -> None:
        self.ops.append(op)

    async def link(self, link: DocLink) -> None:
        self.links.append(link)

    async def command(self, cmd: WarmupCommand) -> None:
        self.commands.append(cmd)

    async def ready(self, req) -> None:
        """One process holding every partition: the re-warm runs here at once."""
        self.readies.append(req)
        await handlers.on_ready_rewarm(self.pipeline, req)


def pipeline(port: Port, now: float = 100.0, **settings) -> tuple[handlers.HandlerDeps, Outbox]:
    out = Outbox()
    tables = dict_tables()
    worker = WorkerState(worker_id="w1", ready=True, mem_total=1000, last_seen=now)
    tables.worker_states["w1"] = worker
    p = handlers.HandlerDeps(
        tables=tables,
        out=out,
        rag=port,
        settings=StreamsSettings(**settings),
        tracker=HotTracker(600.0, 60.0),
        clock=lambda: now,
    )
    out.pipeline = p
    return p, out


def query(question: str = "why?", tenant: str = "default") -> QueryEvent:
    return QueryEvent(
        tenant=tenant,
        question=question,
        chunk_refs=REFS,
        prefix_hash=P1,
        prefix_tokens=32,
        prompt_tokens=40,
    )


def ask(p: handlers.HandlerDeps, prefix_hash: str, question: str, at: float,
          refs: Sequence[ChunkRef] = REFS) -> None:
    """One answered query of `prefix_hash` at `at`, as the app handles it."""
    event = QueryEvent(tenant="default", question=question, chunk_refs=list(refs),
                       prefix_hash=prefix_hash, prefix_tokens=32, prompt_tokens=40)
    p.clock = lambda: at
    run_sync(handlers.on_query(p, event))


def edited(p: handlers.HandlerDeps, deps: Sequence[str], at: float) -> None:
    """d.md changes from version 1 to 2 (chunk d.md#0: hash 1 -> 2) at `at`."""
    key = doc_key("default", "d.md")
    p.tables.doc_states[key] = DocState(version=1, chunks={"d.md#0": "1" * 64})
    p.tables.doc_prefixes[key] = {h: [r.model_dump(mode="json") for r in REFS] for h in deps}
    p.clock = lambda: at
    change = KbChange(op="upsert", doc_id="d.md", version=2, text="new")
    run_sync(handlers.apply_indexed(p, change, {"d.md#0": "2" * 64}))


def answer(**kw):
    """A client `Answer` with plausible figures; keywords override them."""
    from ragwarm.client.rag import Answer

    base = dict(question="q", tenant="acme", qid="abc", text="Hi there", worker_id="w1",
                ttft_ms=12.5, worker_ttft_ms=10.0, e2e_ttft_ms=30.0, total_ms=50.0,
                retrieve_ms=5.0, route_ms=1.0, prompt_tokens=700, cached_tokens=672,
                completion_tokens=4, prefix_tokens=680, prefix_hash="h", matched_blocks=42,
                chunk_refs=(), doc_ids=("docs/faq.md",), finish_reason="length")
    return Answer(**{**base, **kw})


@pytest.fixture
async def booted() -> AsyncIterator[tuple[TestClient, GatedLifecycle]]:
    """A worker service over the toy engine (`worker_fakes`), booted and ready."""
    lifecycle = GatedLifecycle()
    lifecycle.gate.set()
    client = await serve(lifecycle)
    await wait_ready(client)
    yield client, lifecycle
    await client.close()


def warm(tenant: str = "default") -> PrefixOp:
    """A warm op for P1 over REFS, as a query's hot-set tracking would send it."""
    return PrefixOp(op="warm", prefix_hash=P1, tenant=tenant, chunk_refs=REFS,
                    token_ids=[7] * 32, question="why?")


class IndexPort(Port):
    """A port whose index applies changes (a streams instance with its own index)."""

    def __init__(self, indexed):
        super().__init__({})
        self.indexed = indexed
        self.applied: list[KbChange] = []

    def indexed_versions(self):
        return dict(self.indexed)

    def index(self, change):
        self.applied.append(change)
        self.indexed[(change.tenant, change.doc_id)] = change.version
        return {}
