"""The task dump names the call each task waits in, through its nested awaits."""

from __future__ import annotations

import asyncio

from streams.shell.taskdump import await_chain, describe


async def _inner(gate: asyncio.Event) -> None:
    await gate.wait()


async def _outer(gate: asyncio.Event) -> None:
    await _inner(gate)


def test_the_chain_goes_down_to_the_innermost_await():
    async def main() -> list[str]:
        gate = asyncio.Event()
        task = asyncio.create_task(_outer(gate), name="stuck")
        await asyncio.sleep(0)
        chain = await_chain(task.get_coro())
        text = describe([task])
        gate.set()
        await task
        assert text.startswith("task stuck\n")
        return chain

    chain = asyncio.run(main())
    names = [c.rsplit(" ", 1)[-1] for c in chain if not c.startswith("waits on")]
    assert names[:3] == ["_outer", "_inner", "wait"]
    assert chain[-1].startswith("waits on")  # the future under `Event.wait`


def test_finished_tasks_are_left_out():
    async def main() -> str:
        task = asyncio.create_task(asyncio.sleep(0), name="done")
        await task
        return describe([task])

    assert asyncio.run(main()) == ""
