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


def free_port(span: int = 1) -> int:
    """A port p with p .. p+span-1 free now and none handed out before by this process
    (`span` > 1 for a service that numbers its instances from a base port)."""
    with _LOCK:
        for _ in range(200):
            base = _bound_port()
            ports = set(range(base, base + span))
            if ports & _HANDED_OUT or not all(_free(p) for p in range(base + 1, base + span)):
                continue
            _HANDED_OUT.update(ports)
            return base
    raise RuntimeError(f"no run of {span} free ports found in 200 tries")


def _bound_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
