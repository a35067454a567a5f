"""`ragwarm ingest`: publish `kb.changes` from a folder of text/markdown files or a trace JSONL."""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from stat import S_ISREG
from typing import Any, TypeVar

import click
from pydantic import ValidationError
from tqdm import tqdm

from ragwarm.client.producer import DeliveryFailure, KbProducer
from ragwarm.kafka.common import KafkaUnreachable, quiet_client_logs
from ragwarm.settings import KafkaSettings
from ragwarm.trace import TraceError, TraceEvent, read_events, split_initial
from schemas import MAX_TEXT_BYTES, KbChange
from schemas.topics import KB_CHANGES, TOPICS

TEXT_SUFFIXES = frozenset({".md", ".markdown", ".mdx", ".txt", ".rst", ".adoc"})
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
S = TypeVar("S")


@dataclass(frozen=True)
class Skipped:
    """A source that produced no change: `kind` groups it in the summary, `detail` explains."""

    source: str
    kind: str
    detail: str


@dataclass
class IngestReport:
    topic: str
    sent: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    failed: list[DeliveryFailure] = field(default_factory=list)
    ignored_suffixes: dict[str, int] = field(default_factory=dict)
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        """False when nothing could be sent because of errors, or the broker refused records."""
        if self.failed:
            return False
        return self.sent > 0 or not self.skipped


# --- folders ---------------------------------------------------------------------------------
def list_folder(root: Path) -> tuple[list[Path], dict[str, int]]:
    """Text/markdown files under `root` in path order, and a count of other files by suffix.

    Hidden files and folders (a leading dot, such as .git) are not part of a knowledge base.
    """
    files: list[Path] = []
    others: Counter[str] = Counter()
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in names:
            if name.startswith("."):
                continue
            suffix = Path(name).suffix.lower()
            if suffix in TEXT_SUFFIXES:
                files.append(Path(folder) / name)
            else:
                others[suffix or "(none)"] += 1
    files.sort(key=lambda p: p.relative_to(root).as_posix())
    return files, dict(sorted(others.items()))


def decode_text(data: bytes) -> str | Skipped:
    """The document text of a file's bytes, or why it is not one (binary, not UTF-8)."""
    nul = data.find(b"\x00")
    if nul >= 0:
        return Skipped("", "binary", f"NUL byte at offset {nul}")
    try:
        # A byte-order mark is an encoding artefact, not content: it would change the hash.
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return Skipped(
            "", "not UTF-8", f"invalid byte 0x{data[exc.start]:02x} at offset {exc.start}"
        )


