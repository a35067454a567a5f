"""`ragwarm bench pipeline`: the streams app's throughput and event-to-warm latency, for real.

Everything runs as in production: the local Kafka broker, `ragwarm streams` and
`ragwarm worker` as separate processes, in a topic namespace of their own.
"""

from __future__ import annotations

import contextlib
import json
import random
import statistics
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import click
import httpx

from ragwarm.ports import free_port
from ragwarm.settings import TRACE_DIR, HomeSettings, KafkaSettings, ModelSettings
from ragwarm.stack.procs import Proc
from ragwarm.trace import trace_changes
from schemas import KbChange, QueryEvent, WarmupCommand, WorkerEvent, decode, encode
from schemas.topics import KB_CHANGES, RAG_QUERIES, WARMUP_COMMANDS, WORKER_EVENTS, prefixed

QUERY_TENANTS = 8  # of the synthetic queries: more than the topic's 4 partitions


class Bench:
    """One namespace on the broker with a streams app and a worker in it."""

    def __init__(self, bootstrap: str, workdir: Path, say, streams: int = 1,
                 client_options: dict | None = None):
        from kafka import KafkaConsumer, KafkaProducer

        from ragwarm.kafka.admin import create_topics

        self.say = say
        self.prefix = f"bench-{uuid.uuid4().hex[:8]}."
        self.bootstrap = bootstrap
        self.client_options = client_options or {}
        # Before any client names them: a consumer's metadata request would otherwise let
        # the broker auto-create them with one partition, and Faust then refuses its tables
        # (the changelogs have the app's partition count): no worker event is ever applied.
        create_topics(bootstrap, client_options or {}, prefixed(self.prefix))
        env = {"RAGWARM_KAFKA_BOOTSTRAP": bootstrap, "RAGWARM_KAFKA_TOPIC_PREFIX": self.prefix}
        # N instances of one app (one consumer group), each with its port and disk.
        self.streams_all = [self._streams_proc(i, workdir, env) for i in range(streams)]
        self.streams = self.streams_all[0]
        self.streams_url = self.streams.health_url.removesuffix("/ragwarm/health")
        wport = free_port()
        self.worker_url = f"http://127.0.0.1:{wport}"
        self.worker = Proc(
            "bench-worker",
            ["worker", "--worker-id", "bench-w1", "--port", str(wport)],
            workdir,
            f"{self.worker_url}/health/ready",
            env | {"RAGWARM_WORKER_HEARTBEAT_S": "1", "RAGWARM_WORKER_CACHE_REQUESTS": "false"},
        )
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
        # Worker events, and the commands the app sends (their stage of event-to-warm).
        self.events = KafkaConsumer(
            self.prefix + WORKER_EVENTS,
            self.prefix + WARMUP_COMMANDS,
            bootstrap_servers=bootstrap,
            auto_offset_reset="earliest",
            consumer_timeout_ms=100,
        )
        self.seen: list[tuple[float, WorkerEvent]] = []
        self.commands: list[tuple[float, WarmupCommand]] = []

    def _streams_proc(self, i: int, workdir: Path, env: dict[str, str]) -> Proc:
        port = free_port()
        return Proc(
            f"bench-streams-{i + 1}",
            ["streams", "--loglevel", "warning"],
            workdir,
            f"http://127.0.0.1:{port}/ragwarm/health",
            env
            | {
                "RAGWARM_STREAMS_APP_ID": self.prefix + "app",
                "RAGWARM_STREAMS_WEB_PORT": str(port),
                "RAGWARM_STREAMS_HOT_TICK_S": "0.5",
                "RAGWARM_QDRANT_PATH": str(workdir / f"qdrant-{i + 1}"),
                "RAGWARM_STREAMS_DATA_DIR": str(workdir / f"faust-{i + 1}"),
            },
        )

    def stats(self) -> list[dict]:
        """The `/ragwarm/stats` body of every streams instance."""
        return [
            httpx.get(proc.health_url.removesuffix("health") + "stats", timeout=10).json()
            for proc in self.streams_all
        ]

    def counters(self) -> dict:
        """The counters of every streams instance, summed."""
        return summed(self.stats())

    def start_streams(self) -> None:
        for proc in self.streams_all:
            proc.start()
        for proc in self.streams_all:
            proc.wait_healthy(300)

    def stop_streams(self) -> None:
        for proc in self.streams_all:
            proc.stop()

    def send(self, topic: str, key: str, value: bytes) -> None:
        self.producer.send(self.prefix + topic, key=key.encode(), value=value)

    def poll_events(self) -> None:
        for message in self.events:
            if message.topic.endswith(WORKER_EVENTS):
                self.seen.append((time.time(), decode(message.value, WorkerEvent)))
            else:  # sent by the app: its own timestamp (same host clock)
                cmd = decode(message.value, WarmupCommand)
                self.commands.append((message.timestamp / 1000, cmd))

    def wait_event(self, kind: str, prefix_hash: str, after: float, timeout_s: float) -> float:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.poll_events()
            for at, event in self.seen:
                if at >= after and event.kind == kind and event.prefix_hash == prefix_hash:
                    return at
        raise TimeoutError(f"no {kind} event for {prefix_hash[:12]} within {timeout_s} s")

    def stored_refs(self, prefix_hash: str) -> list:
        """The chunk refs of the last `stored` event for `prefix_hash`."""
        self.poll_events()
        stored = [e for _, e in self.seen if e.kind == "stored" and e.prefix_hash == prefix_hash]
        return list(stored[-1].chunk_refs) if stored else []

    def rate(
        self, keys: tuple[str, ...], total: int, timeout_s: float, stall_s: float = 300.0,
        poll_s: float = 0.1, spread: bool = False,
    ) -> float:
        """Events per second between the first and the last processed, from the app's counters
        read every `poll_s` (each read is an HTTP request the app answers: a phase of minutes
        is read less often); no progress for `stall_s` (a stuck partition: issue 14's
        --streams 2 stall) ends it. `spread`: timed from the first read at which every
        instance holds partitions (`spread_over`), what was processed before not counted."""
        first = last = None
        deadline = time.monotonic() + timeout_s
        moved = (time.monotonic(), -1)
        while time.monotonic() < deadline:
            bodies = self.stats()
            done = sum(summed(bodies).get(k, 0) for k in keys)
            now = time.monotonic()
            if first is None and (spread_over(bodies) if spread else done):
                if done >= total:
                    raise TimeoutError(
                        f"all {total} events were processed before every instance held"
                        " partitions: nothing left to time (raise --queries)"
                    )
                first = (now, done)
            if done >= total:
                last = (now, done)
                break
            if done != moved[1]:
                moved = (now, done)
            elif now - moved[0] > stall_s:
                raise TimeoutError(f"{done} of {total} events processed, none in {stall_s} s")
            time.sleep(poll_s)
        if first is None or last is None or last[0] <= first[0]:
            raise TimeoutError(f"only part of {total} events processed in {timeout_s} s")
        return (last[1] - first[1]) / (last[0] - first[0])

    def behind(self, topic: str) -> dict[int, int]:
        """Per partition of `topic`, the records the app's group has not committed."""
        from ragwarm.kafka.admin import uncommitted

        group = self.prefix + "app"
        return uncommitted(self.bootstrap, self.client_options, self.prefix + topic,
                           [group])[group]

    def wait_committed(self, topic: str, timeout_s: float) -> None:
        """Until the app has committed all of `topic`: the processed-event counters also count
        a record handled twice (after a rebalance), so they can pass the total while a
        partition is stuck (the --streams 2 stall of issue 14)."""
        deadline = time.monotonic() + timeout_s
        while left := self.behind(topic):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic} partitions not committed to their end within "
                                   f"{timeout_s} s (partition: records left): {left}")
            time.sleep(1.0)

    def close(self) -> None:
        self.worker.stop()
        self.stop_streams()
        self.producer.close()
        self.events.close()


