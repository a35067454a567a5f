"""Progress of a long wait: a line on stderr every few seconds naming what is waited on and
for how long, so `ragwarm up`, `kafka start` and `models fetch` never sit silent for minutes.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

Write = Callable[[str], None]
# Often enough to show life, rarely enough that a 3-minute start prints ~20 lines, not 400.
EVERY_S = 10.0


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def progress_line(what: str, elapsed_s: float, limit_s: float | None = None) -> str:
    """`<what>… 20 s (gives up at 180 s)`: one line, whole seconds."""
    limit = f" (gives up at {limit_s:.0f} s)" if limit_s else ""
    return f"{what}… {elapsed_s:.0f} s{limit}"


@contextmanager
def waiting(
    what: str,
    *,
    limit_s: float | None = None,
    every_s: float = EVERY_S,
    write: Write = _stderr,
) -> Iterator[None]:
    """Write a progress line every `every_s` seconds while the block runs.

    A wait shorter than `every_s` prints nothing. A thread ticks, so the loops and the
    blocking calls inside (pip, Maven, a model load) stay as they are.
    """
    done = threading.Event()
    began = time.monotonic()

    def tick() -> None:
        while not done.wait(every_s):
            write(progress_line(what, time.monotonic() - began, limit_s))

    ticker = threading.Thread(target=tick, name="ragwarm-progress", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
