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
from pathlib import Path

import click
import httpx

from ragwarm.bench.stats import percentile
from ragwarm.settings import REPO_ROOT, HomeSettings, KafkaSettings, ModelSettings
from ragwarm.stack.procs import Proc
from schemas import KbChange, QueryEvent, WorkerEvent, decode, encode
from schemas.topics import KB_CHANGES, RAG_QUERIES, WORKER_EVENTS, prefixed

DATA = REPO_ROOT.parent / "shared" / "data" / "argocd"


class Bench:
    """One namespace on the broker with a streams app and a worker in it."""

    def __init__(self, bootstrap: str, workdir: Path, say):
        from kafka import KafkaConsumer, KafkaProducer

        self.say = say
        self.prefix = f"bench-{uuid.uuid4().hex[:8]}."
        self.bootstrap = bootstrap
        env = {"RAGWARM_KAFKA_BOOTSTRAP": bootstrap, "RAGWARM_KAFKA_TOPIC_PREFIX": self.prefix}
        port, wport = _free_port(), _free_port()
        self.streams_url = f"http://127.0.0.1:{port}"
        self.worker_url = f"http://127.0.0.1:{wport}"
        self.streams = Proc(
            "bench-streams",
            ["streams", "--loglevel", "warning"],
            workdir,
            f"{self.streams_url}/ragwarm/health",
            env
            | {
                "RAGWARM_STREAMS_APP_ID": self.prefix + "app",
                "RAGWARM_STREAMS_WEB_PORT": str(port),
                "RAGWARM_STREAMS_HOT_TICK_S": "0.5",
                "RAGWARM_QDRANT_PATH": str(workdir / "qdrant"),
                "RAGWARM_STREAMS_DATA_DIR": str(workdir / "faust"),
            },
        )
        self.worker = Proc(
            "bench-worker",
            ["worker", "--worker-id", "bench-w1", "--port", str(wport)],
            workdir,
            f"{self.worker_url}/health/ready",
            env | {"RAGWARM_WORKER_HEARTBEAT_S": "1", "RAGWARM_WORKER_CACHE_REQUESTS": "false"},
        )
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
        self.events = KafkaConsumer(
            self.prefix + WORKER_EVENTS,
            bootstrap_servers=bootstrap,
            auto_offset_reset="earliest",
            consumer_timeout_ms=100,
        )
        self.seen: list[tuple[float, WorkerEvent]] = []

    def counters(self) -> dict:
        return httpx.get(f"{self.streams_url}/ragwarm/stats", timeout=10).json()["counters"]

    def send(self, topic: str, key: str, value: bytes) -> None:
        self.producer.send(self.prefix + topic, key=key.encode(), value=value)

    def poll_events(self) -> None:
        for message in self.events:
            self.seen.append((time.time(), decode(message.value, WorkerEvent)))

    def wait_event(self, kind: str, prefix_hash: str, after: float, timeout_s: float) -> float:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.poll_events()
            for at, event in self.seen:
                if at >= after and event.kind == kind and event.prefix_hash == prefix_hash:
                    return at
        raise TimeoutError(f"no {kind} event for {prefix_hash[:12]} within {timeout_s} s")

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
        self.streams.stop()
        self.producer.close()
        self.events.close()


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
        self.builder = PromptBuilder(load_tokenizer(llm_dir()), RagSettings().system_prompt)
        self.model = ModelSettings().llm_name

    def query_event(self, question: str) -> tuple[QueryEvent, list[dict]]:
        from types import SimpleNamespace

        from schemas.prefix import prefix_chain

        rows = httpx.post(
            f"{self.url}/ragwarm/retrieve", json={"question": question}, timeout=60
        ).json()["chunks"]
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


def edit_inside(text: str, chunk_text: str, n: int) -> str | None:
    """`text` with a sentence added to a line of `chunk_text` (so that chunk changes)."""
    for line in chunk_text.splitlines():
        if len(line) > 30 and line in text:
            return text.replace(line, f"{line} (Edit {n} for the pipeline benchmark.)", 1)
    return None