def synthetic_queries(n: int, prefixes: int, seed: int, tenants: int = 1) -> list[QueryEvent]:
    """Zipf-popular prefix hashes, as a busy gateway would log them; prefix i belongs to
    tenant `synthetic-<i mod tenants>` (a tenant's records share a partition)."""
    rng = random.Random(seed)
    hashes = [uuid.UUID(int=rng.getrandbits(128)).hex for _ in range(prefixes)]
    weights = [1 / (i + 1) for i in range(prefixes)]
    picks = rng.choices(range(prefixes), weights, k=n)
    return [
        QueryEvent(
            tenant=f"synthetic-{i % tenants}",
            question=f"synthetic question {i}",
            prefix_hash=hashes[i],
            block_hashes=[hashes[i]],
            prefix_tokens=800,
        )
        for i in picks
    ]


class Prompts:
    """Retrieves through the streams app and builds the canonical prompt, as a client does."""

    def __init__(self, streams_url: str):
        from rag.prompt import PromptBuilder
        from rag.settings import RagSettings
        from ragwarm.models import llm_dir, load_tokenizer

        self.url = streams_url
        self.rag = RagSettings()
        self.tokenizer = load_tokenizer(llm_dir())
        self.builder = PromptBuilder(self.tokenizer, self.rag.system_prompt)
        self.model = ModelSettings().llm_name

    def query_event(self, question: str) -> tuple[QueryEvent, list[dict]]:
        from types import SimpleNamespace

        from schemas.prefix import prefix_chain

        reply = httpx.post(
            f"{self.url}/ragwarm/retrieve",
            json={"question": question, "tenant": "default"},  # retrieval names its tenant
            timeout=60,
        )
        if reply.status_code != 200:
            raise RuntimeError(f"retrieve answered {reply.status_code}: {reply.text}")
        rows = reply.json()["chunks"]
        prompt = self.builder.build([SimpleNamespace(**r) for r in rows], question)
        chain = prefix_chain(prompt.prefix_ids, tenant="default", model=self.model)
        event = QueryEvent(
            question=question,
            chunk_refs=list(prompt.chunk_refs),
            prefix_hash=chain.prefix_hash,
            block_hashes=list(chain.prefix_hashes),
            prefix_tokens=prompt.prefix_len,
        )
        return event, rows

    def chunk_hashes(self, doc_id: str, text: str) -> dict[str, str]:
        """chunk_id -> content hash of `text` as the app's indexer will chunk it."""
        from rag.chunking import chunk_document

        chunks = chunk_document(
            doc_id, text, self.tokenizer, self.rag.chunk_tokens, self.rag.chunk_overlap
        )
        return {c.chunk_id: c.content_hash for c in chunks}


