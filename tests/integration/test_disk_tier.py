"""The disk KV tier in a real `ragwarm worker`: a SIGKILLed worker restarted on the same disk
serves its warm prefixes at once, and a chunk's invalidation reaches its blocks on disk, one
sent while the worker was down included."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from kafka import KafkaProducer

from ragwarm.models import llm_dir, load_tokenizer
from ragwarm.settings import ModelSettings
from schemas import WarmupCommand, encode
from schemas.topics import WARMUP_COMMANDS, WORKER_EVENTS
from tests.integration.kafka_read import WorkerEvents, wait_group_empty
from tests.integration.worker_proc import WorkerProc, completion
from workers.commands import command_group_id
from workers.kv.blocks import block_hashes

pytestmark = pytest.mark.integration

TENANT = "tier"
SYSTEM = "You answer questions about the mill by the river, briefly and exactly.\n"
CHUNKS = {
    "mill.md#0": " ".join(f"The mill turns {i} stones when the river runs high." for i in range(9)),
    "mill.md#1": " ".join(f"The miller keeps {i} sacks of flour in the loft." for i in range(9)),
}
QUESTION = "\nQuestion: How many stones does the mill turn? Answer:"


def tier_file(root: Path, block_hash: str) -> Path:
    return root / block_hash[:2] / f"{block_hash}.safetensors"


def ref(chunk_id: str) -> dict[str, str]:
    digest = hashlib.sha256(CHUNKS[chunk_id].encode()).hexdigest()
    return {"chunk_id": chunk_id, "content_hash": digest}


def test_a_killed_worker_restarted_on_its_disk_serves_warm_prefixes_at_once(
    worker_factory: Callable[..., WorkerProc],
    kafka_bootstrap: str,
    kafka_producer: KafkaProducer,
    namespace: str,
    tmp_path: Path,
) -> None:
    tokenizer = load_tokenizer(llm_dir())

    def ids(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    prompts = {cid: ids(SYSTEM + text) for cid, text in CHUNKS.items()}
    chains = {
        cid: block_hashes(p, tenant=TENANT, model=ModelSettings().llm_name)
        for cid, p in prompts.items()
    }
    warm_set = tmp_path / "warm.jsonl"
    warm_set.write_text("".join(
        json.dumps({"token_ids": p, "tenant": TENANT, "chunk_refs": [ref(cid)]}) + "\n"
        for cid, p in prompts.items()
    ))  # fmt: skip
    root = tmp_path / "tier"
    worker_id = f"tier-{uuid.uuid4().hex[:8]}"
    env = {"RAGWARM_WORKER_DISK_TIER": "true", "RAGWARM_WORKER_DISK_TIER_PATH": str(root)}
    events = WorkerEvents(kafka_bootstrap, namespace + WORKER_EVENTS, worker_id, from_start=True)

    def invalidation(chunk_id: str) -> WarmupCommand:
        return WarmupCommand(
            command_id=f"c-{uuid.uuid4().hex[:8]}",
            op="invalidate",
            tenant=TENANT,
            chunk_refs=[ref(chunk_id)],
        )

    def send(command: WarmupCommand) -> None:
        kafka_producer.send(namespace + WARMUP_COMMANDS, key=b"0" * 32, value=encode(command))
        kafka_producer.flush()

    def start(args: list[str]) -> WorkerProc:
        proc = worker_factory(
            worker_id, kafka_bootstrap=kafka_bootstrap, topic_prefix=namespace, env=env, args=args
        )
        return proc.start().wait_ready()

    try:
        first = start(["--warm-set", str(warm_set)])
        # Warm prefixes are written through to the disk tier as they are stored.
        for chain in chains.values():
            assert all(tier_file(root, h).is_file() for h in chain)
        question = prompts["mill.md#0"] + ids(QUESTION)
        before = completion(first, question, TENANT)
        boot1 = events.wait_for(lambda e: e.kind == "ready", "first ready").epoch
        assert first.proc is not None
        os.killpg(first.proc.pid, signal.SIGKILL)
        first.proc.wait(30)
        wait_group_empty(kafka_bootstrap, command_group_id(worker_id, namespace))
        # While it is down, the second chunk changes: its invalidation waits in the topic.
        send(invalidation("mill.md#1"))

        second = start([])  # no warm set, and no prefill command is ever sent
        ready = events.wait_for(lambda e: e.kind == "ready" and e.epoch != boot1, "second ready")
        # The missed invalidation ran before `ready`: only the first prefix is still held.
        assert chains["mill.md#0"][-1] in ready.tier_prefixes
        assert chains["mill.md#1"][-1] not in ready.tier_prefixes
        assert ready.tier_bytes > 0
        stale_while_down = chains["mill.md#1"]
        assert not tier_file(root, stale_while_down[-1]).exists()
        after = completion(second, question, TENANT)
        held = len(chains["mill.md#0"]) * 16
        assert after["usage"]["prompt_tokens_details"]["cached_tokens"] >= held
        assert after["choices"][0]["text"] == before["choices"][0]["text"]

        invalidate = invalidation("mill.md#0")
        send(invalidate)
        events.wait_for(
            lambda e: e.kind == "invalidated" and e.command_id == invalidate.command_id,
            "invalidated",
        )
        stale, other = chains["mill.md#0"], chains["mill.md#1"]
        shared = next(i for i, (a, b) in enumerate(zip(stale, other, strict=False)) if a != b)
        assert shared > 0
        assert not any(tier_file(root, h).exists() for h in stale[shared:])
        assert not any(tier_file(root, h).exists() for h in other[shared:])
        # The system prompt's blocks pass through neither chunk: they stay.
        assert all(tier_file(root, h).is_file() for h in stale[:shared])
    finally:
        events.close()
