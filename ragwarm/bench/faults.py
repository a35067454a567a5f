"""`ragwarm bench faults`: replay a trace's edits with a query load while the stack is broken
on purpose, then compare what it ends with to an oracle computed from the trace alone.

Faults, at seeded random points of the replay: SIGKILL of the streams app N times (each
restarted; one restart on an empty disk, the moved host), SIGKILL of one worker (restarted
with the same id), one stop/start of the benchmark's own broker (data kept), and the streams
app's index unwritable for 10 s (its SQLite write lock held by the benchmark).
"""

from __future__ import annotations

import contextlib
import json
import random
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import httpx

from ragwarm.bench import faults_plan as plan
from ragwarm.bench.faults_stack import FaultStack, Rewarm, Say, own_broker
from ragwarm.settings import TRACE_DIR
from schemas.topics import split_kb_key

START_S = 600.0  # each start or recovery may take this long on a loaded 2-core machine


@dataclass
class QueryLoad:
    """Asks questions one at a time in a thread (Zipf popularity, seeded) until stopped or
    `limit` were answered; records each answered one and counts the failed ones."""

    stack: FaultStack
    client: Any
    questions: list[str]
    limit: int
    gap_s: float
    seed: int
    say: Say = print
    asked: list[plan.Asked] = field(default_factory=list)
    errors: int = 0
    failed_at: list[float] = field(default_factory=list)  # when each failed query gave up
    table: dict[str, int] = field(default_factory=dict)  # the docs table last read
    reasons: set[str] = field(default_factory=set)
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, daemon=True)
        thread.start()
        return thread

    @property
    def count(self) -> int:
        return len(self.asked) + self.errors

    def _run(self) -> None:
        rng = random.Random(self.seed)
        weights = [1 / (i + 1) for i in range(len(self.questions))]
        # Failures do not spend the budget: the load then lasts through the app's downtimes.
        while not self.stop.is_set() and len(self.asked) < self.limit:
            question = rng.choices(self.questions, weights)[0]
            try:
                self.asked.append(self._ask(question))
            except Exception as exc:  # noqa: BLE001 - a failed query is a figure of the bench
                self.errors += 1
                self.failed_at.append(time.monotonic())
                reason = type(exc).__name__
                if reason not in self.reasons:  # each kind of failure once, with its text
                    self.reasons.add(reason)
                    self.say(f"  query failed ({reason}: {str(exc)[:200]})")
                self.stop.wait(5.0)  # the app or a worker is down: do not spend the budget
            self.stop.wait(self.gap_s)

    def _ask(self, question: str) -> plan.Asked:
        try:
            self.table = table_versions(self.stack)
        except httpx.HTTPError:
            # The app is down: it confirms no new version meanwhile, so the table it last
            # showed is still the one a stale answer is judged by; the query goes on.
            pass
        table = dict(self.table)
        started = time.perf_counter()
        prepared = self.client.prepare(question)
        answer = self.client.ask(prepared, max_tokens=1, started=started)
        versions = tuple((c.doc_id, c.version) for c in prepared.chunks)
        return plan.Asked(versions, table, answer.cached_tokens, time.monotonic(),
                          answer.e2e_ttft_ms)


def table_versions(stack: FaultStack) -> dict[str, int]:
    """The versions the app's docs table holds (the default tenant's documents), over its
    instances: each holds its partitions, and may hold a standby copy of others (the
    newest version wins)."""
    out: dict[str, int] = {}
    for view in stack.get_all("/ragwarm/docs"):
        for key, state in view["docs"].items():
            tenant, doc_id = split_kb_key(key)
            if state and tenant == "default":
                out[doc_id] = max(out.get(doc_id, 0), int(state["version"]))
    return out


