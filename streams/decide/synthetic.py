"""Synthetic warmup's decisions as pure functions: which documents get questions, the
command that asks a worker for them, which of their prefixes fit the memory share, and
whether a real first ask hit one. `streams/handle/synthesize.py` does the I/O around them.

Seed 000's "batched synthetic requests": under 5% of memory, temperature 1.2-1.5. Here a
worker's own model samples a few likely questions about a document that is hot or has just
changed; the app retrieves each question's top-3 and warms those prefixes on that worker,
so the first real ask that retrieves the same chunks starts warm.
"""

from __future__ import annotations

import json
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from schemas import ChunkRef, WarmupCommand
from streams.decide.records import DocState


@dataclass(frozen=True)
class SynthesisPrompt:
    """The prompt asking a worker's model for questions about some chunks (synthetic
    warmup), and the refs of the chunks it was built from."""

    token_ids: list[int]
    chunk_refs: list[ChunkRef]
    primer_tokens: int = 0  # the last tokens open the answer (`WarmupCommand.primer_tokens`)


# Questions remembered per process to tell a first ask from a repeat (oldest forgotten).
FIRST_ASKS_REMEMBERED = 100_000


@dataclass(frozen=True)
class DocCandidate:
    """A document that may get synthetic questions: its key, refs and how hot it is."""

    tenant: str
    doc_id: str
    refs: tuple[ChunkRef, ...]
    heat: float = 0.0


@dataclass(frozen=True)
class Held:
    """A synthetic prefix warmed on a worker: its KV bytes and when its TTL ends."""

    nbytes: int
    expires_at: float


@dataclass
class FirstAsks:
    """The questions seen so far (bounded): `first` tells a question's first ask."""

    limit: int = FIRST_ASKS_REMEMBERED
    seen: OrderedDict[str, None] = field(default_factory=OrderedDict)

    def first(self, tenant: str, question: str) -> bool:
        key = f"{tenant}\x00{' '.join(question.casefold().split())}"
        if key in self.seen:
            self.seen.move_to_end(key)
            return False
        self.seen[key] = None
        if len(self.seen) > self.limit:
            self.seen.popitem(last=False)
        return True


@dataclass
class SyntheticState:
    """What one process remembers of synthetic warmup: when each document last got
    questions, the synthetic prefixes warmed per worker, and the questions seen."""

    last_at: dict[str, float] = field(default_factory=dict)  # doc key -> last request time
    held: dict[str, dict[str, Held]] = field(default_factory=dict)  # worker -> prefix -> Held
    asks: FirstAsks = field(default_factory=FirstAsks)


def changed_doc(prior: DocState | None, state: DocState) -> bool:
    """Whether a KB change gave the document new content worth asking about (a new or
    edited document; not a delete, not a re-send of the same chunks)."""
    if state.deleted or not state.chunks:
        return False
    return prior is None or prior.chunks != state.chunks


def doc_refs(state: DocState) -> tuple[ChunkRef, ...]:
    """The document's current chunks, in ordinal order."""
    return tuple(
        ChunkRef(chunk_id=c, content_hash=h) for c, h in sorted(state.chunks.items(), key=_ordinal)
    )


def hot_docs(ranked: Iterable[tuple[str, float, Sequence[ChunkRef]]], tenant_of: Mapping[str, str]
             ) -> list[DocCandidate]:
    """Documents of the hot prefixes, hottest first: a document's heat is the sum of the
    counts of the prefixes that hold one of its chunks; `ranked` is (prefix hash, count,
    refs), `tenant_of` the prefix's tenant."""
    heat: dict[tuple[str, str], float] = {}
    refs: dict[tuple[str, str], dict[str, ChunkRef]] = {}
    for prefix_hash, count, prefix_refs in ranked:
        tenant = tenant_of.get(prefix_hash, "default")
        for ref in prefix_refs:
            key = (tenant, ref.doc_id)
            heat[key] = heat.get(key, 0.0) + count
            refs.setdefault(key, {})[ref.chunk_id] = ref
    order = sorted(heat, key=lambda k: (-heat[k], k))
    return [
        DocCandidate(t, d, tuple(sorted(refs[(t, d)].values(), key=lambda r: _ordinal(
            (r.chunk_id, r.content_hash)))), heat[(t, d)])
        for t, d in order
    ]


