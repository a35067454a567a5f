"""List the product files one KB change crosses, from `kb.changes` to a re-prefilled worker
(issue 37's measure), on the simulated clock.

Run `python scripts/kb_change_path.py [bench strategies options]` (default: the options
`docs/architecture.md` names). It runs `ragwarm bench strategies --model-free` in this
process under `sys.setprofile` and records every file whose Python code is called while a
KB change's handler (`on_kb_change`) or a prefix op's handler (`on_prefix_op`, which carries
out its commands on the simulated worker) is running. The benchmark's own files and the
simulation harness (`ragwarm/bench/`, `streams/sim.py`, `workers/sim.py`,
`workers/cost_engine.py`) are left out: they stand in for Kafka and the model. What the
simulation does not run (the Faust shell, the torch engine, the index) is read from the code,
not measured here.

It then prints, per handled event (median over the run), the stops: each stretch of code in
one file, so a call into another file and the return from it make two more. The stops at a
file already left and the file pairs linked by a call say how much a reader goes back and
forth, which a count of files does not.
"""

from __future__ import annotations

import runpy
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("schemas", "rag", "streams", "workers", "ragwarm")
HARNESS = ("ragwarm/bench/", "streams/sim.py", "workers/sim.py", "workers/cost_engine.py")
DEFAULT = ["--quick", "--policies", "event-rag", "--queries", "30", "--edits", "6"]
HANDLERS = ("on_kb_change", "on_prefix_op")


def product_file(filename: str) -> str | None:
    """`filename` relative to the repository when it is product code, else None."""
    try:
        rel = Path(filename).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return None
    if not rel.startswith(tuple(p + "/" for p in PACKAGES)) or rel.startswith(HARNESS):
        return None
    return rel


class Visits:
    """The files one handled event passes through, in the order the code runs in them: a
    stop is each stretch of code in one file (a call into another file ends it, and a return
    to it starts another), so `returns` counts the stops at a file already left once."""

    def __init__(self) -> None:
        self.stops: list[str] = []

    def at(self, rel: str) -> None:
        if not self.stops or self.stops[-1] != rel:
            self.stops.append(rel)

    def figures(self, prefix: str = "") -> tuple[int, int, int, int]:
        """(stops, files, returns, links) among the files under `prefix`, merging the stops
        that a call outside it split; links: the pairs of files one handed over to the other
        (a call or its return), each counted once."""
        inside = [f for f in self.stops if f.startswith(prefix)]
        runs = [f for i, f in enumerate(inside) if i == 0 or inside[i - 1] != f]
        links = {frozenset(pair) for pair in zip(runs, runs[1:], strict=False)}
        return len(runs), len(set(runs)), len(runs) - len(set(runs)), len(links)


def running_file(frame) -> str | None:
    """The product file whose code runs in `frame` or, for a library's frame, in the
    nearest product frame below it."""
    while frame is not None:
        if (rel := product_file(frame.f_code.co_filename)) is not None:
            return rel
        frame = frame.f_back
    return None


def median(values: list[int]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return float(ordered[mid]) if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def report_stops(traces: list[Visits], what: str) -> None:
    if not traces:
        return
    for label, prefix in (("streams/", "streams/"), ("every product file", "")):
        figures = [t.figures(prefix) for t in traces]
        stops, files, returns, links = (median([f[i] for f in figures]) for i in range(4))
        print(f"  {what}, {label}: median {stops:g} stops in {files:g} files, "
              f"{returns:g} returns to a file already left, {links:g} file pairs linked "
              f"({len(traces)} events)")


def main(argv: list[str]) -> None:
    handler_file = str((ROOT / "streams" / "handle" / "handlers.py").resolve())
    depth = 0
    calls: Counter[str] = Counter()
    traces: dict[str, list[Visits]] = {name: [] for name in HANDLERS}
    # A handler is a coroutine: a 'call' is also its resumption, so a trace is opened only
    # for a handler frame not seen before (held here, so its identity cannot be reused).
    opened: dict[object, Visits] = {}
    trace = Visits()

    def profile(frame, event, _arg) -> None:
        nonlocal depth, trace
        code = frame.f_code
        target = code.co_name in HANDLERS and code.co_filename == handler_file
        if event == "call":
            if target and depth == 0:
                if frame not in opened:
                    opened[frame] = Visits()
                    traces[code.co_name].append(opened[frame])
                trace = opened[frame]
            depth += target
            if depth > 0 and (rel := product_file(code.co_filename)) is not None:
                calls[rel] += 1
            if depth > 0 and (rel := running_file(frame)) is not None:
                trace.at(rel)
        elif event == "return":
            depth -= target
            if depth > 0 and (rel := running_file(frame.f_back)) is not None:
                trace.at(rel)

    # The bench's report goes to a scratch folder: this run must not replace a real one.
    with tempfile.TemporaryDirectory() as out:
        sys.argv = ["ragwarm", "bench", "strategies", "--model-free", "--out", out,
                    *(argv or DEFAULT)]
        sys.setprofile(profile)
        try:
            runpy.run_module("ragwarm", run_name="__main__")
        except SystemExit as done:
            if done.code not in (0, None):
                raise
        finally:
            sys.setprofile(None)
    print(f"\n{len(calls)} product files called while a KB change or a prefix op was handled:")
    for rel in sorted(calls):
        print(f"  {rel}  ({calls[rel]} calls)")
    print("\nStops per handled event (a stop: a stretch of code in one file):")
    report_stops(traces["on_kb_change"], "a KB change")
    report_stops(traces["on_prefix_op"], "a prefix op")


if __name__ == "__main__":
    main(sys.argv[1:])