@dataclass
class Replay:
    """Sends the edits one by one and injects each planned fault after its edit."""

    stack: FaultStack
    producer: Any
    faults: list[plan.Fault]
    edit_gap_s: float
    say: Say
    done: list[str] = field(default_factory=list)
    rewarm: Rewarm | None = None
    pending: deque = field(default_factory=deque)
    outages: list[plan.Outage] = field(default_factory=list)

    def run(self, edits: list) -> None:
        self.pending.extend(enumerate(edits))
        while self.pending:
            n, _ = self.send_next()
            self.inject_after(n)
            time.sleep(self.edit_gap_s)

    def inject_after(self, n: int) -> None:
        for fault in [f for f in self.faults if f.after_edit == n]:
            self.inject(fault.kind)

    def send_next(self) -> tuple[int, Any]:
        n, event = self.pending.popleft()
        self.producer.send(event.to_change()).get(timeout=120)
        return n, event

    def inject(self, kind: str) -> None:
        self.say(f"fault: {kind} after {len(self.done)} faults")
        actions: dict[str, Callable[[], None]] = {
            plan.STREAMS_KILL: lambda: self._streams(False),
            plan.HOST_MOVE: lambda: self._streams(True),
            plan.WORKER_KILL: self._worker,
            plan.BROKER_RESTART: self.stack.restart_broker,
            plan.STORE_OUTAGE: self._outage,
        }
        start = time.monotonic()
        actions[kind]()
        self.outages.append(plan.Outage(kind, start, time.monotonic()))
        self.done.append(kind)

    def _streams(self, move: bool) -> None:
        name, took = self.stack.kill_streams(START_S, move_host=move)
        self.say(f"  {name} {'moved and ' if move else ''}ready again {took:.1f} s "
                 "after the SIGKILL")

    def _worker(self) -> None:
        caches = {w.name: self.stack.worker_cache(w) for w in self.stack.workers}
        worker = max(self.stack.workers, key=lambda w: len(caches[w.name]))
        held = {e["prefix_hash"] for e in caches[worker.name]}
        self.say(f"  killing {worker.name}, which holds {len(held)} prefixes")
        self.rewarm = Rewarm(self.stack, worker, held, START_S)
        self.stack.kill_worker(worker, START_S)

    def _outage(self) -> None:
        sent: list[int] = []

        def during() -> None:  # an edit arrives while the index cannot be written
            if self.pending:
                sent.append(self.send_next()[0])

        self.stack.store_outage(during)
        for n in sent:  # the faults planned after that edit come once the store is back
            self.inject_after(n)


# --- the end: settle and compare with the oracle -----------------------------------------------
def settle(stack: FaultStack, expected: dict[str, plan.Expected], say: Say) -> None:
    """Wait until the app's docs table holds every final version (or give up after START_S)."""
    want = {d: e.version for d, e in expected.items()}
    started = time.monotonic()
    told = started
    while time.monotonic() < started + START_S:
        try:
            got = table_versions(stack)
        except httpx.HTTPError:
            got = {}
        behind = [d for d, v in want.items() if got.get(d) != v]
        if not behind:
            return
        if time.monotonic() - told > 30:
            told = time.monotonic()
            say(f"  {len(want) - len(behind)} of {len(want)} final versions applied "
                f"after {told - started:.0f} s")
        time.sleep(2.0)
    say(f"the docs table still lacks {len(behind)} final versions, e.g. {behind[:3]}")


def read_index(qdrant_dir: Path) -> dict[str, plan.IndexedDoc]:
    """Every document record and its chunks in the app's local index (the app stopped)."""
    from rag.settings import QdrantSettings, RagSettings
    from rag.store import ChunkStore, open_client

    settings = QdrantSettings(path=qdrant_dir)
    collection = RagSettings().collection
    probe = open_client(settings)
    dim = probe.get_collection(collection).config.params.vectors.size  # type: ignore[union-attr]
    probe.close()
    out = {}
    with ChunkStore.open(settings, collection, dim) as store:
        for record in store.doc_records("default"):
            chunks = {s.chunk.chunk_id: s.chunk.content_hash
                      for s in store.current_chunks(record.doc_id)}
            out[record.doc_id] = plan.IndexedDoc(record.version, record.deleted, chunks)
    return out


