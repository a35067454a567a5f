"""Chunk KV (pure): where a chunk's KV is stored, which cached prompts hold it, and where
it goes in a prompt that blends it.

**Identity and placement.** A chunk's KV is computed right after the opening (the system
prompt, where the canonical prompt places a first chunk) and stored as the ordinary prefix
`opening + chunk`: the same block-chain hashes, tenant and model salt as any prompt that
opens with that chunk. So the exact prefix lookup reuses it losslessly for every question
whose first chunk it is (no blending needed), one copy serves both uses, and blocks shared
with cached prompts count once. Hashes are over token ids: a chunk whose text changed has
other tokens and other hashes and is never reused. The entry lists its chunk ref with the
chunk's start, so invalidating the ref frees its blocks (from the one holding the chunk's
first token on) with every prefix through them; the opening's own blocks stay.

**Donation.** Every prompt a worker stores (a request it cached, a warmup) holds the KV of
the chunks it was built from. The index lets another prompt blend that KV in
(`workers.engines.chunk_reuse`) without a second copy: an entry names the donor's block
chain and where the chunk stands in it, nothing else, so the bytes are the donor's blocks,
counted once in the cache's budget.

Keys are (tenant, model, hash of the chunk's token ids): the same text tokenized the same
way has the same KV up to its position and context, which blending repairs; a chunk whose
text changed has other tokens and another key. The index never frees anything: blocks leave
with the cache's eviction and invalidation, and a lookup checks the donor's blocks are still
held (`held` below), dropping entries whose blocks are gone. Invalidating a chunk ref drops
its entries too, so a changed chunk is never blended again even where its blocks survive.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from workers.kv.block_pool import ChunkKey


@dataclass(frozen=True)
class ChunkSpan:
    """Where one retrieved chunk stands in a prompt: tokens [start, end)."""

    ref: ChunkKey
    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise ValueError(f"chunk span must have 0 <= start < end, not {self.start}..{self.end}")


def chunk_prefix(opening: Sequence[int], chunk: Sequence[int]) -> list[int]:
    """The tokens a chunk's KV is stored under: the prefix of a prompt opening with it."""
    return [*opening, *chunk]


def held_chunk_tokens(n_opening: int, n_blocks: int, block_size: int) -> int:
    """Tokens of a chunk whose KV `n_blocks` leading blocks of `opening + chunk` hold
    (0 when they end inside the opening: only whole blocks are stored)."""
    return max(0, n_blocks * block_size - n_opening)


def check_spans(spans: Sequence[ChunkSpan], n_prompt: int) -> None:
    """Spans must be ordered, disjoint, inside the prompt, and leave the last token out (the
    question's last token gives the logits, so it is always computed)."""
    end = 0
    for span in spans:
        if span.start < end:
            raise ValueError(f"chunk spans overlap or are out of order at token {span.start}")
        end = span.end
    if end >= n_prompt:
        raise ValueError("chunk spans must end before the prompt's last token")


@dataclass(frozen=True)
class PiecePlan:
    """One held chunk to place: `offset` tokens of its KV are skipped (the exact prefix
    covers them), the rest stands at prompt position `start`; `count` tokens are used."""

    span: ChunkSpan
    offset: int
    start: int
    count: int


def plan_pieces(
    spans: Sequence[ChunkSpan], n_exact: int, held: dict[ChunkKey, int]
) -> list[PiecePlan]:
    """The held chunks' parts after the exact prefix (`held`: tokens of KV held per ref).

    A chunk's KV covers its first `held[ref]` tokens (whole blocks); tokens it does not
    cover, and chunks not held, are computed like the question.
    """
    plans = []
    for span in spans:
        have = min(held.get(span.ref, 0), span.end - span.start)
        start = max(span.start, n_exact)
        offset = start - span.start
        if have > offset:
            plans.append(PiecePlan(span, offset, start, have - offset))
    return plans


# -- donation ------------------------------------------------------------------------------

# (tenant, model, content hash of the chunk's token ids)
DonorKey = tuple[str, str, str]

# Donors kept per chunk content: the newest few, so an eviction of one rarely leaves none.
DEFAULT_PER_CHUNK = 3
# Chunk contents indexed at most: records whose blocks left are dropped only when looked up,
# so a long-lived worker forgets the contents donated longest ago past this many.
DEFAULT_MAX_CHUNKS = 1 << 16


def chunk_content_hash(token_ids: Sequence[int]) -> str:
    """A chunk's identity for donation: a hash of its token ids (not of its text, so two
    tokenizations never share KV)."""
    data = struct.pack(f"<{len(token_ids)}I", *token_ids)
    return hashlib.blake2b(data, digest_size=16).hexdigest()


@dataclass(frozen=True)
class Donor:
    """A chunk's KV inside a stored prompt: the prompt's leading block hashes through the
    last block holding the chunk, the chunk's first token there (`start`, where it was
    computed) and how many of its tokens those whole blocks hold (`held`)."""

    ref: ChunkKey
    chain: tuple[str, ...]
    start: int
    held: int

    def __post_init__(self) -> None:
        if self.held < 1 or self.start < 0 or not self.chain:
            raise ValueError("a donor holds at least one chunk token in at least one block")


