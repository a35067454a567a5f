"""The torch engine on the real SmolLM2 copy: chunked prefill, and the disk tier's spill and
restore giving back exactly the KV that left."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from workers.engines.protocol import GenerateRequest
from workers.engines.torch_engine import TorchEngine, load_torch_engine
from workers.kv.cache import PrefixCache
from workers.kv.memory import Budget
from workers.settings import WorkerSettings

pytestmark = pytest.mark.integration

TEXT = "Argo CD syncs the live state of an application with the state kept in Git. " * 12


def _answer(engine: TorchEngine, prompt: list[int], tenant: str) -> tuple[tuple[int, ...], int]:
    steps = list(engine.generate(GenerateRequest(prompt, max_tokens=4, tenant=tenant)))
    result = steps[-1].result
    assert result is not None
    return result.token_ids, result.cached_tokens


def test_chunked_prefill_stores_the_same_kv_as_one_pass(model_path: Path) -> None:
    engine = load_torch_engine(model_path, WorkerSettings(device="cpu", threads=1))
    assert engine.prefill_chunk_tokens == 512  # the seed's CPU default
    ids = engine.tokenize(TEXT)[:160]
    engine.prefill_chunk_tokens = 10_000
    whole = engine.prefill(ids, tenant="whole")
    engine.prefill_chunk_tokens = 48  # not a multiple of the block size
    chunked = engine.prefill(ids, tenant="chunked")
    a, b = engine.stored_kv(whole.prefix_hash), engine.stored_kv(chunked.prefix_hash)
    assert a is not None and b is not None
    for (ka, va), (kb, vb) in zip(a, b, strict=True):
        torch.testing.assert_close(ka, kb, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(va, vb, rtol=1e-4, atol=1e-4)
    question = engine.tokenize(" What does it sync?")
    assert _answer(engine, ids + question, "whole")[0] == _answer(engine, ids + question, "x")[0]


def _one_prefix_engine(
    model_path: Path, settings: WorkerSettings
) -> tuple[TorchEngine, list[int]]:
    """An engine whose device budget holds one 6-block prefix, not two, and that prefix."""
    probe = load_torch_engine(model_path, settings)
    ids = probe.tokenize(TEXT)[:96]  # 6 blocks
    room = 8 * probe.block_bytes  # one prefix fits, two do not
    engine = load_torch_engine(
        model_path, settings, cache=PrefixCache(Budget(room, 10, room), block_size=16)
    )
    return engine, ids


def test_an_evicted_prefix_spills_to_disk_and_comes_back_bit_for_bit(
    model_path: Path, tmp_path: Path
) -> None:
    settings = WorkerSettings(
        device="cpu", threads=1, disk_tier=True, disk_tier_path=tmp_path / "tier"
    )
    engine, ids = _one_prefix_engine(model_path, settings)
    first = engine.prefill(ids, tenant="a", kind="request")
    kept = [b.data.clone() for b in engine.stored_blocks(first.prefix_hash) or []]
    assert not any((tmp_path / "tier").rglob("*.safetensors"))  # request blocks: not yet
    engine.prefill(ids, tenant="b", kind="request")  # evicts tenant a's prefix for room
    assert first.prefix_hash not in engine.cache
    # Room for 8 blocks, 12 asked: the last 4 of tenant a's go (spilled), its head stays.
    assert len(list((tmp_path / "tier").rglob("*.safetensors"))) == 4
    question = engine.tokenize(" Which state does it keep?")
    tokens, cached = _answer(engine, ids + question, "a")
    assert cached == 96
    back = engine.stored_blocks(first.prefix_hash)
    assert back is not None
    assert all(torch.equal(x.data, y) for x, y in zip(back, kept, strict=True))
    cold = load_torch_engine(model_path, WorkerSettings(device="cpu", threads=1))
    assert _answer(cold, ids + question, "a")[0] == tokens


def test_a_restarted_engine_restores_its_warm_prefix_from_disk_before_any_request(
    model_path: Path, tmp_path: Path
) -> None:
    settings = WorkerSettings(
        device="cpu", threads=1, disk_tier=True, disk_tier_path=tmp_path / "tier"
    )
    engine, ids = _one_prefix_engine(model_path, settings)
    short = engine.prefill(ids[:48], tenant="a", pin=True)  # managed: written through
    warm = engine.prefill(ids, tenant="a", pin=True)  # extends the short one
    kept = [b.data.clone() for b in engine.stored_blocks(warm.prefix_hash) or []]
    del engine  # the process died; its tier folder is all that is left

    again, _ = _one_prefix_engine(model_path, settings)
    assert warm.prefix_hash not in again.cache
    assert again.restore_tier(0) == 0  # no room: nothing read
    assert again.restore_tier(again.memory().total) == 2
    assert warm.prefix_hash in again.cache and short.prefix_hash in again.cache
    back = again.stored_blocks(warm.prefix_hash)
    assert back is not None
    assert all(torch.equal(x.data, y) for x, y in zip(back, kept, strict=True))
    events = again.cache.drain_events()
    assert sorted((e.kind, e.prefix_hash) for e in events) == sorted(
        [("stored", warm.prefix_hash), ("stored", short.prefix_hash)]
    )
    question = again.tokenize(" Which state does it keep?")
    assert _answer(again, ids + question, "a")[1] == len(ids)  # warm from its first request


def test_an_evicted_prefix_spills_to_host_memory_and_comes_back_bit_for_bit(
    model_path: Path
) -> None:
    settings = WorkerSettings(device="cpu", threads=1, host_tier_bytes=64 * 2**20)
    engine, ids = _one_prefix_engine(model_path, settings)
    assert engine.tier is not None and engine.tier.kind == "host"
    first = engine.prefill(ids, tenant="a", kind="request")
    kept = [b.data.clone() for b in engine.stored_blocks(first.prefix_hash) or []]
    engine.prefill(ids, tenant="b", kind="request")  # evicts tenant a's prefix for room
    # Room for 8 blocks, 12 asked: the last 4 of tenant a's go (spilled), its head stays.
    assert first.prefix_hash not in engine.cache and len(engine.tier.index) == 4
    question = engine.tokenize(" Which state does it keep?")
    tokens, cached = _answer(engine, ids + question, "a")
    assert cached == 96  # read back from host memory, not recomputed
    back = engine.stored_blocks(first.prefix_hash)
    assert back is not None
    assert all(torch.equal(x.data, y) for x, y in zip(back, kept, strict=True))
    cold = load_torch_engine(model_path, WorkerSettings(device="cpu", threads=1))
    assert _answer(cold, ids + question, "a")[0] == tokens  # as a cold engine answers


def test_a_prefix_prefilled_into_the_host_tier_leaves_the_device_prefix_and_answers_warm(
    model_path: Path
) -> None:
    """`WarmupCommand.placement == "tier"`: the prefix is computed and its blocks go straight
    to the host tier; the prefix in device memory is not evicted for it, and an ask reads
    the tier's KV back and answers as a cold engine does."""
    settings = WorkerSettings(device="cpu", threads=1, host_tier_bytes=64 * 2**20)
    engine, ids = _one_prefix_engine(model_path, settings)
    assert engine.tier is not None and engine.tier_total() == 64 * 2**20
    kept = engine.prefill(ids, tenant="a", kind="request")
    used = engine.memory().used
    placed = engine.prefill(ids, tenant="b", to_tier=True)
    assert placed.computed_tokens == 96 and placed.prefix_hash not in engine.cache
    assert kept.prefix_hash in engine.cache and engine.memory().used == used
    assert len(engine.tier.index) == 6 and placed.prefix_hash in engine.tier_state()[0]
    question = engine.tokenize(" Which state does it keep?")
    tokens, cached = _answer(engine, ids + question, "b")
    assert cached == 96  # read back from host memory, not recomputed
    cold = load_torch_engine(model_path, WorkerSettings(device="cpu", threads=1))
    assert _answer(cold, ids + question, "b")[0] == tokens