@click.command()
@click.option(
    "--events",
    type=click.Path(exists=True, path_type=Path),
    default=TRACE_DIR / "events.jsonl",
    show_default=True,
    help="Trace events (JSONL).",
)
@click.option(
    "--questions",
    type=click.Path(exists=True, path_type=Path),
    default=TRACE_DIR / "questions.jsonl",
    show_default=True,
    help="Trace questions.",
)
@click.option("--kb-events", type=int, default=None, help="Use the first N trace events.")
@click.option("--queries", type=int, default=20_000, show_default=True)
@click.option("--hot", type=int, default=4, show_default=True, help="Hot questions to warm.")
@click.option("--edits", type=int, default=12, show_default=True)
@click.option(
    "--embed-sample", type=int, default=512, show_default=True,
    help="Chunks the embedder is timed on alone (a sample of those the trace embeds; the "
    "median of 3 passes).",
)
@click.option(
    "--streams", "streams_n", type=click.IntRange(1, 8), default=1, show_default=True,
    help="Streams instances (one consumer group, each its own port and disk).",
)
@click.option(
    "--workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="Keep the processes' logs and stores here (default: a temporary folder, removed).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def pipeline(
    events: Path,
    questions: Path,
    kb_events: int | None,
    queries: int,
    hot: int,
    edits: int,
    embed_sample: int,
    streams_n: int,
    workdir: Path | None,
    as_json: bool,
) -> None:
    """Token-frequency and KB-change throughput, and KB-event-to-warm latency.

    Each edit changes a chunk of a warm prefix and is followed until the worker stores the
    prefix its question retrieves afterwards. An edit that does not get there within 60 s
    per stage is recorded as missed, with its reason, and the run goes on; the figures are
    printed all the same and the command then exits with status 1, as it does when no
    edit could be measured (no hot question warm, no chunk to edit)."""
    from ragwarm.kafka.local import LocalKafka
    from ragwarm.trace import read_questions

    say = (lambda m: click.echo(m, err=True)) if as_json else click.echo
    kafka = KafkaSettings()
    with LocalKafka(HomeSettings(), kafka) as bootstrap, _workdir(workdir) as tmp:
        b = Bench(bootstrap, Path(tmp), say, streams_n, kafka.client_options())
        try:
            result = run(
                b, events, read_questions(questions), kb_events, queries, hot, edits, embed_sample
            )
        finally:
            b.close()
    if as_json:
        click.echo(json.dumps(result))
    else:
        for key, value in result.items():
            if key != "edits":
                click.echo(f"{key:<32}{_figure(value):>14}")
    if result["edits_missed"] or (edits and not result["edits_warm"]):
        raise SystemExit(1)