def donors_of(spans: Sequence[ChunkSpan], chain: Sequence[str], block_size: int
              ) -> list[tuple[ChunkSpan, Donor]]:
    """The chunks a stored prompt donates: each span with at least one token inside the
    prompt's whole blocks (`chain`: their hashes), cut to what those blocks hold."""
    stored = len(chain) * block_size
    found = []
    for span in spans:
        held = min(span.end, stored) - span.start
        if held < 1:
            continue
        last = -(-(span.start + held) // block_size)  # blocks through the chunk's last held token
        found.append((span, Donor(span.ref, tuple(chain[:last]), span.start, held)))
    return found


class DonorIndex:
    """Chunk content -> the stored prompts holding its KV (newest first), per tenant and model.

    `held(chain)` (given at lookup) says how many leading blocks of a chain the cache still
    holds with their KV; a donor is used for the tokens those blocks hold and dropped when
    they hold none of its chunk.
    """

    def __init__(self, block_size: int, *, per_chunk: int = DEFAULT_PER_CHUNK,
                 max_chunks: int = DEFAULT_MAX_CHUNKS) -> None:
        if block_size < 1 or per_chunk < 1 or max_chunks < 1:
            raise ValueError("block_size, per_chunk and max_chunks must be >= 1")
        self.block_size = block_size
        self.per_chunk = per_chunk
        self.max_chunks = max_chunks
        self._by_key: dict[DonorKey, list[Donor]] = {}
        self._by_ref: dict[ChunkKey, set[DonorKey]] = {}

    def __len__(self) -> int:
        return sum(len(donors) for donors in self._by_key.values())

    def donate(self, tenant: str, model: str, prompt: Sequence[int],
               spans: Sequence[ChunkSpan], chain: Sequence[str]) -> int:
        """Record the chunks of a prompt stored as `chain` (its whole blocks' hashes, at
        least the first ones); returns how many chunks it donated."""
        pairs = donors_of(spans, chain, self.block_size)
        for span, donor in pairs:
            key = (tenant, model, chunk_content_hash(prompt[span.start:span.end]))
            known = self._by_key.get(key, [])
            # One record per prompt: its cached head donated first (a hit), the whole prompt
            # once stored, replaces it; a head of a prompt already recorded adds nothing.
            if any(_extends(d, donor) for d in known):
                continue
            kept = [d for d in known if not _extends(donor, d)]
            self._by_key.pop(key, None)  # re-inserted last: the newest donation
            self._by_key[key] = [donor, *kept][: self.per_chunk]
            self._by_ref.setdefault(donor.ref, set()).add(key)
        while len(self._by_key) > self.max_chunks:
            self._forget(next(iter(self._by_key)))
        return len(pairs)

    def find(self, tenant: str, model: str, chunk: Sequence[int],
             held: Callable[[tuple[str, ...]], int]) -> Donor | None:
        """The donor holding most of `chunk`'s tokens now (stale ones are dropped), cut to
        the blocks still held; None when no stored prompt holds any of it."""
        key = (tenant, model, chunk_content_hash(chunk))
        best: Donor | None = None
        live = []
        for donor in self._by_key.get(key, []):
            usable = self._usable(donor, held(donor.chain))
            if usable is None:
                continue
            live.append(donor)
            if best is None or usable.held > best.held:
                best = usable
        self._set(key, live)
        return best

    def invalidate(self, refs: Iterable[ChunkKey], *, tenant: str | None = None) -> int:
        """Drop every donor of the chunk refs (a changed chunk), of `tenant`'s prompts only
        when given; returns how many."""
        dropped = 0
        for ref in refs:
            keys = self._by_ref.get(ref, set())
            for key in [k for k in keys if tenant is None or k[0] == tenant]:
                donors = self._by_key.get(key, [])
                live = [d for d in donors if d.ref != ref]
                dropped += len(donors) - len(live)
                self._set(key, live)
                keys.discard(key)
            if not keys:
                self._by_ref.pop(ref, None)
        return dropped

    def clear(self) -> None:
        self._by_key.clear()
        self._by_ref.clear()

    def _usable(self, donor: Donor, n_blocks: int) -> Donor | None:
        """The donor cut to its first `n_blocks` blocks; None when they hold none of it."""
        if n_blocks >= len(donor.chain):
            return donor
        held = n_blocks * self.block_size - donor.start
        if held < 1:
            return None
        return replace(donor, chain=donor.chain[:n_blocks], held=held)

    def _set(self, key: DonorKey, donors: list[Donor]) -> None:
        if donors:
            self._by_key[key] = donors
            return
        self._forget(key)

    def _forget(self, key: DonorKey) -> None:
        for donor in self._by_key.pop(key, []):
            keys = self._by_ref.get(donor.ref)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_ref[donor.ref]


def _extends(a: Donor, b: Donor) -> bool:
    """Whether `a` is `b`'s chunk in the same prompt, holding at least as much of it."""
    return a.start == b.start and a.held >= b.held and a.chain[: len(b.chain)] == b.chain
