"""The disk tier's start-up scan touches only the files the tier writes (issue 41, item 10)."""

from __future__ import annotations

from pathlib import Path

import torch

from workers.engines.disk_tier import DiskTier, Layout, owned
from workers.kv.tier_index import TierBlock

LAYOUT = Layout("float32", (2, 1, 16, 4))
HASH = "ab" * 16


def _tier_with_one_block(root: Path) -> DiskTier:
    tier = DiskTier(root, 10**6, LAYOUT, "cpu")
    tier.scan()
    tier.put(TierBlock(HASH, None, "t", LAYOUT.nbytes), torch.ones(LAYOUT.shape))
    return tier


def test_files_the_tier_did_not_name_survive_the_scan(tmp_path: Path) -> None:
    _tier_with_one_block(tmp_path)
    strangers = [
        tmp_path / "notes.txt",
        tmp_path / "ab" / "README",
        tmp_path / "ab" / "backup.safetensors",
        tmp_path / "zz" / ("ab" * 16 + ".safetensors"),  # a block name in the wrong folder
        tmp_path / "ab" / ".leftover.tmp",
    ]
    for path in strangers:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"an operator's file")
    again = DiskTier(tmp_path, 10**6, LAYOUT, "cpu")
    assert again.scan() == 1
    assert all(p.read_bytes() == b"an operator's file" for p in strangers)


def test_a_sub_directory_does_not_crash_the_scan_and_is_kept(tmp_path: Path) -> None:
    _tier_with_one_block(tmp_path)
    (tmp_path / "ab" / "snapshots").mkdir()
    (tmp_path / "ab" / "snapshots" / "keep").write_bytes(b"x")
    (tmp_path / "ab" / ("cd" * 16 + ".safetensors")).mkdir()  # a directory with a block's name
    again = DiskTier(tmp_path, 10**6, LAYOUT, "cpu")
    assert again.scan() == 1
    assert (tmp_path / "ab" / "snapshots" / "keep").exists()
    assert (tmp_path / "ab" / ("cd" * 16 + ".safetensors")).is_dir()


def test_the_tiers_own_leftovers_are_still_dropped(tmp_path: Path) -> None:
    _tier_with_one_block(tmp_path)
    torn = tmp_path / "cd" / ("cd" * 16 + ".safetensors")
    temp = tmp_path / "ab" / f".{HASH}.safetensors.4242.tmp"
    torn.parent.mkdir()
    torn.write_bytes(b"not a safetensors file")
    temp.write_bytes(b"half a write")
    again = DiskTier(tmp_path, 10**6, LAYOUT, "cpu")
    assert again.scan() == 1
    assert not torn.exists() and not temp.exists()


def test_owned_names() -> None:
    root = Path("/tier")
    assert owned(root / "ab" / f"{HASH}.safetensors", root)
    assert owned(root / "ab" / f".{HASH}.safetensors.12.tmp", root)
    assert not owned(root / "cd" / f"{HASH}.safetensors", root)
    assert not owned(root / "ab" / f"{HASH.upper()}.safetensors", root)
    assert not owned(root / "ab" / "x" / f"{HASH}.safetensors", root)


def test_where_a_prefix_ends_survives_a_restart(tmp_path: Path) -> None:
    tier = _tier_with_one_block(tmp_path)
    assert tier.index.get(HASH) == TierBlock(HASH, None, "t", LAYOUT.nbytes)
    # The block now ends a cached prefix: its header is rewritten to say so.
    tier.put(TierBlock(HASH, None, "t", LAYOUT.nbytes, end=True), torch.ones(LAYOUT.shape))
    again = DiskTier(tmp_path, 10**6, LAYOUT, "cpu")
    again.scan()
    block = again.index.get(HASH)
    assert block is not None and block.end