def transient_letters(stack: FaultStack) -> int:
    from ragwarm.kafka.deadletter import read_letters, select
    from schemas.topics import DEADLETTER

    letters = list(read_letters(stack.kafka.servers, stack.kafka.client_options(), DEADLETTER))
    return len(select(letters, "transient"))


def finish(stack: FaultStack, expected: dict[str, plan.Expected], chunker: plan.Chunker,
           grace_s: float, say: Say) -> dict[str, Any]:
    """Settle, let in-flight invalidations land for `grace_s`, then count what the workers
    still hold of old chunks, stop the app and read its index."""
    say("replay done; waiting for the app to apply every final version")
    settle(stack, expected, say)
    stack.wait_commands_applied()
    time.sleep(grace_s)
    current = plan.current_chunks(expected, chunker)
    held = [e for w in stack.workers for e in stack.worker_cache(w)]
    lost = plan.lost_invalidations(held, current)
    letters = transient_letters(stack)
    for worker in stack.workers:
        worker.stop()
    for instance in stack.instances:
        instance.stop()
    index = read_index(stack.qdrant_dir)
    return {
        "kb_versions_expected": len(expected),
        "kb_versions_indexed": plan.versions_indexed(expected, index, chunker),
        "lost_invalidations": lost,
        "transient_dead_letters": letters,
    }


def warm_up(stack: FaultStack, client: Any, questions: list[str], say: Say) -> None:
    """Ask the most popular questions once and wait until a worker holds their prefixes, so
    that the worker killed later has tracked prefixes to get back."""
    prefixes = set()
    for question in questions:
        prepared = client.prepare(question)
        client.ask(prepared, max_tokens=1)
        prefixes.add(prepared.prefix_hash)
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        held = {e["prefix_hash"] for w in stack.workers for e in stack.worker_cache(w)}
        if prefixes <= held:
            break
        time.sleep(1.0)
    say(f"warm-up: {len(prefixes & held)} of {len(prefixes)} asked prefixes held by a worker")


def chunker_of(client: Any) -> plan.Chunker:
    """Chunk ids and hashes of a text exactly as the app's indexer makes them (memoized)."""
    from rag.chunking import chunk_document
    from rag.settings import RagSettings

    rag, tokenizer, memo = RagSettings(), client.prompts.tokenizer, {}

    def chunk(doc_id: str, text: str) -> dict[str, str]:
        if (doc_id, text) not in memo:
            chunks = chunk_document(doc_id, text, tokenizer, rag.chunk_tokens, rag.chunk_overlap)
            memo[doc_id, text] = {c.chunk_id: c.content_hash for c in chunks}
        return memo[doc_id, text]

    return chunk


@dataclass(frozen=True)
class Options:
    kills: int
    seed: int
    docs: int
    edits: int
    hot: int
    queries: int
    query_gap_s: float
    edit_gap_s: float
    grace_s: float
    via: str = "gateway"


