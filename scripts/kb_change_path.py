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


def main(argv: list[str]) -> None:
    handler_file = str((ROOT / "streams" / "handle" / "handlers.py").resolve())
    depth = 0
    calls: Counter[str] = Counter()

    def profile(frame, event, _arg) -> None:
        nonlocal depth
        code = frame.f_code
        target = code.co_name in HANDLERS and code.co_filename == handler_file
        if event == "call":
            depth += target
            if depth > 0 and (rel := product_file(code.co_filename)) is not None:
                calls[rel] += 1
        elif event == "return" and target:
            depth -= 1

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


if __name__ == "__main__":
    main(sys.argv[1:])
