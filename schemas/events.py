"""One pydantic model per event type; `schema_name` + `schema_version` tag every record."""

from __future__ import annotations

import base64
import binascii
import math
import struct
from datetime import UTC, datetime
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

# A document or question larger than this is refused rather than truncated silently.
MAX_TEXT_BYTES = 1_000_000
MAX_TOKENS = 32_768
# Versions are counters or timestamps; int64 keeps them exact in every language and Kafka.
MAX_VERSION = 2**63 - 1
# A cached prefix lives at most 30 days unless refreshed; Infinity or NaN is never a TTL.
MAX_TTL_S = 30 * 24 * 3600.0
# Seed router config "memory_threshold 0.7, stop warming above it": the streams app sends no
# new warmup to a worker above this share and the worker accepts none, so one figure for both.
MEMORY_THRESHOLD = 0.7

Id = Annotated[str, StringConstraints(min_length=1, max_length=1024)]
# A tenant id never holds U+001F: `schemas.topics.kb_key` separates tenant and doc id with
# it, and the table keys of every document (`streams.decide.records.doc_key`) are that key, so one
# in a tenant id made two tenants' documents share a key (their state, their partition).
TenantId = Annotated[
    str, StringConstraints(min_length=1, max_length=1024, pattern=r"^[^\x1f]+$")
]
Hash = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16,128}$")]


def _now() -> datetime:
    return datetime.now(UTC)


class Event(BaseModel):
    """Base of every record on a ragwarm topic."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    SCHEMA: ClassVar[str] = "event"
    VERSION: ClassVar[int] = 1

    schema_name: str
    schema_version: int = 1
    timestamp: datetime = Field(default_factory=_now)


class ChunkRef(BaseModel):
    """A chunk a cached prefix was built from: `doc_id#ordinal` and sha256 of its text."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    chunk_id: Id
    content_hash: Hash

    @property
    def doc_id(self) -> str:
        return self.chunk_id.rsplit("#", 1)[0]


class KbChange(Event):
    """An upsert or delete of one knowledge-base document, with its per-document version."""

    SCHEMA: ClassVar[str] = "kb_change"

    schema_name: Literal["kb_change"] = "kb_change"
    op: Literal["upsert", "delete"]
    doc_id: Id
    version: int = Field(ge=0, le=MAX_VERSION)
    tenant: TenantId = "default"
    text: str | None = None
    metadata: dict[str, str | int | float | bool | None] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _text_matches_op(self) -> KbChange:
        if self.op == "upsert" and self.text is None:
            raise ValueError("text: required for op 'upsert'")
        if self.op == "delete" and self.text is not None:
            raise ValueError("text: must be null for op 'delete'")
        if self.text is not None and len(self.text.encode("utf-8")) > MAX_TEXT_BYTES:
            raise ValueError(f"text: larger than {MAX_TEXT_BYTES} bytes")
        return self

    def is_stale(self, current_version: int | None) -> bool:
        """Whether this change is older than the document's current version.

        An older change never overwrites a newer one, so replays are safe; an equal version
        re-applies (idempotent). None: nothing is stored yet (or a first write never finished).
        """
        return current_version is not None and self.version < current_version


class QueryEvent(Event):
    """One answered RAG query: what was retrieved, which prefix it used, how fast it was."""

    SCHEMA: ClassVar[str] = "query"

    schema_name: Literal["query"] = "query"
    tenant: TenantId = "default"
    question: Annotated[str, StringConstraints(min_length=1, max_length=8192)]
    qid: Id | None = None
    chunk_refs: list[ChunkRef] = Field(default_factory=list, max_length=64)
    prefix_hash: Hash | None = None
    block_hashes: list[Hash] = Field(default_factory=list, max_length=4096)
    prefix_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS)
    prompt_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS)
    cached_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS)
    ttft_ms: float | None = Field(default=None, ge=0)
    worker_id: Id | None = None


