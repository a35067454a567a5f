"""`ragwarm bench contention`: a request that arrives while its worker prefills a burst of
warmups (an edit's re-warms, a ready worker's plan), under the worker's engine lock
(requests first, `workers.engine_lock`) and under a plain lock (the worker before it).

Both on one `WorkerRuntime` over the torch engine and the real model, in one process: the
asked prompt's prefix is warm, so alone its TTFT is the question's forward; what the burst
adds is the wait for the engine. The burst runs in a thread of its own, as the worker's
command consumer does, and the request arrives once the burst's first prefill is running.

With `--clients N` the worker is saturated instead: N clients send the request back to back
from the burst's start until it ends (or `--window` seconds pass). Then what matters is
how long the burst takes, and a third lock is measured: requests first without the bound
on a warmup's wait (`EngineLock(None)`, the lock before the bound), under which the burst
waits for the clients to stop.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click

from ragwarm.bench.engine import DEFAULT_EVENTS, corpus_text, suffix_tokens

# How long after the burst's first prefill starts the request arrives: that prefill takes
# 100s of ms even for short prefixes on a GPU, so the request lands inside it.
ARRIVE_AFTER_S = 0.02
LOCKS = ("plain", "requests-first")
SATURATED_LOCKS = (*LOCKS, "unbounded")


class PlainLock:
    """The worker's lock before requests went first: one `threading.Lock` for all work."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    @contextmanager
    def serving(self) -> Iterator[float]:
        started = time.perf_counter()
        with self._lock:
            yield time.perf_counter() - started

    background = serving

    def try_background(self, timeout_s: float) -> bool:
        return self._lock.acquire(timeout=timeout_s)

    def release(self) -> None:
        self._lock.release()

    def yield_to_requests(self) -> float:
        return 0.0  # a prefill held the engine to its end


@dataclass(frozen=True)
class Result:
    lock: str
    alone_ms: float  # the request with no burst: its question's forward
    ttft_ms: float  # median TTFT of the request arriving during the burst
    ttft_max_ms: float
    burst_ms: float  # median time the whole burst took
    runs: int
    requests: int  # requests measured during the bursts (runs, or what the clients sent)


def _runtime(engine: Any, lock: str) -> Any:
    from workers.api import Limits
    from workers.commands import NullSink
    from workers.engine_lock import EngineLock
    from workers.metrics import WorkerMetrics
    from workers.runtime import WorkerRuntime

    limits = Limits(engine.max_model_len, 16, engine.max_model_len, engine.vocab_size)
    runtime = WorkerRuntime(
        engine, worker_id="bench", url="", sink=NullSink(),
        metrics=WorkerMetrics(worker_id="bench", model_name=engine.model_id), limits=limits,
        cache_requests=False,
    )
    chosen: Any = {"plain": PlainLock, "unbounded": lambda: EngineLock(None)}.get(
        lock, EngineLock)()
    runtime.lock = chosen
    return runtime


def _ttft(runtime: Any, prompt: list[int], tenant: str) -> float:
    first: list[float] = []

    def emit(step: Any) -> bool:
        if not first:
            first.append(time.perf_counter())
        return True

    arrived = time.perf_counter()
    runtime.generate(prompt, tenant=tenant, max_tokens=1, temperature=0.0, arrived=arrived,
                     emit=emit)
    return first[0] - arrived


