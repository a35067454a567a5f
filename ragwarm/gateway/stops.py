"""Stop sequences, pure: cut generated text at the first one, also when it spans stream pieces.

The workers take no stop strings (their API refuses `stop`), so the gateway cuts the text it
hands out; the worker still generates up to the token limit, and `usage.completion_tokens`
counts what it generated.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopCut:
    """Text fed piece by piece comes out cut before the first stop sequence.

    A tail that may be the start of a stop sequence is held back until the next piece says
    whether it is one, so no piece of a stop sequence is ever handed out.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.held = ""
        self.hit = False

    def feed(self, text: str) -> str:
        """The part of `text` (with what was held) that may be handed out now."""
        if self.hit:
            return ""
        buf = self.held + text
        at = self._first_stop(buf)
        # Where a stop sequence may have begun without being complete yet: a longer one
        # that started before a shorter, complete one ("DEE" and "E" over "DE") still wins.
        start = len(buf) - self._open_tail(buf)
        if at is not None and at <= start:
            self.hit, self.held = True, ""
            return buf[:at]
        self.held = buf[start:]
        return buf[:start]

    def flush(self) -> str:
        """What was held back, once the text has ended: cut at a stop sequence it holds."""
        rest, self.held = ("" if self.hit else self.held), ""
        at = self._first_stop(rest)
        if at is not None:
            self.hit = True
            return rest[:at]
        return rest

    def cut(self, text: str) -> str:
        """A whole text, cut."""
        return self.feed(text) + self.flush()

    def finish_reason(self, reason: str | None) -> str | None:
        """"stop" when a stop sequence ended the text, else the worker's reason."""
        return "stop" if self.hit else reason

    def _first_stop(self, buf: str) -> int | None:
        found = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        return min(found) if found else None

    def _open_tail(self, buf: str) -> int:
        """Length of the longest end of `buf` that begins some stop sequence."""
        longest = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(buf)), longest, -1):
                if buf.endswith(stop[:n]):
                    longest = n
                    break
        return longest