class WarmupCommandV1(Event):
    """Version 1 of `WarmupCommand` (no expiry); still read, upgraded on decode."""

    model_config = ConfigDict(title="WarmupCommand")
    SCHEMA: ClassVar[str] = "warmup_command"

    schema_name: Literal["warmup_command"] = "warmup_command"
    command_id: Id
    op: Literal["prefill", "invalidate", "extend_ttl", "release"]
    worker_id: Id | None = None
    tenant: TenantId = "default"
    prefix_hash: Hash | None = None
    token_ids: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list, max_length=MAX_TOKENS
    )
    chunk_refs: list[ChunkRef] = Field(default_factory=list, max_length=256)
    ttl_s: float | None = Field(default=None, gt=0, le=MAX_TTL_S, allow_inf_nan=False)
    pin: bool = False
    reason: Annotated[str, StringConstraints(max_length=512)] = ""

    @model_validator(mode="after")
    def _fields_match_op(self) -> WarmupCommandV1:
        if self.op == "prefill" and not self.token_ids:
            raise ValueError("token_ids: required for op 'prefill'")
        if self.op == "invalidate" and not (self.chunk_refs or self.prefix_hash):
            raise ValueError("chunk_refs: 'invalidate' needs chunk_refs or prefix_hash")
        if self.op in ("extend_ttl", "release") and not self.prefix_hash:
            raise ValueError(f"prefix_hash: required for op '{self.op}'")
        return self


# A worker event's kinds per version, spelled once: v2 adds to v1's, never restates them.
WorkerKindV1 = Literal[
    "stored",
    "evicted",
    "invalidated",
    "ttl_extended",
    "cleared",
    "ready",
    "heartbeat",
    "stopped",
    "released",
]
WorkerKind = Literal[WorkerKindV1, "refused", "expired"]


class WorkerEventV1(Event):
    """Version 1 of `WorkerEvent` (no boot epoch); still read, upgraded on decode."""

    model_config = ConfigDict(title="WorkerEvent")
    SCHEMA: ClassVar[str] = "worker_event"

    schema_name: Literal["worker_event"] = "worker_event"
    worker_id: Id
    kind: WorkerKindV1
    url: Annotated[str, StringConstraints(max_length=2048)] | None = None
    tenant: TenantId | None = None
    prefix_hash: Hash | None = None
    prefix_tokens: int = Field(default=0, ge=0)
    chunk_refs: list[ChunkRef] = Field(default_factory=list, max_length=256)
    bytes: int = Field(default=0, ge=0)
    command_id: Id | None = None
    mem_used_bytes: int = Field(default=0, ge=0)
    mem_total_bytes: int = Field(default=0, ge=0)
    # The part of mem_used that eviction cannot reclaim (pinned warm prefixes): what the
    # warmup threshold is measured against, since evictable request-cache KV makes room.
    pinned_bytes: int = Field(default=0, ge=0)
    entries: int = Field(default=0, ge=0)
    warm_prefixes: list[Hash] = Field(default_factory=list, max_length=65_536)


class DeadLetterV1(Event):
    """Version 1 of `DeadLetter` (whole payload only); still read, upgraded on decode."""

    model_config = ConfigDict(title="DeadLetter")
    SCHEMA: ClassVar[str] = "dead_letter"

    schema_name: Literal["dead_letter"] = "dead_letter"
    source_topic: Id
    partition: int | None = None
    offset: int | None = None
    key_b64: str | None = None
    value_b64: str
    reason: Annotated[str, StringConstraints(max_length=4096)]
    error_field: str | None = None


class WarmupCommandV2(WarmupCommandV1):
    """Version 2 of `WarmupCommand` (no chunk prefill); still read, upgraded on decode.

    v2: `expires_at`: a worker skips a command read after it (a restarted worker resuming
    its offsets must not replay a day of old prefills) and reports it as `expired`.
    """

    VERSION: ClassVar[int] = 2

    schema_version: Literal[2] = 2
    expires_at: datetime | None = None

    def expired(self, now: datetime) -> bool:
        return self.expires_at is not None and now >= self.expires_at


