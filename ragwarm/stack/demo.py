"""`ragwarm demo`: the whole story on a real KB trace — cold, warm, real edits, re-warmed."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import statistics
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click
import httpx
from pydantic import SecretStr

from ragwarm.settings import TRACE_DIR, HomeSettings, KafkaSettings
from ragwarm.stack.demo_plan import (
    DemoPlan,
    Row,
    Summary,
    changed_chunks,
    held,
    plan_demo,
    rewarm_targets,
    rewarm_verdict,
    summarize,
    table_lines,
    write_chart,
)
from ragwarm.stack.procs import Proc, operator_headers
from ragwarm.trace import TraceError, TraceEvent, read_events, read_questions

COLD_ASKS = 2  # asks that make a question hot (the streams app's hot_min_count)
# A pause before each measured ask, so that neither worker's request runs while the stack
# still handles the one before it (the client's query event, the streams app's reaction):
# on a 2-core host that work can take the cores of whichever request comes next.
SETTLE_S = 0.5
Say = Callable[[str], None]


# --- the stack, in its own namespace ----------------------------------------------------------
@dataclass
class DemoStack:
    """The local stack of `ragwarm up` in a fresh topic namespace, app id and Qdrant path, so
    every run starts from an empty KB and leaves no state behind; beside it, a worker with
    plain prefix caching that the pipeline does not touch (the baseline)."""

    say: Say
    keep_up: bool = False
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    def __post_init__(self) -> None:
        from ragwarm.settings import SecuritySettings
        from ragwarm.stack.local import Stack, stack_keys

        self.prefix = f"demo.{self.run_id}."
        self.workdir = HomeSettings().home / "demo" / self.run_id
        base = KafkaSettings()
        self.kafka = base.model_copy(update={"topic_prefix": self.prefix})
        # The stack's keys (made on first use, as `ragwarm up` does) unless RAGWARM_INSECURE.
        insecure, home = SecuritySettings().insecure, HomeSettings()
        self.stack = Stack(home, kafka=self.kafka, keys=stack_keys(home, insecure),
                           insecure=insecure)
        extra = {"RAGWARM_KAFKA_TOPIC_PREFIX": self.prefix}
        for proc in self.stack.workers:
            # The product default: warmup on top of the worker's own request caching. Before
            # the edits both workers hit on a repeat; after them the new prompts were never
            # asked, so a hit on ragwarm's worker is the pipeline's re-prefill.
            proc.env = {**proc.env, **extra, "RAGWARM_WORKER_CACHE_REQUESTS": "true"}
        self.stack.streams.env = {
            **self.stack.streams.env, **extra,
            "RAGWARM_STREAMS_APP_ID": self.prefix + "ragwarm-streams",
            "RAGWARM_QDRANT_PATH": str(self.workdir / "qdrant"),
            "RAGWARM_STREAMS_DATA_DIR": str(self.workdir / "faust"),
            # Re-plan the hot set every second so the demo does not wait on the 5 s default.
            "RAGWARM_STREAMS_HOT_TICK_S": "1.0",
            "RAGWARM_STREAMS_HOT_MIN_COUNT": str(COLD_ASKS),
        }
        self.baseline = baseline_worker(self.stack)

    @property
    def procs(self) -> list[Proc]:
        return [self.stack.streams, *self.stack.workers, self.baseline]

    @property
    def baseline_ref(self) -> Any:
        from ragwarm.client.wire import WorkerRef

        return WorkerRef("plain-caching", self.stack.worker_url(self.baseline))

    @property
    def streams_url(self) -> str:
        return self.stack.streams_url

    @contextmanager
    def running(self) -> Iterator[DemoStack]:
        from ragwarm.kafka.local import LocalKafka

        self._check_free()
        with ExitStack() as exits:
            broker = LocalKafka(HomeSettings(), self.kafka, say=self.say)
            if self.keep_up:
                broker.start()
            else:
                exits.enter_context(broker)  # stops Kafka at the end if we started it
                exits.callback(self.teardown)
            self._start()
            yield self

    def _check_free(self) -> None:
        for proc in self.procs:
            port = int(proc.health_url.split(":")[2].split("/")[0])
            if proc.pid() is not None or _port_busy(port):
                raise click.ClickException(
                    f"{proc.name} (port {port}) is already running: stop the stack with "
                    "`ragwarm down` (or free the port) and run the demo again")

    def _start(self) -> None:
        from ragwarm.kafka.admin import create_topics
        from schemas.topics import prefixed

        create_topics(
            self.kafka.servers, self.kafka.client_options(), prefixed(self.prefix),
            replicas=self.kafka.topic_replicas,
        )
        for proc in self.procs:
            proc.start()
            self.say(f"{proc.name}: starting (log {proc.log_file})")
        for proc in self.procs:
            proc.wait_healthy(self.stack.settings.start_timeout_s)
            self.say(f"{proc.name}: healthy")

    def teardown(self) -> None:
        from ragwarm.kafka.admin import delete_topics, list_topics

        for proc in reversed(self.procs):
            if proc.stop():
                self.say(f"{proc.name}: stopped")
        try:
            options = self.kafka.client_options()
            mine = [t for t in list_topics(self.kafka.servers, options) if
                    t.startswith(self.prefix)]
            delete_topics(self.kafka.servers, options, mine)
        except Exception as exc:  # noqa: BLE001 - cleanup must go on; say what is left
            self.say(f"demo topics {self.prefix}* not deleted: {exc}")
        shutil.rmtree(self.workdir, ignore_errors=True)


def baseline_worker(stack: Any) -> Proc:
    """A worker with plain prefix caching (what vLLM APC does: it caches the prompts it
    answered) and no Kafka: the pipeline neither warms nor invalidates it, nor routes to it."""
    port = stack.settings.worker_port + stack.settings.workers
    return Proc("worker-plain-caching",
                ["worker", "--worker-id", "plain-caching", "--port", str(port), "--no-kafka"],
                stack.home.run_dir, f"http://127.0.0.1:{port}/health/ready",
                {"RAGWARM_WORKER_CACHE_REQUESTS": "true",
                 **stack.security.worker("plain-caching")})


def _port_busy(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


# --- the scenario ------------------------------------------------------------------------
@dataclass
class Scenario:
    """Drives one demo run against a running stack and records every query."""

    stack: DemoStack
    plan: DemoPlan
    say: Say
    n_questions: int
    max_tokens: int
    samples: int = 3
    rows: list[Row] = field(default_factory=list)
    edit_at_s: float | None = None
    t0: float = 0.0

    def stats(self) -> dict[str, Any]:
        response = httpx.get(f"{self.stack.streams_url}/ragwarm/stats", timeout=10,
                             headers=operator_headers("streams"))
        return response.json()["counters"]

    def processed(self) -> int:
        counters = self.stats()
        return counters.get("kb_events", 0) + counters.get("stale_events", 0)

    def ingest(self, events: Sequence[TraceEvent], what: str) -> None:
        from ragwarm.client.ingest import event_change, send_all
        from ragwarm.client.producer import KbProducer
        from schemas import MAX_TEXT_BYTES
        from schemas.topics import KB_CHANGES

        before = self.processed()
        kafka = self.stack.kafka
        with KbProducer(kafka.servers, kafka.producer_options(), kafka.topic(KB_CHANGES)) as p:
            report = send_all(p, events, lambda e: event_change(e, "default", MAX_TEXT_BYTES),
                              progress=False)
        for skipped in report.skipped:
            self.say(f"  skipped {skipped.source}: {skipped.kind} ({skipped.detail})")
        if report.failed:
            raise click.ClickException(f"{len(report.failed)} {what} not acknowledged by Kafka")
        started = time.monotonic()
        must_wait(lambda: self.processed() >= before + report.sent, 600,
                  f"the streams app to index the {what}")
        self.say(f"{what}: {report.sent} changes sent and indexed in "
                 f"{time.monotonic() - started:.1f} s")

    def pick(self, client: Any) -> list[str]:
        """Questions whose top-3 holds a chunk the edits change (their prefixes get invalidated
        and re-warmed), then ones whose top-3 only touches an edited document (TTL extended);
        one question per distinct prefix."""
        changed = changed_chunks(self.plan.initial, self.plan.edits, chunker(client))
        edited = {e.doc_id for e in self.plan.edits}
        hit, touched = [], []
        for q in self.plan.questions:
            prepared = client.prepare(q.question)
            if any(r.chunk_id in changed for r in prepared.prompt.chunk_refs):
                hit.append(prepared)
            elif edited & {c.doc_id for c in prepared.chunks}:
                touched.append(prepared)
        picked: dict[str, str] = {}
        for prepared in hit + touched:
            if prepared.prefix_hash and len(picked) < self.n_questions:
                picked.setdefault(prepared.prefix_hash, prepared.question)
        if not picked:
            raise click.ClickException("no question retrieves a document edited in the slice; "
                                       "try a larger --edits")
        self.say(f"{len(hit)} candidate questions use a chunk the edits change, "
                 f"{len(touched)} only an edited document")
        return list(picked.values())

    def ask(self, client: Any, questions: Sequence[str], after_edit: bool = False) -> None:
        """Ask through the pipeline's worker, then the same prompt on the plain-caching one,
        each after `SETTLE_S`; a row's phase is what the cache held (or `after_edit`)."""
        for question in questions:
            prepared = client.prepare(question)
            time.sleep(SETTLE_S)
            answer = client.ask(prepared, max_tokens=self.max_tokens)
            time.sleep(SETTLE_S)
            plain = client.ask_on(self.stack.baseline_ref, prepared, self.max_tokens)
            asked_at = time.monotonic() - (answer.total_ms + plain.total_ms) / 1000 - SETTLE_S
            self.t0 = self.t0 or asked_at
            phase = "after_edit" if after_edit else held(answer.cached_tokens,
                                                         answer.prefix_tokens)
            self.rows.append(Row(question, phase, answer.ttft_ms, answer.cached_tokens,
                                 answer.prompt_tokens, answer.worker_ttft_ms,
                                 asked_at - self.t0, answer.prefix_hash,
                                 answer.prefix_tokens, answer.worker_id,
                                 plain.ttft_ms, plain.cached_tokens))
            self.say(f"  {phase:<10} {answer.ttft_ms:9.1f} ms  cached {answer.cached_tokens:>4}"
                     f"/{answer.prompt_tokens:<4} │ plain caching {plain.ttft_ms:9.1f} ms "
                     f"cached {plain.cached_tokens:>4}  {question}")

    def wait_held(self, prefixes: set[str], what: str, timeout_s: float = 120.0) -> bool:
        """Until every prefix is held by a worker (as the streams app's table says)."""
        def held() -> bool:
            return all(_holders(self.stack.streams_url, h) for h in prefixes)
        ok = wait_until(held, timeout_s)
        if not ok:
            self.say(f"  warning: {what} not all warm after {timeout_s:.0f} s; measuring anyway")
        return ok

    def wait_commands_done(self, timeout_s: float = 60.0) -> bool:
        """Until the streams app has sent nothing new for a second and the workers have
        carried out all it sent (their committed offsets at the end of the topic)."""
        sent = ("prefills", "re_prefills", "invalidations", "ttl_extensions")
        last: list[int] = []

        def done() -> bool:
            counts = [self.stats().get(k, 0) for k in sent]
            quiet, last[:] = counts == last, counts
            return quiet and self.stack.stack.commands_behind() == 0

        if not (ok := wait_until(done, timeout_s, poll_s=1.0)):
            self.say(f"  warning: commands still queued after {timeout_s:.0f} s; measuring anyway")
        return ok

    def run(self, client: Any) -> None:
        questions = self.pick(client)
        self.say(f"asking {len(questions)} questions {COLD_ASKS} times (both workers cache the "
                 "prompts they answer, as vLLM APC does; ragwarm's also gets the pipeline's "
                 "warmups: hot-token pins now, re-prefills after the edits)")
        for _ in range(COLD_ASKS):
            self.ask(client, questions)
        prefixes = {r.prefix_hash for r in self.rows if r.prefix_hash}
        self.say("they are hot now: waiting for the hot-token agent to pin their prefixes…")
        self.wait_held(prefixes, "the hot prefixes")
        for _ in range(self.samples):
            self.ask(client, questions)
        self.apply_edits(client, questions)
        self.say("asking the edited questions again:")
        for _ in range(self.samples):
            self.ask(client, questions, after_edit=True)

    def apply_edits(self, client: Any, questions: Sequence[str]) -> None:
        before = self.stats()
        self.edit_at_s = time.monotonic() - self.t0
        docs = ", ".join(dict.fromkeys(f"{e.doc_id}@{e.seq}" for e in self.plan.edits))
        self.say(f"applying {len(self.plan.edits)} real edits ({docs}):")
        self.ingest(self.plan.edits, "edits")
        acted = ("invalidations", "ttl_extensions")
        wait_until(lambda: sum(self.stats().get(k, 0) - before.get(k, 0) for k in acted) > 0, 60)
        old = {r.question: r.prefix_hash for r in self.rows}
        # `ingest` waited for both edits to be indexed, so these are the final new prefixes.
        rewarmed = rewarm_targets(old, {q: client.prepare(q).prefix_hash for q in questions})
        if rewarmed:
            self.say(f"waiting for {len(rewarmed)} new prefixes to be re-prefilled…")
            self.wait_held(rewarmed, "the re-prefilled prefixes")
        # The edits' other re-warms (their documents' other dependents) may still be queued
        # on the worker: an ask now would measure the wait behind them, not the warm path.
        self.say("waiting for the workers to carry out every command the edits sent…")
        self.wait_commands_done()
        after = self.stats()
        self.say("pipeline: " + ", ".join(f"{k} +{after.get(k, 0) - before.get(k, 0)}" for k in
                                          ("invalidations", "re_prefills", "prefills",
                                           "ttl_extensions")))