def run(stack: FaultStack, sliced: plan.Slice, o: Options, say: Say) -> dict[str, Any]:
    from ragwarm.client.producer import KbProducer
    from schemas.topics import KB_CHANGES

    faults = plan.plan_faults(len(sliced.edits), o.kills, o.seed)
    stack.start(START_S)
    kafka = stack.kafka
    with KbProducer(kafka.servers, kafka.producer_options(), KB_CHANGES) as producer:
        for event in sliced.initial:
            producer.send(event.to_change())
        producer.flush()
        say(f"{len(sliced.initial)} initial documents sent; indexing")
        initial = plan.oracle(sliced.initial)
        settle(stack, initial, say)
        client = open_load_client(o.via, stack, say)
        asked = [q.question for q in sliced.questions]
        warm_up(stack, client, asked[:o.hot], say)
        load = QueryLoad(stack, client, asked, o.queries, o.query_gap_s, o.seed, say)
        thread = load.start()
        say(f"replaying {len(sliced.edits)} edits with {len(faults)} faults: "
            + ", ".join(f"{f.kind}@{f.after_edit}" for f in faults))
        replay = Replay(stack, producer, faults, o.edit_gap_s, say)
        replay.run(sliced.edits)
        load.stop.set()
        thread.join(300)
        if replay.rewarm is not None:
            replay.rewarm.join(START_S)
        expected = plan.oracle([*sliced.initial, *sliced.edits])
        end = finish(stack, expected, chunker_of(client), o.grace_s, say)
        client.close()
    hits = sum(a.cached_tokens > 0 for a in load.asked)
    say(f"{len(load.asked)} queries answered, {hits} of them with cached KV")
    rewarm = replay.rewarm
    if rewarm is not None and rewarm.seconds is None:
        say(f"the killed worker lacks {len(rewarm.missing)} of {len(rewarm.held)} prefixes")
    return {
        "planned": faults,
        "faults": plan.fault_counts(replay.done),
        "worker_disk_tier": stack.disk_tier,
        "streams_instances": len(stack.instances),
        **end,
        "stale_served": sum(plan.stale(a) for a in load.asked),
        "queries": load.count,
        "query_errors": load.errors,
        "worker_rewarm_s": None if rewarm is None or rewarm.seconds is None
        else round(rewarm.seconds, 1),
        "worker_restart_phases_s": plan.phase_figures(stack.worker_phases),
        **plan.recovery_figures(stack.recoveries),
        "streams_recovery_phases_s_p50": plan.phase_figures(stack.recovery_phases),
        "streams_recovery_log_s_p50": plan.mark_figures(stack.recovery_marks),
        **plan.outage_figures(replay.outages, load.asked, load.failed_at),
    }


def open_load_client(via: str, stack: FaultStack, say: Say) -> Any:
    """The query load's client: `gateway`, the gateway's query path (its own worker view and
    index replica: it answers while the streams app is down), or `client`, `RagClient`
    (retrieval and routing through the streams app)."""
    from ragwarm.client.independent import OwnPath
    from ragwarm.client.rag import RagClient
    from ragwarm.client.settings import ClientSettings
    from ragwarm.client.view import ViewRules

    settings = ClientSettings(streams_url=stack.streams_url, max_tokens=1, emit_queries=True,
                              max_attempts=2)
    if via == "client":
        return RagClient.open(settings, kafka=stack.kafka)
    from ragwarm.client.standalone import StandaloneClient

    client = StandaloneClient.open(settings, stack.kafka, OwnPath("replica", ViewRules(None)))
    if not client.wait_replica(START_S):
        client.close()
        raise RuntimeError(f"the gateway's index replica did not catch up in {START_S:.0f} s")
    say("query load through the gateway's path: its index replica caught up")
    return client


def _workdir(path: Path | None) -> Any:
    if path is None:
        return tempfile.TemporaryDirectory(prefix="ragwarm-faults-")
    if path.exists() and any(path.iterdir()):
        raise click.ClickException(f"--workdir {path} is not empty: a run needs a fresh folder")
    path.mkdir(parents=True, exist_ok=True)
    return contextlib.nullcontext(str(path))


def quiet_logs() -> None:
    """Progress lines only: the clients' per-request and per-connection INFO lines would
    bury them (hundreds per fault)."""
    import logging

    from ragwarm.client.rag import quiet_http_logs

    quiet_http_logs()
    # The broker restart is on purpose: its consumers' and producers' reconnect errors (a
    # line a second each) would bury the progress lines; they retry until it is back.
    logging.getLogger("kafka").setLevel(logging.CRITICAL)


ORDER = ("faults", "worker_disk_tier", "streams_instances", "kb_versions_expected",
         "kb_versions_indexed",
         "lost_invalidations", "stale_served", "queries", "query_errors",
         "transient_dead_letters", "worker_rewarm_s", "worker_restart_phases_s",
         "streams_recovery_s_p50", "streams_recovery_s_max", "streams_recovery_phases_s_p50",
         "streams_recovery_log_s_p50",
         "ttft_p50_ms", "answered_during_outage",
         "errors_during_outage", "outage_ttft_p50_ms", "outages")


@click.command()
@click.option("--events", type=click.Path(exists=True, path_type=Path),
              default=TRACE_DIR / "events.jsonl", show_default=True, help="Trace events (JSONL).")