class WarmupCommandV3(WarmupCommandV2):
    """Version 3 of `WarmupCommand` (no synthetic questions); still read, upgraded on decode.

    v3: op `prefill_chunk`: compute one chunk's KV on its own, right after `opening_ids`
    (the system prompt, where the canonical prompt places a first chunk), and hold it as the
    prefix `opening_ids + token_ids` (a prompt opening with the chunk reuses it exactly; a
    worker with chunk reuse on also blends it elsewhere); `token_ids` are the chunk's tokens
    and `chunk_refs` names exactly that chunk (invalidating it frees the chunk's KV).
    """

    VERSION: ClassVar[int] = 3

    schema_version: Literal[3] = 3  # type: ignore[assignment]
    # v3 widens v2's ops (pydantic validates the override; mypy sees a narrowing base).
    op: Literal[  # type: ignore[assignment]
        "prefill", "invalidate", "extend_ttl", "release", "prefill_chunk"
    ]
    opening_ids: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list, max_length=MAX_TOKENS
    )

    @model_validator(mode="after")
    def _chunk_fields(self) -> WarmupCommandV3:
        if self.op != "prefill_chunk":
            return self
        if not self.token_ids:
            raise ValueError("token_ids: required for op 'prefill_chunk' (the chunk's tokens)")
        if not self.opening_ids:
            raise ValueError("opening_ids: required for op 'prefill_chunk' (the system prompt)")
        if len(self.chunk_refs) != 1:
            raise ValueError("chunk_refs: op 'prefill_chunk' names exactly one chunk")
        return self


# Seed 000: synthetic warmup samples at temperature 1.2-1.5; a command may ask for any
# sampling temperature up to this (0 would be greedy: every sample the same question).
MAX_SYNTH_TEMPERATURE = 2.0
MAX_SYNTH_SAMPLES = 8
MAX_SYNTH_TOKENS = 128
MAX_QUESTION_CHARS = 1024
MAX_TOP_K = 1000
MAX_PRIMER_TOKENS = 64


class WarmupCommandV4(WarmupCommandV3):
    """Version 4 of `WarmupCommand` (no chunk spans); still read, upgraded on decode.

    v4: op `synthesize`: sample `samples` likely questions about a document with the
    worker's own model (`token_ids`: the question prompt the app built from the chunks in
    `chunk_refs`), at `temperature` among the `top_k` likeliest tokens (all when None), at
    most `max_new_tokens` each, seeded by `seed` when given. The prompt's last
    `primer_tokens` tokens open the answer (a cue such as "How do I"): each question is
    their text and what was sampled after them. The worker answers with a `synthesized`
    event and stores nothing.
    """

    VERSION: ClassVar[int] = 4

    schema_version: Literal[4] = 4  # type: ignore[assignment]
    op: Literal[  # type: ignore[assignment]
        "prefill", "invalidate", "extend_ttl", "release", "prefill_chunk", "synthesize"
    ]
    samples: int = Field(default=0, ge=0, le=MAX_SYNTH_SAMPLES)
    max_new_tokens: int = Field(default=0, ge=0, le=MAX_SYNTH_TOKENS)
    temperature: float | None = Field(
        default=None, gt=0, le=MAX_SYNTH_TEMPERATURE, allow_inf_nan=False
    )
    seed: int | None = Field(default=None, ge=0, le=MAX_VERSION)
    top_k: int | None = Field(default=None, ge=1, le=MAX_TOP_K)
    primer_tokens: int = Field(default=0, ge=0, le=MAX_PRIMER_TOKENS)

    @model_validator(mode="after")
    def _synthesis_fields(self) -> WarmupCommandV4:
        if self.op != "synthesize":
            return self
        if not self.token_ids:
            raise ValueError("token_ids: required for op 'synthesize' (the question prompt)")
        if self.samples < 1 or self.max_new_tokens < 1:
            raise ValueError("samples: op 'synthesize' needs samples and max_new_tokens >= 1")
        if self.temperature is None:
            raise ValueError("temperature: required for op 'synthesize'")
        if self.primer_tokens >= len(self.token_ids):
            raise ValueError("primer_tokens: must be fewer than the prompt's tokens")
        return self