def chunker(client: Any) -> Callable[[str, str], dict[str, str]]:
    """Chunk ids and hashes of a text, exactly as the streams app's indexer makes them."""
    from rag.chunking import chunk_document
    from rag.settings import RagSettings

    rag = RagSettings()
    tokenizer = client.prompts.tokenizer

    def chunk(doc_id: str, text: str) -> dict[str, str]:
        chunks = chunk_document(doc_id, text, tokenizer, rag.chunk_tokens, rag.chunk_overlap)
        return {c.chunk_id: c.content_hash for c in chunks}

    return chunk


def _prefix(streams_url: str, prefix_hash: str) -> dict[str, Any]:
    try:
        response = httpx.get(f"{streams_url}/ragwarm/prefixes/{prefix_hash}", timeout=10,
                             headers=operator_headers("streams"))
        return response.json()
    except (httpx.HTTPError, ValueError):
        return {}


def _holders(streams_url: str, prefix_hash: str) -> list[str]:
    return _prefix(streams_url, prefix_hash).get("holders") or []


def wait_until(predicate: Callable[[], bool], timeout_s: float, poll_s: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_s)
    return False


def must_wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    if not wait_until(predicate, timeout_s):
        raise click.ClickException(f"timed out after {timeout_s:.0f} s waiting for {what}")


