"""SIGUSR2 logs every asyncio task of the app with its await chain, innermost call last.

Why: an instance that answers its views while its agents handle nothing (a partition
takeover that stalled, a send that never completes) shows no error; what each agent awaits
is the one fact that tells where it is stuck. mode's SIGUSR1 dump prints threads with their
locals (about 190 kB) and only a task's outermost frame, not the call it waits in.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Iterable
from typing import Any

log = logging.getLogger(__name__)


def await_chain(coro: Any) -> list[str]:
    """`file:line function` of each coroutine `coro` awaits through, outermost first, and
    what the innermost one waits on when that is not a coroutine (a future, a task)."""
    out: list[str] = []
    seen: set[int] = set()
    while coro is not None and id(coro) not in seen:
        seen.add(id(coro))
        frame = next((f for f in (getattr(coro, a, None) for a in ("cr_frame", "gi_frame",
                                                                     "ag_frame")) if f), None)
        if frame is None:  # a future or a task: nothing further down to follow
            out.append(f"waits on {coro!r}"[:200])
            break
        out.append(f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
        coro = next((c for c in (getattr(coro, a, None) for a in ("cr_await", "gi_yieldfrom",
                                                                    "ag_await")) if c), None)
    return out


def describe(tasks: Iterable[asyncio.Task]) -> str:
    """One block per pending task: its name, then its await chain, indented."""
    blocks = []
    for task in sorted(tasks, key=lambda t: t.get_name()):
        if task.done():
            continue
        chain = await_chain(task.get_coro())
        blocks.append("\n".join([f"task {task.get_name()[:120]}", *(f"  {c}" for c in chain)]))
    return "\n".join(blocks)


def register_task_dump(app: Any, signum: int = signal.SIGUSR2) -> None:
    """Once the app runs, log every task's await chain on `signum`."""

    async def install_task_dump() -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(
            signum, lambda: log.warning("asyncio tasks (%s):\n%s", signal.Signals(signum).name,
                                        describe(asyncio.all_tasks(loop))))

    app.task(install_task_dump)