class ChunkSpan(ChunkRef):
    """Where one chunk's block stands in a prompt: tokens [start, end)."""

    start: int = Field(ge=0, lt=MAX_TOKENS)
    end: int = Field(gt=0, le=MAX_TOKENS)


class WarmupCommandV5(WarmupCommandV4):
    """Version 5 of `WarmupCommand` (every prefill kept in device memory); still read,
    upgraded on decode.

    v5: `chunk_spans` on a `prefill`: where each of its chunks stands in `token_ids`, so
    the worker offers their KV for blending into other prompts as soon as it stores the
    prefix (without them a warm prefix donates only once a request that knows them hits
    it). Optional; ordered, disjoint, inside the prompt, each naming one of `chunk_refs`.
    """

    VERSION: ClassVar[int] = 5

    schema_version: Literal[5] = 5  # type: ignore[assignment]
    chunk_spans: list[ChunkSpan] = Field(default_factory=list, max_length=256)

    @model_validator(mode="after")
    def _span_fields(self) -> WarmupCommandV5:
        if not self.chunk_spans:
            return self
        if self.op != "prefill":
            raise ValueError(f"chunk_spans: only op 'prefill' takes them, not '{self.op}'")
        refs = {(r.chunk_id, r.content_hash) for r in self.chunk_refs}
        end = 0
        for span in self.chunk_spans:
            if span.start >= span.end:
                raise ValueError(f"chunk_spans: empty span {span.start}..{span.end}")
            if span.start < end:
                raise ValueError(f"chunk_spans: overlap or out of order at token {span.start}")
            if (span.chunk_id, span.content_hash) not in refs:
                raise ValueError(f"chunk_spans: {span.chunk_id!r} is not in chunk_refs")
            end = span.end
        if end > len(self.token_ids):
            raise ValueError(f"chunk_spans: end {end} is past the prompt's {len(self.token_ids)} "
                             "tokens")
        return self


class WarmupCommand(WarmupCommandV5):
    """An order from the streams app to one worker (or all, `worker_id=None`).

    v6: `placement` of a `prefill`: `device` (the default, as before) keeps the prefix in
    device memory; `tier` computes it and keeps it only in the worker's KV tier below device
    memory (host or disk), where a hit reads it back, without evicting the prefixes in use
    from device memory. A worker without a tier refuses it.
    """

    VERSION: ClassVar[int] = 6

    schema_version: Literal[6] = 6  # type: ignore[assignment]
    placement: Literal["device", "tier"] = "device"

    @model_validator(mode="after")
    def _placement_op(self) -> WarmupCommand:
        if self.placement != "device" and self.op != "prefill":
            raise ValueError(f"placement: only op 'prefill' takes one, not '{self.op}'")
        return self


class WorkerEventV2(WorkerEventV1):
    """Version 2 of `WorkerEvent` (a new epoch meant an empty cache); still read, upgraded.

    v2: `epoch` identifies the worker's boot (its start time in microseconds, so a later
    boot has a larger one): a new epoch means the cache was lost, an older one is a
    leftover of a previous process. `expired` reports a command skipped for its age,
    `refused` one that failed the worker's checks (with its `reason`); `signature`
    authenticates the record.
    """

    VERSION: ClassVar[int] = 2

    schema_version: Literal[2] = 2
    # v2 widens v1's kinds (pydantic validates the override; mypy sees a narrowing base).
    kind: WorkerKind  # type: ignore[assignment]
    epoch: int | None = Field(default=None, ge=0)
    # Why a command was refused (kind "refused"): before any compute, for its sender.
    reason: Annotated[str, StringConstraints(max_length=1024)] | None = None
    # HMAC-SHA256 (hex) of this record with `signature` null, under the workers' shared
    # secret (schemas.signing); the streams app ignores unsigned events when it has one.
    signature: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")] | None = None