def test_a_stored_blends_blocks_spill_to_host_memory_and_come_back_still_marked(
    model_path: Path
) -> None:
    """A blended answer's prompt is stored with its blocks past the exact head marked
    approximate (`Block.approx`); evicted, they spill with the mark and a hit that reads
    them back reports them as `approx_cached_tokens`, bit for bit what left."""
    settings = WorkerSettings(device="cpu", threads=1, host_tier_bytes=64 * 2**20)
    engine, ids = _one_prefix_engine(model_path, settings)
    assert engine.tier is not None
    first = engine.prefill(ids, tenant="a", kind="request")
    hashes = engine.block_hashes(ids, tenant="a")
    for h in hashes[3:]:  # as a blend from block 3 on stores it (white box: no gate needed)
        engine.cache.pool[h].approx = True
    kept = [b.data.clone() for b in engine.stored_blocks(first.prefix_hash) or []]
    engine.prefill(ids, tenant="b", kind="request")  # the last 4 of tenant a's 6 blocks spill
    assert [engine.tier.index.get(h).approx for h in hashes[2:]] == [False, True, True, True]
    steps = list(engine.generate(GenerateRequest(
        ids + engine.tokenize(" Which state does it keep?"), max_tokens=1, tenant="a")))
    result = steps[-1].result
    assert result is not None and result.cached_tokens == 96
    assert result.approx_cached_tokens == 96 - 3 * engine.block_size
    assert engine.cache.pool.exact_run(hashes) == 3
    back = engine.stored_blocks(first.prefix_hash)
    assert back is not None
    assert all(torch.equal(x.data, y) for x, y in zip(back, kept, strict=True))


