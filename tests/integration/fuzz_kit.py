"""What the two fuzz tests on the real topics share (`test_fuzz_topics`,
`test_fuzz_commands_signed`): the seed, the size limits, the worker's id, reading its
events back."""

from __future__ import annotations

import json

from schemas import WorkerEvent, decode
from schemas.topics import WORKER_EVENTS
from tests.integration.kafka_read import read_topic

SEED = 13
# The producer's (and the broker's) limit is about 1 MB a record: a larger bad record is
# sent cut to this size, which leaves it bad (a JSON text cut short never parses).
MAX_VALUE = 1_000_000
MAX_REASON = 4096  # a dead letter's reason is cut there
WORKER = "fz-w1"


def addressed_elsewhere(raw: bytes) -> bool:
    """A JSON object naming another worker: that worker's to refuse, not this one's."""
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        return False
    wid = obj.get("worker_id") if isinstance(obj, dict) else None
    return isinstance(wid, str) and wid != WORKER


def worker_events(bootstrap: str, namespace: str) -> list[WorkerEvent]:
    return [decode(r.value, WorkerEvent)
            for r in read_topic(bootstrap, namespace + WORKER_EVENTS)]  # fmt: skip
