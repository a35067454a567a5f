"""Settings of `ragwarm bench strategies` (env prefix `RAGWARM_STRATEGIES_`)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from streams.settings import StreamsSettings


class StrategySettings(BaseSettings):
    """The workload, the shared KV budget and the simple policies' knobs; the streams
    policies read the streams app's own settings (`RAGWARM_STREAMS_*`)."""

    model_config = SettingsConfigDict(env_prefix="RAGWARM_STRATEGIES_", extra="forbid")

    seed: int = Field(default=7, description="Seed of the query workload (popularity, arrivals).")
    queries: int = Field(default=600, ge=1, description="Queries in the workload (full mode).")
    edits: int | None = Field(
        default=None,
        ge=0,
        description="KB changes replayed after the initial state: those that touch a document "
        "the questions depend on, up to the N-th that changes content; unset replays every "
        "change (full mode).",
    )
    quick_queries: int = Field(default=72, ge=1, description="Queries with --quick.")
    quick_edits: int = Field(
        default=10, ge=0, description="Relevant content-changing KB changes with --quick."
    )
    quick_questions: int = Field(
        default=40, ge=1,
        description="Questions sampled first with --quick (up to half about edited documents); "
        "only their documents and distractors are indexed.",
    )
    quick_docs: int = Field(
        default=50, ge=1,
        description="Documents of the initial state with --quick: those the sampled questions "
        "name, then a seeded sample of the others.",
    )
    standard_queries: int = Field(
        default=240, ge=240, description="Queries with --standard (whole initial state)."
    )
    standard_edits: int = Field(
        default=30, ge=30, description="Content-changing KB changes with --standard."
    )
    standard_share_queries: bool = Field(
        default=True,
        description="With --standard, a request also reuses an earlier query's measurement of "
        "the same computation (same prompt ids, same cached tokens), not only another "
        "policy's for the same query: a repeated prompt is measured once per cached length.",
    )
    quick_chunk_tokens: int = Field(
        default=64, ge=16, description="Chunk size with --quick (shorter prompts, same shape)."
    )
    chunk_tokens: int | None = Field(
        default=None, ge=16, description="Chunk size in LLM tokens; unset uses RAGWARM_RAG_*."
    )
    zipf_s: float = Field(default=1.1, gt=0, description="Zipf exponent of question popularity.")
    mean_gap_s: float = Field(
        default=30.0, gt=0, description="Mean simulated seconds between queries outside bursts."
    )
    burst_prob: float = Field(
        default=0.08, ge=0, le=1, description="Chance that an arrival starts a burst."
    )
    burst_size: tuple[int, int] = Field(
        default=(3, 8), description="Smallest and largest number of queries in a burst."
    )
    burst_gap_s: float = Field(default=2.0, gt=0, description="Mean gap inside a burst.")
    post_edit_asks: bool = Field(
        default=True,
        description="The post-edit scenario: every edit is followed by an ask of a question "
        "it concerns (questions moved in the drawn timeline); false: the drawn workload.",
    )
    same_eviction: bool = Field(
        default=True,
        description="Every policy on ragwarm's worker's eviction (RAGWARM_WORKER_EVICTION_"
        "POLICY), so the table compares warmup alone; false: the peers on their own "
        "system's (vLLM's LRU).",
    )
    edits_from: float = Field(
        default=0.25, ge=0, lt=1, description="Share of the run before the first KB change."
    )
    memory_share: float = Field(
        default=0.4,
        gt=0,
        le=4,
        description="KV budget of every policy, as a share of the bytes of the distinct "
        "top-3 prefixes of the live questions at the start.",
    )
    streams: StreamsSettings = Field(
        default_factory=StreamsSettings,
        description="The streams app's own settings (RAGWARM_STREAMS_*: TTL, hot-token "
        "windows, shares, re-warms), read once and used by every policy that warms.",
    )
    scheduled_share: float = Field(
        default=0.18, gt=0, le=1, description="scheduled: share of KV memory for the warm set."
    )
    scheduled_period_s: float = Field(
        default=900.0, gt=0, description="scheduled: seconds between refreshes of the warm set."
    )
    history_queries: int = Field(
        default=300,
        ge=1,
        description="Yesterday's query log: draws like today's on the same arrival process, "
        "ending just before the run (history and scheduled rank it; streams policies replay it).",
    )
    ttft_runs: int = Field(
        default=3,
        ge=1,
        description="Runs of each query on the same cache state; its TTFT is their median "
        "(this machine is shared and noisy: one slow run must not decide a P99).",
    )
    tiered_disk_share: float = Field(
        default=2.0,
        gt=0,
        description="tiered: bytes of its worker's disk tier, as a multiple of the KV budget "
        "(disk is larger than device memory; 2 keeps a run's scratch disk small).",
    )
    restart_at: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="Restart scenario: every worker restarts (its device cache lost, its disk "
        "kept) before the query at this share of the run; unset: no restart.",
    )
    restart_window: int = Field(
        default=10, ge=1, description="Queries after the restart that its figures cover."
    )
    threads: int | None = Field(default=None, ge=1, description="torch threads; default 1.")
    tenant: str = Field(default="default", description="Tenant of the documents and queries.")
