"""Free TCP ports for processes this one starts (tests, benchmarks, the faults stack).

Binding port 0 and closing the socket lets the kernel hand out the same port again on
the next call, so two services given "a free port" each could be told the same one:
the slower to bind then exits with "address in use" (a streams app that lost its port
to a worker failed a CI run that way). `free_port` remembers what it handed out in this
process and never repeats it; a port is still only free until something binds it.
"""

from __future__ import annotations

import socket
import threading

_HANDED_OUT: set[int] = set()
_LOCK = threading.Lock()


def free_port() -> int:
    """A port free now that this process has not handed out before."""
    with _LOCK:
        for _ in range(200):
            port = _bound_port()
            if port not in _HANDED_OUT:
                _HANDED_OUT.add(port)
                return port
    raise RuntimeError("no free port found in 200 tries")


def _bound_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
