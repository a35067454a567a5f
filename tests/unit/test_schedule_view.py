"""`POST /ragwarm/warmup` sends the hot set again, marked as a scheduled warmup."""

from __future__ import annotations

from types import SimpleNamespace

from streams.decide.records import PrefixOp
from streams.shell.views.schedule import warm_hot_set


class Out:
    def __init__(self) -> None:
        self.ops: list[PrefixOp] = []

    async def op(self, op: PrefixOp) -> None:
        self.ops.append(op)


async def test_every_hot_prefix_is_warmed_again_as_scheduled() -> None:
    hot = {h: PrefixOp(op="warm", prefix_hash=h, tenant="t", token_ids=[1, 2], reason="hot")
           for h in ("a" * 16, "b" * 16)}
    p = SimpleNamespace(tracker=SimpleNamespace(hot=hot), out=Out())
    assert await warm_hot_set(p) == 2
    assert [o.prefix_hash for o in p.out.ops] == ["a" * 16, "b" * 16]
    assert {o.reason for o in p.out.ops} == {"scheduled"} and hot["a" * 16].reason == "hot"
