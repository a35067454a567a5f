"""State kept in the streams app's tables and the records of its internal topics.

Tables store these as JSON (`model_dump(mode="json")`), never pickle.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas import ChunkRef
from schemas.events import ChunkSpan
from schemas.topics import kb_key


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


def doc_key(tenant: str, doc_id: str) -> str:
    """Key of a document in the `docs` and `doc_prefixes` tables: its `kb.changes` key, so
    two tenants' documents of the same doc_id never share state, the tables stay
    co-partitioned with kb.changes, and the default tenant keeps its older keys."""
    return kb_key(tenant, doc_id).decode("utf-8")


class DocState(_Record):
    """The current chunk hashes of one document (table `docs`, key `doc_key`)."""

    version: int
    tenant: str = "default"
    chunks: dict[str, str] = Field(default_factory=dict)
    deleted: bool = False


class PrefixState(_Record):
    """A prefix the app asked workers to keep warm (table `prefixes`, key prefix hash)."""

    tenant: str
    chunk_refs: list[ChunkRef]
    token_ids: list[int]
    # Where its chunks stand in `token_ids`, sent with every prefill (none in older records).
    chunk_spans: list[ChunkSpan] = Field(default_factory=list)
    questions: list[str] = Field(default_factory=list)
    expires_at: float
    hot: bool = False
    worker_id: str | None = None
    updated_at: float = 0.0  # last op on it (a use, a warm, a TTL extension)
    prefill_at: float | None = None  # when the last prefill command was sent
    resends: int = 0  # re-sends of that prefill no worker confirmed (the resend timer)
    tier: bool = False  # that prefill went to the worker's KV tier only (a resend keeps it)
    uses: int = 0  # queries that reported it (a held, fresh prefix's repeats are not sent)
    synthetic: bool = False  # first warmed for a question a worker's model made up
    # Pinned by an edit's re-warm until its next ask (or `edit_hold_s` after this time).
    held_at: float | None = None


class WorkerState(_Record):
    """What one worker reported (table `workers`, key worker id)."""

    worker_id: str
    url: str | None = None
    ready: bool = False
    mem_used: int = 0
    mem_total: int = 0
    pinned: int = 0
    entries: int = 0
    prefixes: list[str] = Field(default_factory=list)
    last_seen: float = 0.0
    epoch: int | None = None  # the boot it last reported from (None: a v1 worker)
    node: str | None = None  # the machine it runs on (None: a worker before v4 events)
    tier_bytes: int = 0  # KV in its tier below device memory (0: none, or nothing spilled yet)
    tier_total: int = 0  # what that tier may hold (0: it keeps none)
    # Its progressive warmup (streams.decide.progressive): the step its next heartbeat sends (0:
    # none pending), of how many, and the budget every step's plan shares.
    warm_step: int = 0
    warm_steps: int = 1
    warm_budget: int = 0

    @property
    def mem_ratio(self) -> float:
        """Load: all KV held, evictable included (the router's cold-worker weight)."""
        return self.mem_used / self.mem_total if self.mem_total else 0.0

    @property
    def warm_ratio(self) -> float:
        """What the warmup threshold compares: KV that eviction cannot reclaim."""
        return self.pinned / self.mem_total if self.mem_total else 0.0


class PrefixOp(_Record):
    """Work on one prefix, sent through `ragwarm.prefix-ops` keyed by the prefix hash.

    Decisions taken where the data is keyed by doc or tenant reach the prefix table this
    way, so each table is only read and written by the partition that owns its key.
    """

    # The app's verbs about a prefix; what workers receive is a WarmupCommand:
    # warm/warm_on (on one worker)/resend (an unconfirmed prefill, again) -> `prefill`,
    # cool (unpin) -> `release`, invalidate/extend_ttl -> the same, forget (stop
    # tracking) and stored (a worker reported the prefill's KV stored) -> no command. Kept
    # apart from the command verbs: these records sit in a changelogged topic.
    op: Literal[
        "invalidate", "extend_ttl", "warm", "cool", "warm_on", "forget", "resend", "stored"
    ]
    prefix_hash: str
    tenant: str = "default"
    chunk_refs: list[ChunkRef] = Field(default_factory=list)
    token_ids: list[int] = Field(default_factory=list)
    chunk_spans: list[ChunkSpan] = Field(default_factory=list)
    question: str | None = None
    target_worker: str | None = None
    pin: bool = False
    recheck: bool = False
    # The KB plan chose it to re-warm even if no worker holds it (`logic.edit_rewarm`).
    rewarm: bool = False
    # Warms the top-3 of a synthetic question (`streams.decide.synthetic`): recorded on the state.
    synthetic: bool = False
    # An edit's re-warm: pin the prefix until its next ask, so the worker's LRU does not
    # evict it first. On a `cool` op: end that hold (not the hot-set pin).
    hold: bool = False
    # warm_on only: into the worker's KV tier below device memory (`WarmupCommand.placement`).
    tier: bool = False
    reason: str = ""
    origin_ts: float | None = None


class DocLink(_Record):
    """Adds or removes a prefix from a document's dependents (`ragwarm.doc-links`, key
    `doc_key`). Records from before tenants were part of the key read as the default's."""

    doc_id: str
    tenant: str = "default"
    prefix_hash: str
    chunk_refs: list[ChunkRef] = Field(default_factory=list)
    link: bool = True


class ReadyRewarm(_Record):
    """A ready worker's re-warm, sent once to each partition of `ragwarm.worker-ready`: the
    instance owning that partition of the prefixes table warms its tracked prefixes on it.
    `partition` None (the in-process simulation): every prefix the handler holds."""

    worker_id: str
    budget_bytes: int
    partition: int | None = None
    partitions: int = 1
    skip: list[str] = Field(default_factory=list)
    # Which of the progressive warmup's steps this is (streams.decide.progressive); one step of one
    # (every prefix that fits) for records sent before steps existed; 0: none (tier only).
    step: int = Field(default=1, ge=0)
    steps: int = 1
    # Room in the worker's KV tier to fill with the next most used prefixes after those
    # device memory takes: with the last step, or when the steps stop.
    tier_bytes: int = Field(default=0, ge=0)
