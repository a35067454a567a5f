"""Issue 41's fuzz of `warmup.commands` on the real broker, with the commands signed: a real
worker holding the commands key gets fuzzed records sent unsigned (a forger on the topic),
signed with another key, and signed with its key (the streams app's, so the decoder has the
last word), with valid signed prefills and valid-looking forged ones interleaved.

Every bad record is refused and dead-lettered with a reason (the decoder's for the signed
ones), counted by reason; the signed prefills are stored, the forged ones are not; the worker
keeps running. FUZZ_COMMANDS_COUNT sets how many fuzzed records (default 2,000 for CI;
issue 41's figure is 10,000); not a RAGWARM_ name, which the worker would refuse as unknown.
"""

from __future__ import annotations

import os
import time

import pytest

from schemas import DeadLetter, WarmupCommand, decode, encode
from schemas.signing import COMMAND_SIGNATURE_HEADER, command_signature, derive_commands_key
from schemas.topics import DEADLETTER, WARMUP_COMMANDS
from tests.fuzz_records import bad_records, refusal
from tests.integration.fuzz_kit import (
    MAX_REASON,
    MAX_VALUE,
    SEED,
    WORKER,
    addressed_elsewhere,
    worker_events,
)
from tests.integration.kafka_read import read_topic
from tests.integration.waiting import wait_for
from tests.integration.worker_proc import labelled, metric

pytestmark = pytest.mark.integration

COUNT = int(os.environ.get("FUZZ_COMMANDS_COUNT", "2000"))
MASTER = b"fuzz-master-secret"
KEY = derive_commands_key(MASTER).encode()
OTHER_KEY = derive_commands_key(b"a forger's guess").encode()


def signed(value: bytes, key: bytes | None) -> list[tuple[str, bytes]]:
    return [] if key is None else [(COMMAND_SIGNATURE_HEADER, command_signature(value, key))]


def plan() -> list[tuple[bytes, bytes | None, str, str | None]]:
    """(value, key it is signed with, what must happen, the decoder's reason) per record."""
    drawn = bad_records(WarmupCommand, COUNT, SEED + 41,
                        lambda raw: not addressed_elsewhere(raw))  # fmt: skip
    rows = []
    for i, (_, raw, why) in enumerate(drawn):
        if len(raw) > MAX_VALUE:
            raw, why = raw[:MAX_VALUE], refusal(raw[:MAX_VALUE], WarmupCommand)
        key, outcome = [(None, "unsigned"), (OTHER_KEY, "bad_signature"), (KEY, "malformed")][i % 3]
        rows.append((raw, key, outcome, why[0] if why else None))
    good = [WarmupCommand(command_id=f"fz41-ok-{i}", op="prefill", ttl_s=600,
                          token_ids=[100 + 7 * i + j for j in range(48)]) for i in range(10)]
    forged = [WarmupCommand(command_id=f"fz41-forged-{i}", op="prefill", ttl_s=600, pin=True,
                            token_ids=[300 + 5 * i + j for j in range(48)]) for i in range(10)]
    extras = [(encode(c), KEY, "stored", None) for c in good]
    extras += [(encode(c), None, "unsigned", None) for c in forged]
    step = max(1, len(rows) // len(extras))
    for n, extra in enumerate(extras):
        rows.insert(n * step + n, extra)
    return rows


@pytest.mark.timeout(3600)
def test_fuzzed_commands_are_refused_or_dead_lettered_and_signed_ones_applied(
    kafka_bootstrap, kafka_settings, namespace, worker_factory
):
    from kafka import KafkaProducer

    t0 = time.monotonic()
    worker = worker_factory(WORKER, kafka_bootstrap=kafka_bootstrap, topic_prefix=namespace,
                            env={"RAGWARM_WORKER_CACHE_REQUESTS": "false",
                                 "RAGWARM_WORKER_COMMANDS_KEY": KEY.decode()}).start()  # fmt: skip
    rows = plan()  # drawn while the worker loads its model
    worker.wait_ready()
    pid = worker.proc.pid
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=20,
                             max_request_size=MAX_VALUE + 4096,
                             **kafka_settings.client_options())  # fmt: skip
    expect: dict[tuple[int, int], tuple[str, str | None]] = {}
    try:
        futures = [(producer.send(namespace + WARMUP_COMMANDS, value=v, headers=signed(v, k)),
                    outcome, why) for v, k, outcome, why in rows]  # fmt: skip
        producer.flush()
        for future, outcome, why in futures:
            meta = future.get(timeout=60)
            expect[(meta.partition, meta.offset)] = (outcome, why)
    finally:
        producer.close()
    produced_s = time.monotonic() - t0
    counts = {o: sum(1 for x, _ in expect.values() if x == o)
              for o in ("unsigned", "bad_signature", "malformed", "stored")}  # fmt: skip
    lettered = len(expect) - counts["stored"]

    def refused(reason: str) -> float:
        return labelled(worker.get("/metrics").text, "ragwarm_worker_commands_refused_total",
                        f'reason="{reason}"')  # fmt: skip

    def malformed() -> float:
        return metric(worker.get("/metrics").text, "ragwarm_worker_commands_malformed_total")

    def all_counted() -> bool:
        return (refused("unsigned") >= counts["unsigned"]
                and refused("bad_signature") >= counts["bad_signature"]
                and malformed() >= counts["malformed"])  # fmt: skip

    wait_for(all_counted, 2400, "every fuzzed command counted")
    letters = [decode(r.value, DeadLetter)
               for r in read_topic(kafka_bootstrap, namespace + DEADLETTER, lettered, 600)]
    by_origin = {(x.partition, x.offset): x for x in letters}
    assert len(letters) == lettered and len(by_origin) == lettered
    for origin, (outcome, why) in expect.items():
        letter = by_origin.get(origin)
        if outcome == "stored":
            assert letter is None
            continue
        assert letter is not None and letter.reason.strip(), origin
        if outcome == "malformed":
            assert why is not None and letter.reason.startswith(why[:MAX_REASON])
        else:
            assert letter.reason.startswith(outcome.replace("_", " ")), letter.reason

    ok = {f"fz41-ok-{i}" for i in range(10)}

    def stored() -> set[str] | None:
        got = {e.command_id for e in worker_events(kafka_bootstrap, namespace)
               if e.kind == "stored"}  # fmt: skip
        return got if got >= ok else None

    assert wait_for(stored, 300, "the 10 signed prefills stored") == ok  # no forged one
    assert refused("unsigned") == counts["unsigned"]
    assert refused("bad_signature") == counts["bad_signature"]
    assert malformed() == counts["malformed"]
    assert worker.proc.pid == pid and worker.proc.poll() is None
    assert worker.probe().status == 200
    cache = worker.get("/v1/cache").json()
    assert not any(i["pinned"] for i in cache["items"])  # the forged pins never landed
    print(f"\nfuzz (signed commands): {len(expect)} records {counts}; produced by "
          f"{produced_s:.0f} s, all refused or applied and checked by "
          f"{time.monotonic() - t0:.0f} s")
