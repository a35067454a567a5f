"""Bounded heavy-hitter counting of prompt prefixes over hopping windows (pure).

The windows live in rows of a mapping (the app's changelog table `hot_windows`, a dict
elsewhere), one row per tenant and step, so a restarted or new owner of a tenant's
partition resumes its windows, and N instances together count every tenant.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Iterator, MutableMapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from schemas import ChunkRef
from streams.decide.records import PrefixOp
from streams.decide.rent import RentLedger

SEP = "\x1f"  # between the tenant and the step (or HOT_ROW) in a row key
HOT_ROW = "hot"


def row_key(tenant: str, slot: int | str) -> str:
    return f"{tenant}{SEP}{slot}"


def tenant_of(key: str) -> str:
    return key.rpartition(SEP)[0]


def slot_of(key: str) -> int | None:
    """The step a window row counts (None: the hot-set row)."""
    tail = key.rpartition(SEP)[2]
    return int(tail) if tail.lstrip("-").isdigit() else None


@dataclass
class SpaceSaving:
    """Metwally et al.'s Space-Saving: at most `capacity` counters, error <= total/capacity.

    When full, a new key replaces the smallest counter and inherits its count, so a key
    that is truly frequent is never lost; a replaced key's payload is dropped with it.
    """

    capacity: int
    counts: dict[Hashable, float] = field(default_factory=dict)
    payloads: dict[Hashable, Any] = field(default_factory=dict)

    def add(self, key: Hashable, weight: float = 1.0, payload: Any = None) -> None:
        if key in self.counts:
            self.counts[key] += weight
        elif len(self.counts) < self.capacity:
            self.counts[key] = weight
        else:
            victim = min(self.counts, key=self.counts.__getitem__)
            self.counts[key] = self.counts.pop(victim) + weight
            self.payloads.pop(victim, None)
        if payload is not None:
            self.payloads[key] = payload


@dataclass(frozen=True)
class HotPayload:
    """What the newest query of a prefix said about it: enough to rebuild and warm it."""

    tenant: str
    question: str
    chunk_refs: tuple[Any, ...]
    prefix_tokens: int

    @cached_property
    def row(self) -> dict[str, Any]:
        """The payload as a table row (encoded once: a hot prefix's row is written often)."""
        refs = [ChunkRef.model_validate(r).model_dump(mode="json") for r in self.chunk_refs]
        return {"question": self.question, "chunk_refs": refs, "tokens": self.prefix_tokens}

    @classmethod
    def from_row(cls, tenant: str, row: dict[str, Any]) -> HotPayload:
        refs = tuple(ChunkRef.model_validate(r) for r in row["chunk_refs"])
        return cls(tenant, row["question"], refs, int(row["tokens"]))


@dataclass
class StepSketch:
    """One tenant's counts in one step: prefix hashes (with payloads) and questions."""

    prefixes: SpaceSaving
    questions: SpaceSaving

    @classmethod
    def empty(cls, capacity: int) -> StepSketch:
        return cls(SpaceSaving(capacity), SpaceSaving(capacity))

    def to_row(self) -> dict[str, Any]:
        pay = self.prefixes.payloads
        return {
            "p": [[k, c, pay[k].row if k in pay else None]
                  for k, c in self.prefixes.counts.items()],
            "q": [[k, c] for k, c in self.questions.counts.items()],
        }

    @classmethod
    def from_row(cls, tenant: str, row: dict[str, Any], capacity: int) -> StepSketch:
        sketch = cls.empty(capacity)
        for key, count, payload in row.get("p", []):
            sketch.prefixes.counts[key] = float(count)
            if payload is not None:
                sketch.prefixes.payloads[key] = HotPayload.from_row(tenant, payload)
        sketch.questions.counts.update({k: float(c) for k, c in row.get("q", [])})
        return sketch


def window_slots(now: float, window_s: float, step_s: float) -> range:
    """The steps the hopping window ending at `now` sums."""
    current = int(now // step_s)
    return range(current - max(1, math.ceil(window_s / step_s)) + 1, current + 1)


def expired_rows(keys: Iterable[str], now: float, window_s: float, step_s: float) -> list[str]:
    """Window rows whose step has left the window ending at `now` (the hot-set rows stay)."""
    first = window_slots(now, window_s, step_s).start
    return [k for k in keys if (slot := slot_of(k)) is not None and slot < first]


def rank(sketches: Iterable[SpaceSaving], k: int | None = None) -> list[tuple[Any, float, Any]]:
    """Keys of the summed sketches, hottest first, with their count and newest payload."""
    counts: dict[Hashable, float] = {}
    payloads: dict[Hashable, Any] = {}
    for sketch in sketches:  # oldest step first, so the newest payload wins
        for key, count in sketch.counts.items():
            counts[key] = counts.get(key, 0.0) + count
        payloads.update(sketch.payloads)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0])))
    return [(key, count, payloads.get(key)) for key, count in ranked[:k]]