def measure_event_to_warm(
    b: Bench, latest: dict[str, KbChange], questions: list[str], edits: int
) -> list[float]:
    prompts = Prompts(b.streams_url)
    warm: list[tuple[str, QueryEvent]] = []
    for question in questions:
        event, _ = prompts.query_event(question)
        for _ in range(3):
            b.send(RAG_QUERIES, "default", encode(event))
        b.producer.flush()
        b.wait_event("stored", event.prefix_hash, 0.0, 120)
        warm.append((question, event))
    b.say(f"{len(warm)} hot prefixes warm; applying {edits} edits")
    latencies: list[float] = []
    version = max(c.version for c in latest.values()) + 1
    for n in range(edits):
        question, _ = warm[n % len(warm)]
        _, rows = prompts.query_event(question)
        row = next((r for r in rows if r["doc_id"] in latest), None)
        text = row and edit_inside(latest[row["doc_id"]].text or "", row["text"], n)
        if not text:
            continue
        change = KbChange(op="upsert", doc_id=row["doc_id"], version=version + n, text=text)
        t0 = time.time()
        b.send(KB_CHANGES, change.doc_id, encode(change))
        b.producer.flush()
        latest[change.doc_id] = change
        new_hash = _wait_new_prefix(b, prompts, question, t0)
        latencies.append((b.wait_event("stored", new_hash, t0, 60) - t0) * 1000)
        b.say(f"edit {n + 1}/{edits}: {change.doc_id} warm again in {latencies[-1]:.0f} ms")
    return latencies


def _wait_new_prefix(b: Bench, prompts: Prompts, question: str, t0: float) -> str:
    """The prefix hash the question retrieves once the edit is indexed."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        b.poll_events()
        if any(e.kind == "invalidated" and at >= t0 for at, e in b.seen):
            return prompts.query_event(question)[0].prefix_hash
        time.sleep(0.05)
    raise TimeoutError("the edit invalidated nothing within 60 s")


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
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def pipeline(
    events: Path,
    questions: Path,
    kb_events: int | None,
    queries: int,
    hot: int,
    edits: int,
    as_json: bool,
) -> None:
    """Token-frequency and KB-change throughput, and KB-event-to-warm latency."""
    from rag.trace import read_questions
    from ragwarm.kafka.admin import create_topics
    from ragwarm.kafka.local import LocalKafka

    say = (lambda m: click.echo(m, err=True)) if as_json else click.echo
    kafka = KafkaSettings()
    with LocalKafka(HomeSettings(), kafka) as bootstrap, tempfile.TemporaryDirectory() as tmp:
        b = Bench(bootstrap, Path(tmp), say)
        create_topics(bootstrap, kafka.client_options(), prefixed(b.prefix))
        try:
            result = run(b, events, read_questions(questions), kb_events, queries, hot, edits)
        finally:
            b.close()
    if as_json:
        click.echo(json.dumps(result))
    else:
        for key, value in result.items():
            click.echo(f"{key:<24}{value:>12.1f}")


def run(b: Bench, events: Path, questions, kb_events, queries, hot, edits) -> dict:
    b.streams.start()
    b.streams.wait_healthy(300)
    changes = trace_changes(events, kb_events)
    for change in changes:
        b.send(KB_CHANGES, change.doc_id, encode(change))
    b.producer.flush()
    b.say(f"{len(changes)} KB events produced; indexing")
    kb_rate = b.rate(("kb_events", "stale_events"), len(changes), 3600)
    b.say(f"kb {kb_rate:.1f} ev/s; starting a worker")
    b.worker.start()
    b.worker.wait_healthy(300)
    latest: dict[str, KbChange] = {}
    for change in changes:
        if change.op == "upsert":
            latest[change.doc_id] = change
        else:
            latest.pop(change.doc_id, None)
    asked = [q.question for q in questions if q.doc_id in latest][:hot]
    latencies = measure_event_to_warm(b, latest, asked, edits)
    # Last: the synthetic prefixes would otherwise fill the hot set the edits rely on.
    start = b.counters().get("queries", 0)
    for event in synthetic_queries(queries, 500, seed=1):
        b.send(RAG_QUERIES, "synthetic", encode(event.model_copy(update={"tenant": "synthetic"})))
    b.producer.flush()
    query_rate = b.rate(("queries",), start + queries, 600)
    return {
        "query_events_per_s": round(query_rate, 1),
        "kb_events_per_s": round(kb_rate, 2),
        "event_to_warm_ms_p50": round(percentile(latencies, 50), 1),
        "event_to_warm_ms_p99": round(percentile(latencies, 99), 1),
    }