class WorkerEventV3(WorkerEventV2):
    """Version 3 of `WorkerEvent` (no node); still read, upgraded on decode.

    v3: a worker with a disk KV tier keeps prefixes across restarts, so a new `epoch` no
    longer means that everything is gone: `ready` and `heartbeat` list in `tier_prefixes`
    the ends of the chains its disk tier holds (served at once, read back on a hit), and
    `tier_bytes` their size. A worker without a tier reports none, as v2 did.
    """

    VERSION: ClassVar[int] = 3

    schema_version: Literal[3] = 3  # type: ignore[assignment]
    tier_prefixes: list[Hash] = Field(default_factory=list, max_length=65_536)
    tier_bytes: int = Field(default=0, ge=0)


class WorkerEventV4(WorkerEventV3):
    """Version 4 of `WorkerEvent` (no synthetic questions); still read, upgraded on decode.

    v4: `node` names the machine the worker runs on (its host name unless set), so the
    streams app can keep at least one worker per node holding the hot set (seed 000: "keep
    ≥1 hot instance per node"). An older event has none: its worker shares one unnamed node
    with the others that report none.
    """

    VERSION: ClassVar[int] = 4

    schema_version: Literal[4] = 4  # type: ignore[assignment]
    node: Id | None = None


class WorkerEventV5(WorkerEventV4):
    """Version 5 of `WorkerEvent` (no tier size); still read, upgraded on decode.

    v5: kind `synthesized` answers a `synthesize` command: `questions` are the questions
    its model sampled about the chunks in `chunk_refs` (cleaned, duplicates dropped; empty
    when none came out usable), for the app to retrieve and warm.
    """

    VERSION: ClassVar[int] = 5

    schema_version: Literal[5] = 5  # type: ignore[assignment]
    kind: Literal[WorkerKind, "synthesized"]  # type: ignore[assignment]
    questions: list[
        Annotated[str, StringConstraints(min_length=1, max_length=MAX_QUESTION_CHARS)]
    ] = Field(default_factory=list, max_length=MAX_SYNTH_SAMPLES)


class WorkerEvent(WorkerEventV5):
    """What a worker reports: cache changes, readiness and heartbeats with memory figures.

    v6: `tier_total_bytes`, the size of the worker's KV tier below device memory (0: it
    keeps none), beside `tier_bytes` (what it holds), so the app can warm prefixes into the
    tier's free room (`WarmupCommand.placement`) as well as into device memory.
    """

    VERSION: ClassVar[int] = 6

    schema_version: Literal[6] = 6  # type: ignore[assignment]
    tier_total_bytes: int = Field(default=0, ge=0)


class DeadLetter(DeadLetterV1):
    """A record that could not be processed: its original bytes (or their head) and why.

    v2: a payload too large to re-send inside a dead letter is truncated; `value_bytes`
    and `value_sha256` describe the original, which stays in `source_topic` at `offset`.
    """

    VERSION: ClassVar[int] = 2

    schema_version: Literal[2] = 2
    value_bytes: int = Field(default=0, ge=0)
    value_sha256: Hash | None = None
    truncated: bool = False


# --- rag.chunks: the index replicated (chunks are embedded once, by the owning instance) --
# A vector travels as base64 of little-endian float32 (`vector_b64`, a third of the JSON
# size) or, for producers in other languages, as a JSON list of floats (`vector`).