class HotSet(MutableMapping[str, PrefixOp]):
    """The prefixes kept hot (key -> its warm op), stored as one row per tenant.

    Decoded rows are kept while the mapping still holds the very object this set wrote or
    last read: a row recovered from the changelog (a moved partition) is a new object."""

    def __init__(self, rows: MutableMapping[str, Any], owns: Callable[[str], bool]) -> None:
        self.rows, self.owns = rows, owns
        self._decoded: dict[str, tuple[Any, dict[str, PrefixOp]]] = {}

    def _row(self, key: str) -> dict[str, PrefixOp]:
        raw = self.rows.get(key)
        cached = self._decoded.get(key)
        if cached is not None and cached[0] is raw:
            return cached[1]
        ops = {h: PrefixOp.model_validate(v) for h, v in (raw or {}).items()}
        self._decoded[key] = (raw, ops)
        return ops

    def _keys(self) -> list[str]:
        return [k for k in list(self.rows.keys())
                if slot_of(k) is None and tenant_of(k) and self.owns(tenant_of(k))]

    def _all(self) -> dict[str, PrefixOp]:
        return {h: op for key in self._keys() for h, op in self._row(key).items()}

    def _write(self, key: str, ops: dict[str, PrefixOp], raw: dict[str, Any]) -> None:
        if not ops:
            self.rows.pop(key, None)
            self._decoded.pop(key, None)
            return
        self.rows[key] = raw
        self._decoded[key] = (raw, ops)

    def __getitem__(self, prefix_hash: str) -> PrefixOp:
        return self._all()[prefix_hash]

    def __setitem__(self, prefix_hash: str, op: PrefixOp) -> None:
        key = row_key(op.tenant, HOT_ROW)
        ops = {**self._row(key), prefix_hash: op}
        # Only the new op is encoded: the others keep their encoded form.
        raw = {**(self.rows.get(key) or {}), prefix_hash: op.model_dump(mode="json")}
        self._write(key, ops, raw)

    def __delitem__(self, prefix_hash: str) -> None:
        for key in self._keys():
            ops = self._row(key)
            if prefix_hash in ops:
                raw = {h: v for h, v in (self.rows.get(key) or {}).items() if h != prefix_hash}
                self._write(key, {h: op for h, op in ops.items() if h != prefix_hash}, raw)
                return
        raise KeyError(prefix_hash)

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


def _owns_all(tenant: str) -> bool:
    return True


