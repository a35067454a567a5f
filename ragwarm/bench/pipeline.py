"""`ragwarm bench pipeline`: the streams app's throughput and event-to-warm latency, for real.

Everything runs as in production: the local Kafka broker, `ragwarm streams` and
`ragwarm worker` as separate processes, in a topic namespace of their own.
"""

from __future__ import annotations

import json
import random
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import click
import httpx

from ragwarm.bench.stats import percentile
from ragwarm.settings import REPO_ROOT, HomeSettings, KafkaSettings, ModelSettings
from ragwarm.stack.procs import Proc
from schemas import ChunkRef, KbChange, QueryEvent, WarmupCommand, WorkerEvent, decode, encode
from schemas.topics import KB_CHANGES, RAG_QUERIES, WARMUP_COMMANDS, WORKER_EVENTS, prefixed

DATA = REPO_ROOT.parent / "shared" / "data" / "argocd"
# How long a prefix may take to be stored: a slow one is a figure (p99), not a failed run.
WARM_WAIT_S = 300.0


class Bench:
    """One namespace on the broker with a streams app and a worker in it."""

    def __init__(self, bootstrap: str, workdir: Path, say, streams: int = 1):
        from kafka import KafkaConsumer, KafkaProducer

        self.say = say
        self.prefix = f"bench-{uuid.uuid4().hex[:8]}."
        self.bootstrap = bootstrap
        env = {"RAGWARM_KAFKA_BOOTSTRAP": bootstrap, "RAGWARM_KAFKA_TOPIC_PREFIX": self.prefix}
        # N instances of one app (one consumer group), each with its port and disk.
        self.streams_all = [self._streams_proc(i, workdir, env) for i in range(streams)]
        self.streams = self.streams_all[0]
        self.streams_url = self.streams.health_url.removesuffix("/ragwarm/health")
        wport = _free_port()
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
        port = _free_port()
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

    def counters(self) -> dict:
        """The counters of every streams instance, summed."""
        total: Counter = Counter()
        for proc in self.streams_all:
            url = proc.health_url.removesuffix("/ragwarm/health")
            total.update(httpx.get(f"{url}/ragwarm/stats", timeout=10).json()["counters"])
        return dict(total)

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

    def command_at(self, op: str, after: float, prefix_hash: str | None = None) -> float | None:
        """When the app sent the first `op` command after `after` (for `prefix_hash`)."""
        times = [
            at
            for at, cmd in self.commands
            if at >= after and cmd.op == op and prefix_hash in (None, cmd.prefix_hash)
        ]
        return min(times, default=None)

    def wait_event(self, kind: str, prefix_hash: str, after: float, timeout_s: float) -> float:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.poll_events()
            for at, event in self.seen:
                if at >= after and event.kind == kind and event.prefix_hash == prefix_hash:
                    return at
        raise TimeoutError(f"no {kind} event for {prefix_hash[:12]} within {timeout_s} s")

    def holds(self, prefix_hash: str) -> bool:
        self.poll_events()
        return held(prefix_hash, (e for _, e in self.seen))

    def warm(self, event: QueryEvent, timeout_s: float) -> None:
        """Have the worker hold `event`'s prefix: unless it does, report the query answered
        (three times: hot) and wait until it stores it."""
        if self.holds(event.prefix_hash):
            return
        for _ in range(3):
            self.send(RAG_QUERIES, "default", encode(event))
        self.producer.flush()
        deadline = time.monotonic() + timeout_s
        while not self.holds(event.prefix_hash):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{event.prefix_hash[:12]} not warm within {timeout_s} s")
            time.sleep(0.1)

    def rate(self, keys: tuple[str, ...], total: int, timeout_s: float) -> float:
        """Events per second between the first and the last processed, from the app's counters."""
        first = last = None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            done = sum(self.counters().get(k, 0) for k in keys)
            now = time.monotonic()
            if done and first is None:
                first = (now, done)
            if done >= total:
                last = (now, done)
                break
            time.sleep(0.1)
        if first is None or last is None or last[0] <= first[0]:
            raise TimeoutError(f"only part of {total} events processed in {timeout_s} s")
        return (last[1] - first[1]) / (last[0] - first[0])

    def close(self) -> None:
        self.worker.stop()
        self.stop_streams()
        self.producer.close()
        self.events.close()


def held(prefix_hash: str, events: Iterable[WorkerEvent]) -> bool:
    """Whether the worker's last word on `prefix_hash` in `events` was that it stored it."""
    said = [e.kind for e in events if e.prefix_hash == prefix_hash
            and e.kind in ("stored", "evicted", "invalidated")]
    return bool(said) and said[-1] == "stored"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trace_changes(events: Path, limit: int | None) -> list[KbChange]:
    from rag.trace import read_events

    changes = [e.to_change() for e in read_events(events)]
    return changes[:limit] if limit else changes