def _read_regular(path: Path, max_bytes: int) -> tuple[bytes, os.stat_result] | Skipped:
    """A regular file's bytes and stat; FIFOs, sockets and devices are refused unopened.

    O_NONBLOCK keeps a FIFO that appears between listing and reading from blocking `open`;
    the type is checked on the opened descriptor, so a swapped path cannot slip through.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        stat = os.fstat(fd)
        if not S_ISREG(stat.st_mode):
            return Skipped("", "not a regular file", "a FIFO, socket or device")
        if stat.st_size > max_bytes:
            return Skipped("", "too large", f"{stat.st_size} bytes > {max_bytes}")
        return handle.read(max_bytes + 1), stat


def file_change(root: Path, path: Path, tenant: str, max_bytes: int) -> KbChange | Skipped:
    """The upsert of one file: doc_id is its path under `root`, version its mtime in ns.

    The mtime is the version because it grows with every save and stays put while the file
    is unchanged, so re-ingesting an untouched folder repeats the same versions.
    """
    doc_id = path.relative_to(root).as_posix()
    if path.is_symlink() and not path.resolve().is_relative_to(root.resolve()):
        return Skipped(doc_id, "outside the folder", f"a symlink to {os.readlink(path)}")
    try:
        read = _read_regular(path, max_bytes)
    except OSError as exc:
        return Skipped(doc_id, "unreadable", exc.strerror or type(exc).__name__)
    if isinstance(read, Skipped):
        return Skipped(doc_id, read.kind, read.detail)
    data, stat = read
    text = decode_text(data)
    if isinstance(text, Skipped):
        return Skipped(doc_id, text.kind, text.detail)
    stamp = _EPOCH + timedelta(microseconds=stat.st_mtime_ns // 1000)
    return _change(
        doc_id,
        op="upsert",
        doc_id=doc_id,
        version=stat.st_mtime_ns,
        tenant=tenant,
        text=text,
        timestamp=stamp,
        metadata={"source": "folder", "bytes": len(data)},
    )


# --- traces ----------------------------------------------------------------------------------
def trace_events(path: Path, initial_only: bool) -> list[TraceEvent]:
    """Every event of a trace (or only its initial state); `TraceError` names a bad line."""
    events = list(read_events(path))
    return split_initial(events).initial if initial_only else events


def event_change(event: TraceEvent, tenant: str, max_bytes: int) -> KbChange | Skipped:
    """The change of one trace event: version = seq, extra fields kept as metadata."""
    source = f"seq {event.seq} ({event.doc_id})"
    size = len(event.text.encode("utf-8")) if event.text else 0
    if event.op == "upsert" and size > max_bytes:
        return Skipped(source, "too large", f"{size} bytes > {max_bytes}")
    try:
        return event.to_change(tenant)
    except ValidationError as exc:
        return Skipped(source, "invalid", _first_error(exc))


def _change(source: str, **fields: Any) -> KbChange | Skipped:
    try:
        return KbChange.model_validate(fields)
    except ValidationError as exc:
        return Skipped(source, "invalid", _first_error(exc))


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {err['msg']}" if where else err["msg"]


# --- sending ---------------------------------------------------------------------------------
def send_all(
    producer: KbProducer,
    sources: Sequence[S],
    load: Callable[[S], KbChange | Skipped],
    limit: int | None = None,
    progress: bool | None = None,
) -> IngestReport:
    """Load and send each source in order (at most `limit` changes), reporting every skip."""
    report = IngestReport(topic=producer.topic)
    started = time.monotonic()
    queued = 0
    # progress=None: a bar only on a terminal, so logs and pipes stay clean.
    disable = None if progress is None else not progress
    bar = tqdm(sources, desc="ingest", unit="doc", file=sys.stderr, disable=disable)
    with bar:
        for source in bar:
            if limit is not None and queued >= limit:
                break
            item = load(source)
            if isinstance(item, KbChange):
                item = _send(producer, item)
            if isinstance(item, Skipped):
                report.skipped.append(item)
                tqdm.write(f"skipped {item.source}: {item.kind} ({item.detail})", file=sys.stderr)
            else:
                queued += 1
    delivery = producer.flush()
    report.sent, report.failed = delivery.delivered, list(delivery.failed)
    report.elapsed_s = time.monotonic() - started
    return report


def _send(producer: KbProducer, change: KbChange) -> KbChange | Skipped:
    try:
        producer.send(change)
    except Exception as exc:  # noqa: BLE001 - one bad record (e.g. over the size limit) is skipped
        return Skipped(f"{change.doc_id} v{change.version}", "send error", str(exc) or repr(exc))
    return change


def summary_lines(report: IngestReport, bootstrap: str) -> list[str]:
    lines = [
        f"topic:    {report.topic} @ {bootstrap}",
        f"sent:     {report.sent}",
        f"skipped:  {len(report.skipped)}",
    ]
    for kind, count in sorted(Counter(s.kind for s in report.skipped).items()):
        lines.append(f"  {kind}: {count}")
    if report.ignored_suffixes:
        kinds = ", ".join(f"{s} ×{n}" for s, n in report.ignored_suffixes.items())
        lines.append(f"ignored:  {sum(report.ignored_suffixes.values())} non-text files ({kinds})")
    lines.append(f"failed:   {len(report.failed)}")
    lines.extend(f"  {f.doc_id} v{f.version}: {f.error}" for f in report.failed)
    lines.append(f"elapsed:  {report.elapsed_s:.2f} s")
    return lines


# --- command ---------------------------------------------------------------------------------
@click.command()
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--tenant", default="default", show_default=True, help="Tenant of every change.")
@click.option(
    "--topic",
    default=None,
    help=f"Topic to publish to [default: {KB_CHANGES}, after RAGWARM_KAFKA_TOPIC_PREFIX].",
)
@click.option(
    "--max-bytes",
    type=click.IntRange(min=1, max=MAX_TEXT_BYTES),
    default=MAX_TEXT_BYTES,
    show_default=True,
    help="Skip (and report) documents larger than this many bytes.",
)
@click.option("--initial-only", is_flag=True, help="Trace only: send just the initial state.")
@click.option("--limit", type=click.IntRange(min=0), help="Send at most this many changes.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def ingest(
    path: Path,
    tenant: str,
    topic: str | None,
    max_bytes: int,
    initial_only: bool,
    limit: int | None,
    as_json: bool,
) -> None:
    """Publish KB changes from PATH: a folder of text/markdown files or a trace events JSONL.

    Folder: one upsert per .md/.markdown/.mdx/.txt/.rst/.adoc file, doc_id = its path under
    PATH with forward slashes, version = its mtime in nanoseconds (unchanged files keep their
    version). Trace (see the trace format in the data README): version = seq, extra scalar
    fields kept as metadata. Unreadable, binary, non-UTF-8 or oversized documents are
    reported and skipped; hidden files and folders are left out, other files counted.
    """
    quiet_client_logs()
    sources, load, ignored = _plan(path, tenant, max_bytes, initial_only)
    settings = KafkaSettings()
    topic = topic or settings.topic(KB_CHANGES)
    try:
        with KbProducer(settings.servers, settings.producer_options(), topic, 10.0) as producer:
            _check_topic(settings, topic)
            report = send_all(producer, sources, load, limit, progress=None)
    except KafkaUnreachable as exc:
        raise click.ClickException(str(exc)) from None
    report.ignored_suffixes = ignored
    _print(report, settings.servers, as_json)
    if not report.ok:
        problem = (
            f"{len(report.failed)} changes not acknowledged"
            if report.failed
            else "nothing could be sent"
        )
        click.echo(f"error: {problem}", err=True)
        sys.exit(1)


def _plan(
    path: Path, tenant: str, max_bytes: int, initial_only: bool
) -> tuple[list, Callable, dict[str, int]]:
    if path.is_dir():
        if initial_only:
            raise click.UsageError("--initial-only applies to a trace JSONL, not to a folder")
        files, ignored = list_folder(path)
        return files, lambda p: file_change(path, p, tenant, max_bytes), ignored
    try:
        events = trace_events(path, initial_only)
    except (TraceError, OSError, UnicodeDecodeError, ValueError) as exc:
        raise click.ClickException(f"cannot read the trace: {exc}") from None
    return events, lambda e: event_change(e, tenant, max_bytes), {}


def _check_topic(settings: KafkaSettings, topic: str) -> None:
    # Producing to a missing topic would auto-create it with one partition, breaking keying.
    from ragwarm.kafka.admin import list_topics

    if topic not in list_topics(settings.servers, settings.client_options(), timeout_s=10.0):
        fix = "`ragwarm topics create`" if topic in TOPICS else "your Kafka tooling"
        raise click.ClickException(
            f"topic {topic!r} does not exist at {settings.servers}; create it with {fix}"
        )


def _print(report: IngestReport, bootstrap: str, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(asdict(report)))
        return
    for line in summary_lines(report, bootstrap):
        click.echo(line)