def due(candidates: Sequence[DocCandidate], last_at: Mapping[str, float], now: float,
        cooldown_s: float, limit: int) -> list[DocCandidate]:
    """The first `limit` candidates not asked about within `cooldown_s` (the rate limit
    of the app's side; the worker keeps its own)."""
    out: list[DocCandidate] = []
    for c in candidates:
        if len(out) >= limit:
            break
        last = last_at.get(doc_key_of(c))
        if last is None or now - last >= cooldown_s:
            out.append(c)
    return out


def doc_key_of(c: DocCandidate) -> str:
    # JSON, not a separator: ids may hold any character, so no two documents share a key.
    return json.dumps([c.tenant, c.doc_id])


def sampling_seed(base: int | None, c: DocCandidate) -> int | None:
    """A seed per document and content (its refs), from `base`: a rerun with the same
    settings asks the model the same way; None leaves sampling random."""
    if base is None:
        return None
    content = "|".join(f"{r.chunk_id}={r.content_hash}" for r in c.refs)
    return (base * 1_000_003 + zlib.crc32(f"{c.tenant}/{content}".encode())) % (1 << 31)


@dataclass(frozen=True)
class SynthesisSpec:
    """How many questions, how long, how hot: the sampling a command asks for."""

    samples: int
    max_new_tokens: int
    temperature: float
    seed: int | None
    top_k: int | None = None


def synthesize_command(command_id: str, worker_id: str, tenant: str, prompt: SynthesisPrompt,
                       spec: SynthesisSpec, why: str) -> WarmupCommand:
    return WarmupCommand(
        command_id=command_id, op="synthesize", worker_id=worker_id, tenant=tenant,
        token_ids=list(prompt.token_ids), chunk_refs=list(prompt.chunk_refs),
        primer_tokens=prompt.primer_tokens, samples=spec.samples,
        max_new_tokens=spec.max_new_tokens, temperature=spec.temperature, seed=spec.seed,
        top_k=spec.top_k, reason=why,
    )


def sampling_fits(prompt_tokens: int, max_new_tokens: int, kv_bytes_per_token: int,
                  mem_total: int, share: float) -> bool:
    """Whether the worker will take the command: one sampled sequence's KV (prompt and new
    tokens) within `share` of its memory (the worker checks it again and refuses)."""
    return 0 < (prompt_tokens + max_new_tokens) * kv_bytes_per_token <= share * mem_total


def live_bytes(held: Mapping[str, Held], now: float) -> int:
    """KV bytes of a worker's synthetic prefixes whose TTL has not ended."""
    return sum(h.nbytes for h in held.values() if h.expires_at > now)


def choose_prefixes(
    candidates: Sequence[tuple[str, int]],
    held: Mapping[str, Held],
    known: Iterable[str],
    now: float,
    cap_bytes: int,
) -> list[tuple[str, int]]:
    """The (prefix hash, bytes) to warm for a worker's synthetic questions: distinct, not
    already tracked (`known`: warm or on their way), in order, while every live synthetic
    prefix of that worker stays within `cap_bytes` (its share of the worker's memory)."""
    skip = set(known)
    used = live_bytes(held, now)
    out: list[tuple[str, int]] = []
    for prefix_hash, nbytes in candidates:
        if prefix_hash in skip or nbytes <= 0:
            continue
        if used + nbytes > cap_bytes:
            continue  # a shorter prefix of a later question may still fit
        skip.add(prefix_hash)
        used += nbytes
        out.append((prefix_hash, nbytes))
    return out


def prune(held: dict[str, Held], now: float) -> None:
    """Forget the synthetic prefixes whose TTL has ended (their KV is no longer counted)."""
    for prefix_hash in [h for h, v in held.items() if v.expires_at <= now]:
        del held[prefix_hash]


def _ordinal(item: tuple[str, str]) -> tuple[str, int, str]:
    chunk_id = item[0]
    doc, _, n = chunk_id.rpartition("#")
    return (doc, int(n), chunk_id) if n.isdigit() else (chunk_id, 1 << 62, chunk_id)