# --- the command -------------------------------------------------------------------------
def report(scenario: Scenario, chart: Path) -> dict[str, Any]:
    counters = scenario.stats()
    return {
        "queries": [asdict(r) for r in scenario.rows],
        "invalidations": counters.get("invalidations", 0),
        "prefills": counters.get("prefills", 0),
        "re_prefills": counters.get("re_prefills", 0),
        "ttl_extensions": counters.get("ttl_extensions", 0),
        "edits": [{"seq": e.seq, "doc_id": e.doc_id} for e in scenario.plan.edits],
        "topic_prefix": scenario.stack.prefix,
        "chart": str(chart),
    }


def print_report(result: dict[str, Any], summaries: Sequence[Summary]) -> None:
    click.echo("")
    for line in table_lines(summaries):
        click.echo(line)
    ratios = [s.ratio for s in summaries if s.ratio is not None]
    plain = [s.reactive_ratio for s in summaries if s.reactive_ratio is not None]
    click.echo("")
    click.echo(f"pipeline: {result['invalidations']} invalidations, {result['prefills']} "
               f"prefills ({result['re_prefills']} re-prefills after edits), "
               f"{result['ttl_extensions']} TTL extensions")
    verdict = rewarm_verdict(summaries)
    if verdict:
        click.echo(verdict)
    if ratios:
        click.echo(f"first ask after the edits / warm TTFT: worst {max(ratios):.2f}x, median "
                   f"{statistics.median(ratios):.2f}x (warm: the whole prompt was cached; an "
                   "edited prompt's first ask also computes its prefix's last partial block and "
                   "the question)")
    if plain:
        click.echo(f"plain prefix caching after the same edits: worst {max(plain):.2f}x, "
                   f"median {statistics.median(plain):.2f}x of warm TTFT (first ask)")
    click.echo(f"chart: {result['chart']}")


