"""Settings of the streams app (env prefix `RAGWARM_STREAMS_`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas import deadletter


class StreamsSettings(BaseSettings):
    """The Faust app: identity, web views, TTLs, hot-token windows and budgets."""

    model_config = SettingsConfigDict(env_prefix="RAGWARM_STREAMS_", extra="forbid")

    app_id: str = Field(default="ragwarm-streams", description="Faust app id (consumer group).")
    data_dir: Path | None = Field(
        default=None,
        description="Where Faust keeps its local state; $RAGWARM_HOME/faust/<app id> when unset.",
    )
    web_host: str = Field(default="127.0.0.1", description="Bind address of the web views.")
    web_port: int = Field(default=6066, description="Port of the web views.")
    partitions: int = Field(default=4, description="Partitions of internal topics and tables.")
    prefix_ttl_s: float = Field(default=3600.0, description="TTL of a warmed prefix.")
    hot_window_s: float = Field(default=600.0, description="Hopping window of the hot set.")
    hot_step_s: float = Field(default=60.0, description="Step of the hopping window.")
    hot_tick_s: float = Field(default=5.0, description="How often the hot set is re-planned.")
    hot_capacity: int = Field(default=256, description="Counters per heavy-hitter sketch.")
    hot_tokens: bool = Field(
        default=True, description="Warm the heavy-hitter prefixes of the query stream (pinned)."
    )
    hot_share: float = Field(
        default=0.18, ge=0.0, le=0.5, description="Share of worker KV memory for hot tokens."
    )
    hot_min_count: float = Field(default=2.0, description="Queries in a window to count as hot.")
    hot_pin_rent: bool = Field(
        default=True,
        description="Pin a hot prefix only when one of its asks in the window came from beyond "
        "what request caching holds (its reuse distance exceeded the workers' KV memory outside "
        "the hot share): a prefix re-asked sooner stays cached without a pin, and its pin would "
        "only take bytes from request caching (streams.decide.rent). Off: every prefix asked "
        "hot_min_count times is pinned.",
    )
    hot_unfound_retry_s: float = Field(
        default=30.0,
        ge=0.0,
        description="A hot prefix whose question retrieved nothing is retrieved again after "
        "this long, not every tick (its tenant's index may have been empty).",
    )
    kv_bytes_per_token: int = Field(
        default=23_040,
        description="KV bytes per token until workers report (SmolLM2, KV stored in fp16).",
    )
    track_queries: bool = Field(
        default=True,
        description="Keep the prefix of every answered query warm (TTL) and linked to its "
        "chunks, so a KB change re-warms what its questions retrieve; off: hot prefixes only.",
    )
    query_op_interval_s: float = Field(
        default=2.0, ge=0,
        description="Least time between two warm ops the queries of one tracked prefix send "
        "(each refreshes its TTL and questions; while it is on no worker every query would "
        "send one). 0: one per query that changes something.",
    )
    warmup_steps: int = Field(
        default=3,
        ge=1,
        description="Steps of a ready worker's re-warm (seed 000's router: warmup_steps 3, "
        "progressive): growing shares of its budget (1/6, 2/6, 3/6), most used prefixes first, "
        "the next one after each heartbeat while its KV use is within the memory threshold "
        "(0.7). 1: everything that fits at once.",
    )
    tier_warmup: bool = Field(
        default=True,
        description="After a ready worker's re-warm fills device memory, warm the next most "
        "used tracked prefixes into its KV tier below it (host or disk; workers reporting "
        "one), within the tier's free room: a first ask of a question asked on an earlier "
        "day reads it back instead of computing it.",
    )
    rewarm_questions: int = Field(default=4, description="Hot questions re-warmed per prefix.")
    warm_question_tails: int = Field(
        default=2, ge=0,
        description="A prefill of a tracked prefix also warms the whole prompt of its last "
        "asked questions, this many (unpinned, same TTL and chunks): a repeat then reuses "
        "its question's tokens as request caching would, not the prefix alone. 0: prefixes.",
    )
    # 0.5: with the hot set's 0.18 it stays under the 0.7 of memory a worker lets warmup
    # pin (workers.kv.memory.MEMORY_THRESHOLD), so the worker refuses neither.
    edit_rewarm_share: float = Field(
        default=0.5, ge=0.0, le=0.7,
        description="Share of the ready workers' KV memory one KB change may re-warm and hold "
        "(pinned until asked) for its dependents asked in the hot window, most asked first, "
        "held by a worker or not; other held or hot invalidated ones are re-warmed unpinned.",
    )
    edit_rewarm_rest: int = Field(
        default=64, ge=0,
        description="Where every ready worker keeps a KV tier (RAGWARM_WORKER_HOST_TIER_BYTES"
        " or the disk tier), one KB change also re-warms and holds up to this many of its "
        "other dependent prefixes, beyond those edit_rewarm_share chooses (asked lately "
        "first): their holds do not pin there, so what the device cannot keep spills to the "
        "tier and the next ask reads it back. 0: the budget's only.",
    )
    edit_hold_s: float = Field(
        default=1800.0, gt=0,
        description="How long a prefix an edit re-warmed stays pinned waiting for its next "
        "ask (the ask unpins it); the hold then ends and the LRU may evict it.",
    )
    edit_watch: bool = Field(
        default=True,
        description="A KB change also re-retrieves the questions of prefixes asked in the "
        "last edit_hold_s (a process-local log) that use none of the document's chunks; where "
        "its chunks enter their top-3, the new prefix is warmed and held like a re-warmed "
        "dependent, within what the change's edit_rewarm_share left. It also re-warms and "
        "holds the dependents asked more than once before the hot window, within that share "
        "less what pins hold already. Off: event-rag's rule.",
    )
    edit_recheck_questions: int = Field(
        default=32, ge=0,
        description="Recently asked prefixes (not the edited document's dependents) whose "
        "question one KB change retrieves again with edit_watch, most asked first: one "
        "retrieval each.",
    )
    chunk_warmup: bool = Field(
        default=False,
        description="Event-driven chunk warmup: prefill on workers the KV of `system + "
        "chunk` for the chunks questions retrieve most: on a KB change the new versions of "
        "retrieved chunks of documents that are hot or linked to tracked prefixes (and drop "
        "the KV of the versions they replace), on the hot tick the hot window's chunks, on a "
        "ready worker the same. A new question whose first chunk is warm reuses it exactly; "
        "workers with RAGWARM_WORKER_CHUNK_REUSE on also blend chunks further in.",
    )
    chunk_warm_max: int = Field(
        default=16, ge=0, description="Most chunk prefills one KB change (or one hot tick, "
        "or one ready worker) sends."
    )
    chunk_warm_share: float = Field(
        default=0.1, ge=0.0, le=0.5,
        description="Share of the smallest ready worker's KV memory the chunk KV one KB "
        "change (or one hot tick, or one ready worker) may take.",
    )
    chunk_ttl_s: float = Field(
        default=900.0, gt=0, description="TTL of warmed chunk KV (pinned until then with "
        "RAGWARM_STREAMS_CHUNK_PIN).",
    )
    chunk_pin: bool = Field(
        default=False,
        description="Pin warmed chunk KV until its TTL (unpinned, KV nobody has used yet is "
        "the LRU's first victim). Off: in the quick strategies run pinning took 37% of KV "
        "memory and cut hybrid-blend's hit rate from 67% to 51% with no answer blended.",
    )
    worker_stale_s: float = Field(
        default=30.0, description="Heartbeat age that marks a worker gone."
    )
    epoch_ahead_s: float = Field(
        default=300.0, gt=0, description="How far ahead of this host's clock a worker's boot "
        "epoch (its start, wall clock) may be; a later one is refused and counted "
        "(future_epoch_events), since it would make every honest epoch after it look old.",
    )
    forget_after_s: float = Field(
        default=3600.0,
        gt=0,
        description="How long past its TTL a prefix no worker holds stays tracked before the "
        "sweep drops it (and its doc links), so the prefixes table does not grow forever.",
    )
    sweep_s: float = Field(default=60.0, gt=0, description="How often expired prefixes are swept.")
    warm_cron: str | None = Field(
        default=None, description="Crontab (UTC) of scheduled hot-set warmups, e.g. '55 8 * * 1-5'."
    )
    tenant: str = Field(default="default", description="Tenant of documents without one.")

    # -- faults (issue 12): nothing is lost
    retry_initial_s: float = Field(
        default=0.5, gt=0, description="First wait before a record whose handling failed "
        "transiently (store, embedder, broker) is tried again; the partition waits."
    )
    retry_max_s: float = Field(default=30.0, gt=0, description="Longest wait between retries.")
    retry_attempts: int = Field(
        default=12, ge=0, description="Retries of a transient failure before the record is "
        "parked: retried every retry_max_s until it passes, never dead-lettered, with the "
        "ragwarm_streams_parked_records gauge above 0 (alert on it); 12 from 0.5 s "
        "doubling to 30 s: about 3.5 min."
    )
    deadletter_max_bytes: int = Field(
        default=deadletter.PAYLOAD_BYTES, ge=0,
        description="Payload bytes a dead letter carries; a larger "
        "record keeps its head, size and sha256 (the original stays in its topic)."
    )
    producer_max_request_bytes: int = Field(
        default=deadletter.MAX_REQUEST_BYTES, ge=65_536,
        description="The producer's max request size.",
    )
    producer_batch_bytes: int = Field(
        default=512 * 1024, ge=16_384,
        description="Most bytes of one partition's batch (capped at the max request size). "
        "aiokafka holds one batch a partition and a send to a full one waits until it went "
        "out: at Faust's 16 KiB, 348 rag.chunks-sized records (2.8 KB, vectors) took 25 ms "
        "to the local broker, at 512 KiB 8 ms.",
    )
    resend_s: float = Field(
        default=10.0, gt=0, description="How often prefills no worker confirmed are re-sent."
    )
    prefill_resends: int = Field(
        default=3, ge=0, description="Re-sends of an unconfirmed prefill before giving up."
    )
    command_expiry_s: float = Field(
        default=300.0, gt=0, description="A prefill command not carried out by then is "
        "skipped by the worker (a restarted worker must not replay old commands)."
    )
    broker_wait_s: float = Field(
        default=300.0, ge=0, description="How long start-up waits for the broker, retrying."
    )
    recover_index: bool = Field(
        default=True, description="On start, re-index from kb.changes the documents the "
        "local index lacks or holds at an older version than the docs table."
    )
    index_replica: bool = Field(
        default=True, description="With Qdrant local mode: publish what this instance indexes "
        "on rag.chunks and keep the local index a replica of that topic (several instances "
        "need it; a fresh disk rebuilds from it without embedding). Off: a single instance "
        "re-indexes from kb.changes instead. Ignored with RAGWARM_QDRANT_URL (one shared index).",
    )
    replica_wait_s: float = Field(
        default=10.0, gt=0, description="Longest wait for the local index replica to apply "
        "what other instances published on rag.chunks, before a warm op naming chunks it "
        "does not hold yet is dropped as stale.",
    )
    kb_batch_max: int = Field(
        default=32, ge=1, le=4096,
        description="Most KB changes indexed together (their new chunks embedded in one go).",
    )
    kb_batch_within_s: float = Field(
        default=0.05, gt=0, le=10,
        description="How long a KB batch waits for more changes before it is indexed.",
    )
    session_timeout_s: float = Field(
        default=10.0, ge=10.0, le=300.0,
        description="How long the consumer group waits for a silent instance (a crash) "
        "before its partitions move to the others (Kafka's session timeout). It is also "
        "what a SIGKILLed app waits at its restart, for the group to drop its dead member "
        "(issue 40). Heartbeats go every 3 s from the event loop, which blocking store work "
        "(in a thread) does not hold.",
    )
    recovery_stall_s: float = Field(
        default=30.0, ge=0.0, le=600.0,
        description="After a rebalance, an active changelog partition that gets no record "
        "for this long while still behind its highwater is sought again from where its table "
        "stands (Faust only warns, and the instance handles nothing until every table is "
        "rebuilt). Checked every half of it; 0: no watchdog.",
    )
    standby_replicas: int = Field(
        default=1, ge=0, le=4,
        description="Standby copies of each table partition that other instances keep up to "
        "date from its changelog (Faust's table_standby_replicas): when an instance dies, the "
        "one taking over its partitions has their tables already and does not replay the "
        "changelog. Useful only with more than one instance; each copy costs memory and "
        "changelog reads.",
    )
    consumer_max_fetch_bytes: int = Field(
        default=8 * 1024 * 1024, ge=65_536,
        description="Most bytes one fetch returns per partition. aiokafka sends a node's "
        "next fetch only once the last is consumed: at Faust's 1 MiB a query-log backlog "
        "arrived ~3,000 records a round trip and capped the query agent.",
    )
    stream_buffer_max: int = Field(
        default=32_768, ge=1_024,
        description="Records an agent's queue holds before Faust pauses fetching its "
        "partitions (Faust's default 4,096 is under two fetches of short records).",
    )
    query_batch_max: int = Field(
        default=512, ge=1, le=65536,
        description="Most rag.queries records counted together; the hot-token windows are "
        "written to their changelog table once per batch.",
    )
    query_batch_within_s: float = Field(
        default=0.05, gt=0, le=10,
        description="How long a query batch waits for more records before it is counted.",
    )
    op_batch_max: int = Field(
        default=64, ge=1, le=4096,
        description="Most prefix ops handled as one batch: the local index replica catches "
        "up on rag.chunks once per batch (a broker round trip) instead of once per op.",
    )
    # Faust's take_events wakes every `within` even when no op comes: at 0.01 s the idle
    # op agent was 13% of the event loop while a KB backlog was indexed, and slowed the
    # embedder's thread (the GIL); 0.05 s, as the other agents, costs an op at most 50 ms.
    op_batch_within_s: float = Field(
        default=0.05, gt=0, le=10,
        description="How long a prefix-op batch waits for more ops before it is handled.",
    )

    # -- synthetic warmup (issue 16; `streams.decide.synthetic`)
    synthetic: bool = Field(
        default=False,
        description="Synthetic warmup: a worker's model samples likely questions about hot or "
        "just changed documents and their top-3 prefixes are warmed on it. Off by default: "
        "the sampling runs on the serving engine beside user requests, and a small model's "
        "questions may not match what users ask (measure with `ragwarm bench strategies`).",
    )
    synthetic_questions: int = Field(
        default=3, ge=1, le=8, description="Synthetic warmup: questions sampled per document."
    )
    synthetic_temperature: float = Field(
        default=1.3, ge=1.2, le=1.5,
        description="Synthetic warmup: sampling temperature (seed 000: 1.2-1.5).",
    )
    synthetic_top_k: int | None = Field(
        default=40, ge=1, le=1000,
        description="Synthetic warmup: sample among the k likeliest tokens only (unset: all); "
        "at temperature 1.2-1.5 a small model's tail tokens make gibberish.",
    )
    synthetic_max_new_tokens: int = Field(
        default=24, ge=4, le=128, description="Synthetic warmup: longest question, in tokens."
    )
    synthetic_source_tokens: int = Field(
        default=192, ge=16, le=4096,
        description="Synthetic warmup: tokens of the document's text the question prompt holds.",
    )
    synthetic_share: float = Field(
        default=0.05, gt=0, le=0.05,
        description="Synthetic warmup: most KV its prefixes take on a worker, as a share of "
        "that worker's memory (seed 000: under 5%).",
    )
    synthetic_cooldown_s: float = Field(
        default=900.0, ge=0,
        description="Synthetic warmup: a document gets new questions at most once per this.",
    )
    synthetic_docs_per_tick: int = Field(
        default=2, ge=0, le=64,
        description="Synthetic warmup: hot documents asked about per hot tick (rate limit).",
    )
    synthetic_seed: int | None = Field(
        default=None, ge=0,
        description="Synthetic warmup: seed of the sampling (unset: random); with one, the "
        "same document version gets the same questions.",
    )

    # -- security (issue 13)
    api_key: SecretStr | None = Field(
        default=None,
        description="Operator bearer token of the web views (every tenant); unset with no "
        "tenant keys, the views are open. /ragwarm/health stays open.",
    )
    tenant_keys: dict[str, SecretStr] = Field(
        default_factory=dict,
        description='Tenant-bound bearer tokens as JSON, {"tenant": "key"} ("*": every '
        "tenant): retrieve and route only; state views need an operator key.",
    )
    worker_events_secret: SecretStr | None = Field(
        default=None,
        description="Master signing secret: each worker's events key is derived from it "
        "and the worker id (`ragwarm keys worker-key`), and warmup commands are signed with "
        "a key derived from it (`ragwarm keys commands-key`). With one, unsigned or forged "
        "worker events are ignored (and counted), so routing only returns authenticated "
        "workers.",
    )
    retrieve_concurrency: int = Field(
        default=2, ge=1, description="Retrieve calls served at once; the rest wait (see below)."
    )
    retrieve_wait_s: float = Field(
        default=5.0, gt=0, description="Longest wait for a retrieve slot before 429."
    )