def synthetic_queries(n: int, prefixes: int, seed: int) -> list[QueryEvent]:
    """Zipf-popular prefix hashes, as a busy gateway would log them."""
    rng = random.Random(seed)
    hashes = [uuid.UUID(int=rng.getrandbits(128)).hex for _ in range(prefixes)]
    weights = [1 / (i + 1) for i in range(prefixes)]
    picks = rng.choices(range(prefixes), weights, k=n)
    return [
        QueryEvent(
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


def edit_inside(text: str, chunk_text: str, n: int) -> str | None:
    """`text` with a sentence added to a line of `chunk_text` (so that chunk changes)."""
    return next(edits_inside(text, chunk_text, n), None)


def edits_inside(text: str, chunk_text: str, n: int):
    """Each way to add a sentence to a line of `chunk_text` in `text` (the first occurrence
    of the line, which may lie in another chunk: the caller checks which chunk changed)."""
    for line in chunk_text.splitlines():
        if len(line) > 30 and line in text:
            yield text.replace(line, f"{line} (Edit {n} for the pipeline benchmark.)", 1)


def warm_chunk_edit(
    prompts: Prompts, latest: dict[str, KbChange], held: list, rows: list[dict], n: int
) -> tuple[KbChange, ChunkRef] | None:
    """An edit that changes a chunk of the prefix the worker holds (`held`, its refs),
    checked by chunking the edited text as the app will; None when there is none."""
    texts = {(r["chunk_id"], r["content_hash"]): r["text"] for r in rows}
    for ref in held:
        doc_id = ref.chunk_id.rpartition("#")[0]
        chunk_text = texts.get((ref.chunk_id, ref.content_hash))
        if doc_id not in latest or chunk_text is None:
            continue
        for text in edits_inside(latest[doc_id].text or "", chunk_text, n):
            if prompts.chunk_hashes(doc_id, text).get(ref.chunk_id) != ref.content_hash:
                return KbChange(op="upsert", doc_id=doc_id, version=0, text=text), ref
    return None


def measure_event_to_warm(
    b: Bench, latest: dict[str, KbChange], questions: list[str], edits: int
) -> list[dict[str, float]]:
    """Per edit, ms from producing the KB change to each stage: `indexed` (the app's first
    invalidate command), `sent` (its prefill of the new prefix), `warm` (the worker's
    `stored` event)."""
    prompts = Prompts(b.streams_url)
    for question in questions:
        b.warm(prompts.query_event(question)[0], WARM_WAIT_S)
    b.say(f"{len(questions)} hot prefixes warm; applying {edits} edits")
    stages: list[dict[str, float]] = []
    version = max(c.version for c in latest.values()) + 1
    for n in range(edits):
        question = questions[n % len(questions)]
        # The prefix the question retrieves now, warm: an edit made for another question
        # may have replaced the one warmed for it (they share chunks). Edited from the
        # refs warmed before, the default run's edits 3 and 8 changed a chunk the
        # question no longer used: no re-warm, or no invalidation, ever came.
        event, rows = prompts.query_event(question)
        b.warm(event, WARM_WAIT_S)
        edit = warm_chunk_edit(prompts, latest, list(event.chunk_refs), rows, n)
        if edit is None:
            b.say(f"edit {n + 1}/{edits}: no line of its warm chunks to edit; skipped")
            continue
        change, stale = edit[0].model_copy(update={"version": version + n}), edit[1]
        t0 = time.time()
        b.send(KB_CHANGES, change.doc_id, encode(change))
        b.producer.flush()
        latest[change.doc_id] = change
        new_hash = _wait_new_prefix(b, prompts, question, stale, t0)
        warm_at = b.wait_event("stored", new_hash, t0, WARM_WAIT_S)
        stages.append(_stages(b, t0, new_hash, warm_at))
        b.say(f"edit {n + 1}/{edits}: {change.doc_id} warm again in {stages[-1]['warm']:.0f} ms")
    return stages


def _stages(b: Bench, t0: float, new_hash: str, warm_at: float) -> dict[str, float]:
    indexed = b.command_at("invalidate", t0) or warm_at
    sent = b.command_at("prefill", t0, new_hash) or warm_at
    return {k: (at - t0) * 1000 for k, at in (("indexed", indexed), ("sent", sent),
                                              ("warm", warm_at))}


def _wait_new_prefix(b: Bench, prompts: Prompts, question: str, stale, t0: float) -> str:
    """The prefix hash the question retrieves once the app has indexed the edit (it sends
    the invalidation of the `stale` chunk ref after indexing it)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        b.poll_events()
        if any(at >= t0 and stale in cmd.chunk_refs for at, cmd in b.commands):
            return prompts.query_event(question)[0].prefix_hash
        time.sleep(0.05)
    raise TimeoutError(f"the app sent no invalidation of {stale.chunk_id} within 60 s")


@click.command()
@click.option(
    "--events",
    type=click.Path(exists=True, path_type=Path),
    default=DATA / "events.jsonl",
    show_default=True,
    help="Trace events (JSONL).",
)
@click.option(
    "--questions",
    type=click.Path(exists=True, path_type=Path),
    default=DATA / "questions.jsonl",
    show_default=True,
    help="Trace questions.",
)
@click.option("--kb-events", type=int, default=None, help="Use the first N trace events.")
@click.option("--queries", type=int, default=20_000, show_default=True)
@click.option("--hot", type=int, default=4, show_default=True, help="Hot questions to warm.")
@click.option("--edits", type=int, default=12, show_default=True)
@click.option(
    "--embed-sample", type=int, default=512, show_default=True,
    help="Chunks the embedder is timed on alone (a sample of those the trace embeds).",
)
@click.option(
    "--streams", "streams_n", type=click.IntRange(1, 8), default=1, show_default=True,
    help="Streams instances (one consumer group, each its own port and disk).",
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
    as_json: bool,
) -> None:
    """Token-frequency and KB-change throughput, and KB-event-to-warm latency."""
    from rag.trace import read_questions
    from ragwarm.kafka.admin import create_topics
    from ragwarm.kafka.local import LocalKafka

    say = (lambda m: click.echo(m, err=True)) if as_json else click.echo
    kafka = KafkaSettings()
    with LocalKafka(HomeSettings(), kafka) as bootstrap, tempfile.TemporaryDirectory() as tmp:
        b = Bench(bootstrap, Path(tmp), say, streams_n)
        create_topics(bootstrap, kafka.client_options(), prefixed(b.prefix))
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
            click.echo(f"{key:<28}{'-' if value is None else f'{value:.1f}':>12}")


def run(b: Bench, events: Path, questions, kb_events, queries, hot, edits, sample) -> dict:
    from ragwarm.bench.embed_rate import embed_rate, embedded_chunks

    b.start_streams()
    changes = trace_changes(events, kb_events)
    started = time.monotonic()
    for change in changes:
        b.send(KB_CHANGES, change.doc_id, encode(change))
    b.producer.flush()
    b.say(f"{len(changes)} KB events produced; indexing")
    kb_rate = b.rate(("kb_events", "stale_events"), len(changes), 3600)
    kb_seconds = time.monotonic() - started
    split = kb_split(b.counters(), kb_seconds, len(b.streams_all))
    b.say(f"kb {kb_rate:.1f} ev/s in {kb_seconds:.0f} s; starting a worker")
    b.worker.start()
    b.worker.wait_healthy(300)
    latest = latest_docs(changes)
    asked = [q.question for q in questions if q.doc_id in latest][:hot]
    stages = measure_event_to_warm(b, latest, asked, edits)
    # Last: the synthetic prefixes would otherwise fill the hot set the edits rely on.
    start = b.counters().get("queries", 0)
    for event in synthetic_queries(queries, 500, seed=1):
        b.send(RAG_QUERIES, "synthetic", encode(event.model_copy(update={"tenant": "synthetic"})))
    b.producer.flush()
    query_rate = b.rate(("queries",), start + queries, 600)
    b.worker.stop()  # the embedder alone gets the machine to itself
    b.stop_streams()
    texts = embedded_chunks(changes)
    b.say(f"timing the embedder alone on {min(sample, len(texts))} of {len(texts)} chunks")
    return {
        "streams_instances": len(b.streams_all),
        "query_events_per_s": round(query_rate, 1),
        "kb_events_per_s": round(kb_rate, 2),
        "kb_chunks_per_s": round(len(texts) / kb_seconds, 2),
        "embed_chunks_per_s": round(embed_rate(texts, sample), 2),
        **split,
        **stage_figures(stages),
    }


def kb_split(counters: dict, kb_seconds: float, instances: int) -> dict[str, float | None]:
    """Where the KB phase's time went, in seconds summed over the instances: embedding,
    the rest of indexing (chunking, store reads and writes), the rest of each batch
    (decoding, table writes, ops sent), and the time no batch ran (waiting, Faust); and
    the embedder's own rate inside the app (same chunks, same minutes as the pipeline)."""
    embed = counters.get("embed_ms", 0) / 1000
    embedded = counters.get("embedded_chunks", 0)
    index = counters.get("kb_index_ms", 0) / 1000
    batch = counters.get("kb_batch_ms", 0) / 1000
    return {
        "kb_seconds": round(kb_seconds, 1),
        "kb_embed_s": round(embed, 1),
        "kb_index_other_s": round(index - embed, 1),
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


def stage_figures(stages: list[dict[str, float]]) -> dict[str, float | None]:
    """p50 and p99 of each stage of event-to-warm (None when no edit was measured)."""
    names = {"indexed": "event_to_indexed", "sent": "event_to_commands", "warm": "event_to_warm"}
    out: dict[str, float | None] = {}
    for key, name in names.items():
        values = [s[key] for s in stages]
        for q in (50, 99):
            out[f"{name}_ms_p{q}"] = round(percentile(values, q), 1) if values else None
    return out