def test_a_tier_directory_is_rebuilt_from_its_headers_and_strangers_are_dropped(
    tmp_path: Path,
) -> None:
    from workers.engines.disk_tier import DiskTier, Layout
    from workers.kv.tier_index import TierBlock

    layout = Layout("float32", (4, 1, 16, 8))
    tier = DiskTier(tmp_path, 10**6, layout, "cpu")
    tier.scan()
    data = torch.arange(4 * 16 * 8, dtype=torch.float32).reshape(4, 1, 16, 8)
    head = TierBlock("aa" * 16, None, "t", layout.nbytes, frozenset({("d#0", "ff" * 16)}))
    tail = TierBlock("bb" * 16, head.block_hash, "t", layout.nbytes)
    tier.put(head, data)
    other = DiskTier(tmp_path, 10**6, Layout("float16", layout.shape), "cpu")
    assert other.scan() == 0  # another dtype's blocks are not this engine's: dropped
    assert not any(tmp_path.rglob("*.safetensors"))
    tier = DiskTier(tmp_path, 10**6, layout, "cpu")
    tier.scan()
    tier.put(head, data)
    tier.put(tail, data + 1)
    (tmp_path / "cc").mkdir()
    (tmp_path / "cc" / ("cc" * 16 + ".safetensors")).write_bytes(b"not a safetensors file")
    (tmp_path / "aa" / f".{head.block_hash}.safetensors.77.tmp").write_bytes(b"half a write")

    again = DiskTier(tmp_path, 10**6, layout, "cpu")
    assert again.scan() == 2
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == sorted(
        [head.block_hash + ".safetensors", tail.block_hash + ".safetensors"]
    )
    assert again.index.chain_ends() == [tail.block_hash]
    loaded = again.load([head.block_hash, tail.block_hash])
    assert torch.equal(loaded[1], data + 1)
    # The chunk mark survived the restart: invalidating the chunk drops the head and its tail.
    from workers.kv.tier_journal import TierOps

    gone = again.apply(TierOps(refs={("t", ("d#0", "ff" * 16))}), {})
    assert sorted(gone) == sorted([head.block_hash, tail.block_hash])
    assert not any(tmp_path.rglob("*.safetensors"))


def test_a_failing_disk_drops_the_block_instead_of_failing_the_caller(tmp_path: Path) -> None:
    from workers.engines.disk_tier import DiskTier, Layout
    from workers.kv.tier_index import TierBlock

    layout = Layout("float32", (2, 1, 16, 4))
    tier = DiskTier(tmp_path / "tier", 10**6, layout, "cpu")
    tier.scan()
    (tmp_path / "tier" / "aa").write_text("a file where the block's folder should be")
    tier.put(TierBlock("aa" * 16, None, "t", layout.nbytes), torch.zeros(layout.shape))
    assert len(tier.index) == 0