@click.command()
@click.option("--events", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=TRACE_DIR / "events.jsonl", show_default=True, help="Trace events JSONL.")
@click.option("--questions", "questions_path", default=TRACE_DIR / "questions.jsonl",
              type=click.Path(exists=True, dir_okay=False, path_type=Path), show_default=True,
              help="Trace questions JSONL.")
@click.option("--edits", type=click.IntRange(1, 200), default=2, show_default=True,
              help="Real edits applied (the first ones touching an asked document).")
@click.option("--hot-questions", type=click.IntRange(1, 20), default=4, show_default=True,
              help="Questions asked (each with its own prompt prefix).")
@click.option("--samples", type=click.IntRange(1, 20), default=3, show_default=True,
              help="Asks per question when warm and after the edits (medians are shown).")
@click.option("--max-tokens", type=click.IntRange(1, 512), default=8, show_default=True,
              help="Tokens generated per answer.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              default=Path("out/demo"), show_default=True, help="Where the chart is written.")
@click.option("--keep-up", is_flag=True, help="Leave the stack running (stop: `ragwarm down`).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
def demo(events: Path, questions_path: Path, edits: int, hot_questions: int, samples: int,
         max_tokens: int, out: Path, keep_up: bool, as_json: bool) -> None:
    """Bring the stack up, ingest the trace's initial state, ask hot questions cold and warm,
    apply real edits, show what the pipeline did and the TTFT after it, tear it all down."""
    from ragwarm.client.rag import quiet_http_logs
    from ragwarm.kafka.common import quiet_client_logs

    quiet_client_logs()
    quiet_http_logs()

    def say(text: str) -> None:
        click.echo(text, err=as_json)

    try:
        plan = plan_demo(list(read_events(events)), read_questions(questions_path), edits)
    except (TraceError, OSError, ValueError) as exc:
        raise click.ClickException(f"cannot read the trace: {exc}") from None
    if not plan.edits:
        raise click.ClickException(f"{events} has no edit of a document a question asks about")
    demo_stack = DemoStack(say, keep_up)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        scenario = Scenario(demo_stack, plan, say, hot_questions, max_tokens, samples)
        result = _run(scenario, out)
    except (RuntimeError, TimeoutError) as exc:  # start failures, client errors: message only
        raise click.ClickException(str(exc)) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    if as_json:
        click.echo(json.dumps(result))
    else:
        print_report(result, summarize(scenario.rows))


def _run(scenario: Scenario, out: Path) -> dict[str, Any]:
    from ragwarm.client.rag import RagClient
    from ragwarm.client.settings import ClientSettings

    with scenario.stack.running() as running:
        scenario.ingest(scenario.plan.initial, "initial state")
        must_wait(lambda: _ready_workers(running.streams_url) >= len(running.stack.workers),
                  120, "the workers to report ready")
        key = running.stack.security.key_of("RAGWARM_CLIENT_API_KEY")
        settings = ClientSettings(streams_url=running.streams_url,
                                  max_tokens=scenario.max_tokens,
                                  api_key=None if key is None else SecretStr(key))
        with RagClient.open(settings, running.kafka) as client:
            scenario.run(client)
        chart = write_chart(scenario.rows, scenario.edit_at_s, out / "ttft.png")
        result = report(scenario, chart)
        if running.keep_up:
            # The baseline is the demo's own: `ragwarm down` knows only the stack's processes,
            # so left running it would hold its port until killed by hand.
            if running.baseline.stop():
                scenario.say(f"{running.baseline.name}: stopped (the demo's baseline)")
            scenario.say(
                f"stack left running (its workers cache the prompts they answer and get the "
                f"pipeline's warmups): RAGWARM_KAFKA_TOPIC_PREFIX={running.prefix} ragwarm "
                f"query '…'; stop it with `ragwarm down` (topics {running.prefix}* and "
                f"{running.workdir} stay)")
    return result


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # unwinds through the teardown, like Ctrl-C


def _ready_workers(streams_url: str) -> int:
    try:
        rows = httpx.get(f"{streams_url}/ragwarm/workers", timeout=10,
                         headers=operator_headers("streams")).json()["workers"]
    except (httpx.HTTPError, ValueError, KeyError):
        return 0
    return sum(1 for w in rows if w.get("ready") and w.get("url"))
