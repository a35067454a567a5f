"""At most one send per key per interval: pure bookkeeping for the handlers.

Why: while a tracked prefix is on no worker (its prefill pending, refused or evicted) every
query of it sent the same warm op, hundreds a second for a hot question, each one a broker
record and a prefix-op to handle; one per interval carries the same news.
"""

from __future__ import annotations


class KeyPacing:
    """When each key last sent, on the caller's clock."""

    def __init__(self, capacity: int = 100_000) -> None:
        self.last: dict[str, float] = {}
        self.capacity = capacity

    def due(self, key: str, now: float, interval_s: float) -> bool:
        """Whether `key` may send at `now`: never sent, or `interval_s` since it last did."""
        last = self.last.get(key)
        return last is None or now - last >= interval_s

    def sent(self, key: str, now: float, interval_s: float) -> None:
        self.last[key] = now
        if len(self.last) > self.capacity:
            # Only the keys that sent within the interval still limit anything.
            self.last = {k: t for k, t in self.last.items() if now - t < interval_s}