@click.option("--questions", type=click.Path(exists=True, path_type=Path),
              default=TRACE_DIR / "questions.jsonl", show_default=True, help="Trace questions.")
@click.option("--kills", type=int, default=5, show_default=True,
              help="SIGKILLs of the streams app (one restarts on an empty disk).")
@click.option("--seed", type=int, default=1, show_default=True, help="Where faults fall.")
@click.option("--docs", type=int, default=40, show_default=True,
              help="Documents of the initial state (those answering questions first; 0: all).")
@click.option("--edits", type=int, default=30, show_default=True,
              help="Edits of those documents replayed, in trace order.")
@click.option("--hot", type=int, default=4, show_default=True,
              help="Most popular questions asked and warmed before the replay.")
@click.option("--queries", type=int, default=60, show_default=True,
              help="Most queries answered during the replay (one at a time; failed ones "
              "are counted apart).")
@click.option("--query-gap-s", type=float, default=2.0, show_default=True)
@click.option("--edit-gap-s", type=float, default=2.0, show_default=True)
@click.option("--grace-s", type=float, default=30.0, show_default=True,
              help="Wait after the final versions are in before counting what workers hold.")
@click.option("--via", type=click.Choice(["gateway", "client"]), default="gateway",
              show_default=True,
              help="The query load's path: the gateway's (its own worker view and index "
              "replica) or RagClient's (retrieval and routing through the streams app).")
@click.option("--worker-disk-tier/--no-worker-disk-tier", default=True, show_default=True,
              help="Run the workers with the disk KV tier (RAGWARM_WORKER_DISK_TIER), each "
              "on its own folder, as a deployment that restarts workers would: the killed "
              "worker reads back what it held before it reports ready. Off: it waits for "
              "the streams app's re-warm.")
@click.option("--streams", "n_streams", type=click.IntRange(1, 4), default=1,
              show_default=True,
              help="Streams instances (one consumer group, standby replicas of each other's "
              "tables); the SIGKILLs go round them.")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Keep the processes' logs, stores and KV tiers here (default: a temporary "
              "folder, removed).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def faults(events: Path, questions: Path, kills: int, seed: int, docs: int, edits: int,
           hot: int, queries: int, query_gap_s: float, edit_gap_s: float, grace_s: float,
           via: str, worker_disk_tier: bool, n_streams: int, workdir: Path | None,
           as_json: bool) -> None:
    """Replay edits under faults (kills, broker restart, store outage, moved host) and
    compare the end state with the trace's oracle. Defaults are a quick scale for a small
    machine: --docs 0 with --edits at least the trace's edit count replays all of it."""
    from ragwarm.models import llm_dir
    from ragwarm.trace import read_events, read_questions
    from schemas import MAX_TEXT_BYTES

    def say(text: str) -> None:
        click.echo(f"[{time.strftime('%H:%M:%S')}] {text}", err=True)

    quiet_logs()

    o = Options(kills, seed, docs, edits, hot, queries, query_gap_s, edit_gap_s, grace_s, via)
    sliced = plan.pick_slice(list(read_events(events)), read_questions(questions), docs,
                             edits, MAX_TEXT_BYTES)
    if not sliced.edits:
        raise click.ClickException("the slice has no edits to replay; raise --docs or --edits")
    with _workdir(workdir) as tmp:
        stack = FaultStack(own_broker(Path(tmp), say), Path(tmp), llm_dir(), say,
                           disk_tier=worker_disk_tier, streams=n_streams)
        try:
            result = run(stack, sliced, o, say)
        finally:
            stack.stop()
    planned = result.pop("planned")
    result = {k: result[k] for k in ORDER}
    failing = plan.passed(result, planned)
    if as_json:
        click.echo(json.dumps(result))
    else:
        for key, value in result.items():
            click.echo(f"{key:<26}{value}")
    say("all checks hold" if not failing else "FAILED: " + "; ".join(failing))
    if failing:
        raise SystemExit(1)
