"""The store's one thread: calls an edit waits on run before queued background ones."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from streams.decide import priority
from streams.decide.priority import PriorityExecutor

ROOT = Path(__file__).parents[2]


def test_an_urgent_call_overtakes_queued_background_ones_and_each_keeps_its_order():
    ex = PriorityExecutor("test-store")
    gate, ran = threading.Event(), []
    first = ex.submit(gate.wait)  # holds the thread while the others queue
    with priority.background():
        slow = [ex.submit(ran.append, f"background {n}") for n in (1, 2)]
    fast = [ex.submit(ran.append, f"urgent {n}") for n in (1, 2)]
    gate.set()
    for future in [first, *slow, *fast]:
        future.result(timeout=5)
    assert ran == ["urgent 1", "urgent 2", "background 1", "background 2"]
    ex.shutdown()


def test_the_priority_is_the_calling_tasks_own():
    seen = []

    async def tick() -> None:
        with priority.background():
            await asyncio.sleep(0)
            seen.append(("tick", priority.current()))

    async def edit() -> None:
        await asyncio.sleep(0)
        seen.append(("edit", priority.current()))

    async def both() -> None:
        await asyncio.gather(tick(), edit())

    asyncio.run(both())
    assert sorted(seen) == [("edit", priority.URGENT), ("tick", priority.BACKGROUND)]
    assert priority.current() == priority.URGENT  # restored after the block


def test_an_error_reaches_the_caller_and_the_thread_goes_on():
    ex = PriorityExecutor("test-store")

    async def calls() -> int:
        loop = asyncio.get_running_loop()
        with pytest.raises(ZeroDivisionError):
            await loop.run_in_executor(ex, lambda: 1 // 0)
        return await loop.run_in_executor(ex, lambda: 41 + 1)

    assert asyncio.run(calls()) == 42
    ex.shutdown()


def test_shutdown_runs_what_was_queued_then_refuses_more():
    ex = PriorityExecutor("test-store")
    gate, ran = threading.Event(), []
    ex.submit(gate.wait)
    with priority.background():
        queued = ex.submit(ran.append, "queued")
    threading.Timer(0.05, gate.set).start()
    ex.shutdown(wait=True)
    assert queued.done() and ran == ["queued"]
    with pytest.raises(RuntimeError):
        ex.submit(ran.append, "late")


def test_shutdown_may_cancel_what_is_still_queued():
    ex = PriorityExecutor("test-store")
    gate, started = threading.Event(), threading.Event()
    running = ex.submit(lambda: started.set() or gate.wait())
    started.wait(5)
    queued = ex.submit(lambda: None)
    ex.shutdown(wait=False, cancel_futures=True)
    gate.set()
    ex.shutdown(wait=True)
    assert running.result() is True and queued.cancelled()


def test_at_interpreter_exit_the_running_call_finishes_and_the_process_ends():
    script = (
        "import time\n"
        "from streams.decide.priority import PriorityExecutor\n"
        "ex = PriorityExecutor()\n"
        "ex.submit(lambda: (time.sleep(0.2), print('written', flush=True)))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=30, cwd=ROOT)
    assert done.returncode == 0 and done.stdout == "written\n", done.stderr