def one_run(runtime: Any, prompt: list[int], warm: list[int], burst: list[list[int]],
            tag: str, clients: int = 0, window_s: float = 0.0) -> tuple[list[float], float]:
    """The TTFTs of the requests sent while `burst` is prefilled (each for a tenant of its
    own, so nothing of it is cached), and the burst's whole time: one request, or
    `clients` sending it back to back until the burst ends or `window_s` passed."""
    started, finished = threading.Event(), threading.Event()
    spent: list[float] = []

    def prefill_all() -> None:
        t0 = time.perf_counter()
        for i, ids in enumerate(burst):
            if i == 0:
                started.set()
            runtime.prefill(ids, tenant=f"{tag}-{i}", source="command")
        spent.append(time.perf_counter() - t0)
        finished.set()

    runtime.prefill(warm, tenant="asker")
    worker = threading.Thread(target=prefill_all, name="warmup-commands")
    worker.start()
    started.wait()
    ttfts: list[float] = []
    if not clients:
        time.sleep(ARRIVE_AFTER_S)
        ttfts.append(_ttft(runtime, prompt, "asker"))
    else:
        until = time.perf_counter() + window_s

        def client() -> None:
            ttfts.append(_ttft(runtime, prompt, "asker"))  # one at least, however short
            while not finished.is_set() and time.perf_counter() < until:
                ttfts.append(_ttft(runtime, prompt, "asker"))

        threads = [threading.Thread(target=client) for _ in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    worker.join()
    return ttfts, spent[0]


def run(engine: Any, runs: int, burst: int, prefix: int, question: int,
        events: Path | None, clients: int = 0, window_s: float = 0.0) -> dict[str, Any]:
    tokens = engine.tokenize(corpus_text(events, min_chars=(burst + 1) * prefix * 8))
    if len(tokens) < (burst + 1) * prefix + question:
        raise click.ClickException(f"the text has only {len(tokens)} tokens")
    warm = tokens[:prefix]
    prompt = warm + suffix_tokens(engine, tokens[prefix:], question)
    others = [tokens[(i + 1) * prefix:(i + 2) * prefix] for i in range(burst)]
    load_before = os.getloadavg()[0]
    results = []
    for lock in SATURATED_LOCKS if clients else LOCKS:
        runtime = _runtime(engine, lock)
        runtime.prefill(warm, tenant="asker")
        alone = [_ttft(runtime, prompt, "asker") for _ in range(runs)]
        pairs = [one_run(runtime, prompt, warm, others, f"{lock}-{r}", clients, window_s)
                 for r in range(runs)]
        ttfts = [t for ts, _ in pairs for t in ts]
        results.append(Result(lock, _ms(statistics.median(alone)), _ms(statistics.median(ttfts)),
                              _ms(max(ttfts)), _ms(statistics.median(b for _, b in pairs)), runs,
                              len(ttfts)))
        click.echo(f"  {lock}: request TTFT {results[-1].ttft_ms:,.0f} ms during the burst "
                   f"({results[-1].alone_ms:,.0f} ms alone), burst {results[-1].burst_ms:,.0f} "
                   "ms", err=True)
    import torch

    return {
        "model": engine.model_id, "device": engine.device, "threads": torch.get_num_threads(),
        "burst": burst, "prefix_tokens": prefix, "question_tokens": question,
        "clients": clients, "window_s": window_s if clients else None,
        "load_avg": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "cpu_count": os.cpu_count(), "results": [asdict(r) for r in results],
    }


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def print_table(report: dict[str, Any]) -> None:
    click.echo(f"{report['model']} on {report['device']} ({report['threads']} threads): a "
               f"request ({report['prefix_tokens']}-token warm prefix + "
               f"{report['question_tokens']}-token question) "
               + (f"sent back to back by {report['clients']} clients (for at most "
                  f"{report['window_s']:g} s) " if report["clients"] else "arriving ")
               + f"during a burst of {report['burst']} warmup prefills of "
               f"{report['prefix_tokens']} tokens; "
               f"load average {report['load_avg'][0]} -> {report['load_avg'][1]}")
    click.echo("| lock | alone ms | during burst ms | max ms | burst ms | runs | requests |")
    click.echo("|---|---:|---:|---:|---:|---:|---:|")
    for r in report["results"]:
        click.echo(f"| {r['lock']} | {r['alone_ms']:,.1f} | {r['ttft_ms']:,.1f} | "
                   f"{r['ttft_max_ms']:,.1f} | {r['burst_ms']:,.0f} | {r['runs']} | "
                   f"{r['requests']} |")


@click.command()
@click.option("--runs", default=3, show_default=True, help="Bursts per lock.")
@click.option("--burst", default=4, show_default=True,
              help="Warmup prefills queued back to back.")
@click.option("--prefix", default=1024, show_default=True,
              help="Tokens of each prefix (the asked one's and each warmup's).")
@click.option("--question", default=32, show_default=True, help="Question tokens.")
@click.option("--clients", default=0, show_default=True,
              help="Clients sending the request back to back during the burst (0: one "
              "request arriving once it started); adds the lock without the wait bound.")
@click.option("--window", "window_s", default=30.0, show_default=True,
              help="With --clients: seconds they keep sending at most (the unbounded lock's "
              "burst waits for them to stop).")
@click.option("--events", type=click.Path(path_type=Path, dir_okay=False),
              default=DEFAULT_EVENTS if DEFAULT_EVENTS.is_file() else None,
              help="JSONL events whose `text` makes the prefixes (synthetic text when absent).")
@click.option("--threads", type=int, default=None, help="torch threads (default: settings).")
@click.option("--device", type=click.Choice(["cpu", "cuda", "auto"]), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def contention(runs: int, burst: int, prefix: int, question: int, clients: int,
               window_s: float, events: Path | None, threads: int | None, device: str | None,
               as_json: bool) -> None:
    """TTFT of a request that arrives while its worker prefills a burst of warmups: the
    worker's requests-first engine lock against a plain lock (with --clients: requests back
    to back, and how long the burst then takes)."""
    from ragwarm.models import llm_dir
    from workers.engines.torch_engine import load_torch_engine
    from workers.settings import WorkerSettings

    if min(runs, burst, prefix, question) < 1:
        raise click.BadParameter("--runs, --burst, --prefix and --question must be >= 1")
    if clients < 0 or window_s <= 0:
        raise click.BadParameter("--clients must be >= 0 and --window > 0")
    overrides = {k: v for k, v in {"threads": threads, "device": device}.items() if v}
    engine = load_torch_engine(llm_dir(), WorkerSettings(**overrides))  # type: ignore[arg-type]
    report = run(engine, runs, burst, prefix, question, events, clients, window_s)
    if as_json:
        click.echo(json.dumps(report))
    else:
        print_table(report)