def _figure(value: float | list | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return " / ".join(_figure(v) for v in value)
    return f"{value:.1f}"


def _workdir(path: Path | None):
    if path is None:
        return tempfile.TemporaryDirectory()
    path.mkdir(parents=True, exist_ok=True)
    return contextlib.nullcontext(str(path))


def run(b: Bench, events: Path, questions, kb_events, queries, hot, edits, sample) -> dict:
    from ragwarm.bench.embed_rate import embed_rates, embedded_chunks
    from ragwarm.bench.pipeline_edits import measure_edits, stage_figures

    changes = trace_changes(events, kb_events)
    texts = embedded_chunks(changes)
    # The embedder alone is timed before the pipeline and after it, and the median of both
    # is the reference: this VM's speed drifts by tens of percent over minutes, and timed
    # after the pipeline only, the reference read 36 to 64 chunks/s on the same code.
    b.say(f"timing the embedder alone on {min(sample, len(texts))} of {len(texts)} chunks")
    before = embed_rates(texts, sample)
    b.start_streams()
    started = time.monotonic()
    for change in changes:
        b.send(KB_CHANGES, change.doc_id, encode(change))
    b.producer.flush()
    b.say(f"{len(changes)} KB events produced; indexing")
    # Read every second: ±1 s on a phase of minutes, and ten times fewer requests.
    kb_rate = b.rate(("kb_events", "stale_events"), len(changes), 3600, poll_s=1.0)
    kb_seconds = time.monotonic() - started
    split = kb_split(b.counters(), kb_seconds, len(b.streams_all))
    b.wait_committed(KB_CHANGES, 120)  # not timed: Faust commits every few seconds
    b.say(f"kb {kb_rate:.1f} ev/s in {kb_seconds:.0f} s; starting a worker")
    b.worker.start()
    b.worker.wait_healthy(300)
    latest = latest_docs(changes)
    asked = [q.question for q in questions if q.doc_id in latest][:hot]
    outcomes = measure_edits(b, Prompts(b.streams_url), latest, asked, edits)
    # Last: the synthetic prefixes would otherwise fill the hot set the edits rely on.
    query_rate = query_backlog_rate(b, queries)
    b.worker.stop()  # the embedder alone gets the machine to itself
    b.stop_streams()
    b.say("timing the embedder alone again")
    after = embed_rates(texts, sample)
    return {
        "streams_instances": len(b.streams_all),
        "query_events_per_s": round(query_rate, 1),
        "kb_events_per_s": round(kb_rate, 2),
        "kb_chunks_per_s": round(len(texts) / kb_seconds, 2),
        "embed_chunks_per_s": round(statistics.median(before + after), 2),
        "embed_chunks_per_s_before_after": [
            round(statistics.median(before), 2), round(statistics.median(after), 2)
        ],
        **split,
        **stage_figures(outcomes),
        "edits": outcomes,
    }


def query_backlog_rate(b: Bench, queries: int) -> float:
    """Query events per second the app takes from a backlog of `queries` (its counters).

    The backlog is produced while the app is stopped, then the app is started on it: this
    bench's own producer (about 5,500 records a second on an idle core, in Python) would
    otherwise share the machine with the app, and the app can take records no faster than
    they arrive, so the figure was the producer's. A gateway's producers run elsewhere.

    With N instances the first to join the group takes every partition until the others
    have joined (seconds, then a rebalance): the rate is timed from the moment every
    instance holds partitions, on a backlog of (N + 1) x `queries` so that most is left."""
    instances = len(b.streams_all)
    backlog = queries if instances == 1 else queries * (instances + 1)
    b.stop_streams()
    # Keyed by tenant as the client keys them; several tenants, so that with N instances
    # each takes its share (one tenant's windows live on one partition, one instance).
    for event in synthetic_queries(backlog, 500, seed=1, tenants=QUERY_TENANTS):
        b.send(RAG_QUERIES, event.tenant, encode(event))
    b.producer.flush()
    b.say(f"{backlog} query events produced; the app takes them from the backlog")
    b.start_streams()  # the counters start again at zero
    return b.rate(("queries",), backlog, 600, spread=instances > 1)


def summed(bodies: list[dict]) -> dict:
    """The counters of several `/ragwarm/stats` bodies, summed."""
    total: Counter = Counter()
    for body in bodies:
        total.update(body["counters"])
    return dict(total)


def spread_over(bodies: list[dict]) -> bool:
    """Whether every instance holds a share of the partitions and the shares add up to all
    of them (a rebalance under way leaves some instance at 0)."""
    shares = [body.get("owned_share", 0.0) for body in bodies]
    return all(share > 0 for share in shares) and abs(sum(shares) - 1.0) < 1e-6


def kb_split(counters: dict, kb_seconds: float, instances: int) -> dict[str, float | None]:
    """Where the KB phase's time went, in seconds summed over the instances: embedding,
    the rest of indexing (chunking, store reads and writes), publishing the replica records
    (until acknowledged), the rest of each batch
    (decoding, table writes, ops sent), and the time no batch ran (waiting, Faust); and
    the embedder's own rate inside the app (same chunks, same minutes as the pipeline)."""
    embed = counters.get("embed_ms", 0) / 1000
    embedded = counters.get("chunks_embedded", 0)
    index = counters.get("kb_index_ms", 0) / 1000
    batch = counters.get("kb_batch_ms", 0) / 1000
    publish = counters.get("replica_publish_ms", 0) / 1000
    return {
        "kb_seconds": round(kb_seconds, 1),
        "kb_embed_s": round(embed, 1),
        "kb_index_other_s": round(index - embed - publish, 1),
        "kb_publish_s": round(publish, 1),
        "kb_apply_s": round(batch - index, 1),
        "kb_outside_batches_s": round(instances * kb_seconds - batch, 1),
        "app_embed_chunks_per_s": round(embedded / embed, 2) if embed else None,
    }


def latest_docs(changes: list[KbChange]) -> dict[str, KbChange]:
    latest: dict[str, KbChange] = {}
    for change in changes:
        if change.op == "upsert":
            latest[change.doc_id] = change
        else:
            latest.pop(change.doc_id, None)
    return latest