@dataclass
class HotTracker:
    """Prefix and question frequencies of `rag.queries`, and the set currently kept hot.

    Observations wait in memory until `flush` writes their rows (the app flushes once per
    batch of queries, so a row is written once per batch, not once per query); reads
    flush first. `owns(tenant)`: whether this process plans that tenant's hot set (the
    app: it owns the tenant's partition), so standby rows are never planned twice.
    """

    window_s: float = 600.0
    step_s: float = 60.0
    capacity: int = 256
    rows: MutableMapping[str, Any] = field(default_factory=dict)
    owns: Callable[[str], bool] = _owns_all
    hot: HotSet = field(init=False)
    # Which prefixes' re-asks came from beyond request caching's reach (`streams.decide.rent`).
    rent: RentLedger = field(default_factory=RentLedger)
    _pending: dict[str, StepSketch] = field(default_factory=dict, init=False)
    # Decoded rows, kept while the mapping holds the very object decoded or written (a
    # row recovered from the changelog, after a partition moved, is a new object).
    _decoded: dict[str, tuple[Any, StepSketch]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.hot = HotSet(self.rows, self.owns)

    def observe(self, prefix_hash: str | None, payload: HotPayload, now: float) -> None:
        key = row_key(payload.tenant, int(now // self.step_s))
        sketch = self._pending.get(key)
        if sketch is None:
            sketch = self._pending[key] = self._load(key)
        sketch.questions.add(payload.question)
        if prefix_hash:
            sketch.prefixes.add(prefix_hash, payload=payload)
            self.rent.ask(prefix_hash, payload.prefix_tokens, now)

    def flush(self, now: float) -> int:
        """Write the rows observed since the last flush; drop the rows past the window.
        Returns how many rows were written."""
        written = 0
        for key in list(self._pending):  # each kept until written: a failed write is retried
            sketch = self._pending[key]
            raw = self.rows[key] = sketch.to_row()
            self._decoded[key] = (raw, sketch)
            del self._pending[key]
            written += 1
        owned = [k for k in list(self.rows.keys()) if self.owns(tenant_of(k))]
        for key in expired_rows(owned, now, self.window_s, self.step_s):
            self.rows.pop(key, None)
        for key in [k for k in self._decoded if k not in self.rows]:
            del self._decoded[key]
        return written

    def ranked(self, now: float) -> list[tuple[str, float, HotPayload]]:
        sketches = (s.prefixes for per in self._window_by_tenant(now).values() for s in per)
        return [(str(k), c, p) for k, c, p in rank(sketches) if p is not None]

    def top_questions(self, now: float, k: int) -> list[tuple[tuple[str, str], float]]:
        """The most asked (tenant, question) pairs of the window ending at `now`."""
        per_tenant = self._window_by_tenant(now)
        ranked = [((t, q), c) for t, sk in per_tenant.items()
                  for q, c, _ in rank(s.questions for s in sk)]
        return sorted(ranked, key=lambda kv: (-kv[1], kv[0]))[:k]

    def forget(self, prefix_hash: str) -> None:
        """Drop hot entries that would warm `prefix_hash` (it was invalidated)."""
        for key in [k for k, op in self.hot.items() if op.prefix_hash == prefix_hash]:
            self.hot.pop(key, None)

    def _load(self, key: str) -> StepSketch:
        raw = self.rows.get(key)
        if raw is None:
            return StepSketch.empty(self.capacity)
        cached = self._decoded.get(key)
        if cached is not None and cached[0] is raw:
            return cached[1]
        sketch = StepSketch.from_row(tenant_of(key), raw, self.capacity)
        self._decoded[key] = (raw, sketch)
        return sketch

    def _window_by_tenant(self, now: float) -> dict[str, list[StepSketch]]:
        """Per owned tenant, its sketches of the window ending at `now`, oldest first."""
        if self._pending:
            self.flush(now)
        slots = window_slots(now, self.window_s, self.step_s)
        found: dict[str, list[tuple[int, StepSketch]]] = {}
        for key in list(self.rows.keys()):
            slot, tenant = slot_of(key), tenant_of(key)
            if slot is not None and slot in slots and self.owns(tenant):
                found.setdefault(tenant, []).append((slot, self._load(key)))
        return {t: [s for _, s in sorted(rows, key=lambda r: r[0])] for t, rows in found.items()}