MAX_DIM = 8192
# The Kafka header of a `rag.chunks` tombstone (a null value): the document version it
# deletes its chunk at, as ASCII digits (a replica holding a newer version keeps the chunk).
VERSION_HEADER = "ragwarm-version"
# The chunk records of one document never outnumber its ordinals. A bound well above any
# real document (a 1 MB one is about 1,000 chunks of 256 tokens, 16,000 of the smallest
# chunk size, 16 tokens) and far below the million a 1 MB text allows: every lookup of a
# document expands its ordinals (`rag.store.ChunkStore.current_chunks`, the replica's view).
MAX_SLOTS = 65_536


def pack_vector(values: list[float]) -> str:
    """`vector_b64` of `values`: base64 of little-endian float32."""
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode("ascii")


def unpack_vector(b64: str) -> list[float]:
    raw = base64.b64decode(b64, validate=True)
    if not raw or len(raw) % 4:
        raise ValueError("vector_b64: not a whole number of float32 values")
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


class IndexedChunk(Event):
    """One chunk as indexed at document `version`: identity, text, and its embedding.

    Every chunk current at a version is published again at that version (its `version` is
    the document's), so the latest record of each key is whole after compaction.
    """

    SCHEMA: ClassVar[str] = "indexed_chunk"

    schema_name: Literal["indexed_chunk"] = "indexed_chunk"
    tenant: TenantId
    doc_id: Id
    ordinal: int = Field(ge=0, lt=MAX_SLOTS)
    content_hash: Hash
    text: str = Field(max_length=MAX_TEXT_BYTES)
    tokens: int = Field(ge=0)
    version: int = Field(ge=0, le=MAX_VERSION)
    vector_b64: str | None = Field(default=None, max_length=MAX_DIM * 8)
    vector: list[float] | None = Field(default=None, max_length=MAX_DIM)

    @model_validator(mode="after")
    def _one_finite_vector(self) -> IndexedChunk:
        if (self.vector is None) == (self.vector_b64 is None):
            raise ValueError("vector_b64: exactly one of vector and vector_b64 is required")
        try:
            values = self.floats()
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"vector_b64: not base64 of float32 values ({exc})") from None
        if not values or len(values) > MAX_DIM:
            raise ValueError(f"vector: needs 1 to {MAX_DIM} values")
        if not all(math.isfinite(v) for v in values):
            raise ValueError("vector: NaN or infinity")
        return self

    @property
    def chunk_id(self) -> str:
        return f"{self.doc_id}#{self.ordinal}"

    def floats(self) -> list[float]:
        """The vector, whichever way it travelled."""
        if self.vector is not None:
            return list(self.vector)
        assert self.vector_b64 is not None
        return unpack_vector(self.vector_b64)


class IndexedDoc(Event):
    """A document's version committed to the index: published after its chunks, so a
    replica that applies it holds every chunk of that version; `slots` bounds the ordinals
    ever written (chunks stamped with an older version are no longer current)."""

    SCHEMA: ClassVar[str] = "indexed_doc"

    schema_name: Literal["indexed_doc"] = "indexed_doc"
    tenant: TenantId
    doc_id: Id
    version: int = Field(ge=0, le=MAX_VERSION)
    deleted: bool = False
    slots: int = Field(default=0, ge=0, le=MAX_SLOTS)


EVENT_TYPES: tuple[type[Event], ...] = (
    KbChange,
    QueryEvent,
    WarmupCommand,
    WorkerEvent,
    DeadLetter,
    IndexedChunk,
    IndexedDoc,
)
# Older versions still read: `schemas.codec.decode` upgrades them to the current model.
LEGACY_TYPES: tuple[type[Event], ...] = (
    WarmupCommandV1,
    WarmupCommandV2,
    WarmupCommandV3,
    WarmupCommandV4,
    WarmupCommandV5,
    WorkerEventV1,
    WorkerEventV2,
    WorkerEventV3,
    WorkerEventV4,
    WorkerEventV5,
    DeadLetterV1,
)
