"""The disk KV tier's files: one safetensors file per block, named by its chain hash.

A file holds one tensor (the block's [2 × layers, kv_heads, block, head_dim] KV) and a JSON
header in the safetensors metadata: the hash, parent, tenant and chunk marks. Nothing is
ever unpickled. Files are written to a temporary name and renamed, so a crash leaves a
whole file or none; at boot the index is rebuilt from the headers alone, dropping leftovers,
unreadable files and blocks of another layout (dtype or model shape). Bookkeeping is
`workers.kv.tier_index`; this module only reads and writes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from workers.engines.kv_tier import KVTier, Layout
from workers.kv.tier_index import TierBlock

__all__ = ["DiskTier", "Layout", "owned"]

log = logging.getLogger(__name__)

FORMAT = 1
_META_KEY = "ragwarm"
_SUFFIX = ".safetensors"
# The only names this tier writes: `<hash>.safetensors` in the folder named by the hash's first
# two characters, and `_write`'s temporary `.<hash>.safetensors.<pid>.tmp` beside it. The scan
# deletes nothing else: the root may be shared with an operator's files (issue 41).
_BLOCK_NAME = re.compile(r"([0-9a-f]{16,128})\.safetensors")
_TEMP_NAME = re.compile(r"\.([0-9a-f]{16,128})\.safetensors\.[0-9]+\.tmp")


def owned(path: Path, root: Path) -> bool:
    """Whether `path` is named as a block file (or its temporary) of the tier at `root`."""
    if path.parent.parent != root:
        return False
    match = _BLOCK_NAME.fullmatch(path.name) or _TEMP_NAME.fullmatch(path.name)
    return match is not None and match.group(1)[:2] == path.parent.name


def encode_header(block: TierBlock, layout: Layout) -> str:
    return json.dumps(
        {
            "format": FORMAT,
            "hash": block.block_hash,
            "parent": block.parent,
            "tenant": block.tenant,
            "marks": sorted([list(m) for m in block.marks]),
            "end": block.end,
            "approx": block.approx,
            "dtype": layout.dtype,
            "shape": list(layout.shape),
        }
    )


def decode_header(text: str, layout: Layout, nbytes: int) -> TierBlock | None:
    """The block a header describes; None when it is not a block of `layout` in our format."""
    try:
        head = json.loads(text)
        if head["format"] != FORMAT or head["dtype"] != layout.dtype:
            return None
        if tuple(head["shape"]) != layout.shape:
            return None
        marks = frozenset((str(c), str(h)) for c, h in head["marks"])
        parent = head["parent"]
        return TierBlock(str(head["hash"]), None if parent is None else str(parent),
                         str(head["tenant"]), nbytes, marks, bool(head.get("end", False)),
                         bool(head.get("approx", False)))
    except (ValueError, KeyError, TypeError):
        return None


class DiskTier(KVTier):
    """Block files under `root` with their index, budget and running restore costs."""

    kind = "disk"
    durable = True

    def __init__(self, root: Path, max_bytes: int, layout: Layout, device: str) -> None:
        super().__init__(max_bytes, layout, device)
        self.root = Path(root)

    # -- boot ------------------------------------------------------------------------

    def scan(self) -> int:
        """Rebuild the index from the files (oldest use first); returns the blocks found."""
        self.root.mkdir(parents=True, exist_ok=True)
        found: list[tuple[float, TierBlock]] = []
        for path in self.root.glob("*/*"):
            if not owned(path, self.root) or path.is_symlink() or not path.is_file():
                log.warning("disk tier %s: %s is not a block file of this tier; left alone",
                            self.root, path)
                continue
            block = self._read_header(path)
            if block is None:
                self._drop_stray(path)
                continue
            found.append((path.stat().st_mtime, block))
        for _, block in sorted(found, key=lambda item: item[0]):
            if self.index.admissible(block.nbytes):  # the budget may have shrunk since
                self._unlink(self.index.add(block))
            else:
                self._unlink([block.block_hash])
        log.info("disk tier %s: %d blocks, %d bytes", self.root, len(self.index),
                 self.index.bytes_used)
        return len(self.index)

    def _drop_stray(self, path: Path) -> None:
        """Delete one of our own files that holds no usable block (a crash's temporary, a
        torn or foreign-layout block); a failure leaves it, the tier is a cache."""
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("disk tier: cannot remove %s: %s", path, exc)

    def _read_header(self, path: Path) -> TierBlock | None:
        if path.suffix != _SUFFIX:
            return None  # a temporary file a crash left behind
        try:
            with safe_open(str(path), framework="pt") as f:
                text = (f.metadata() or {}).get(_META_KEY, "")
        except Exception:  # safetensors raises its own error types for bad headers
            return None
        block = decode_header(text, self.layout, self.layout.nbytes)
        if block is None or path.stem != block.block_hash:
            return None
        return block

    # -- writes and drops ------------------------------------------------------------

    def _write(self, block: TierBlock, data: torch.Tensor) -> None:
        """Write one block's file; on a disk error (full, read-only) the block leaves the
        tier instead: the tier is a cache, and a request must never fail for it."""
        path = self._path(block.block_hash)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        meta = {_META_KEY: encode_header(block, self.layout)}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            save_file({"kv": data.detach().contiguous().cpu()}, str(tmp), metadata=meta)
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("disk tier: cannot write block %s (%s); dropped", block.block_hash, exc)
            self._unlink(self.index.remove([block.block_hash]))
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)

    def _unlink(self, hashes: Iterable[str]) -> None:
        for h in hashes:
            try:
                self._path(h).unlink(missing_ok=True)
            except OSError as exc:  # out of the index already: at worst a stray file stays
                log.warning("disk tier: cannot remove block %s: %s", h, exc)

    def _path(self, block_hash: str) -> Path:
        return self.root / block_hash[:2] / f"{block_hash}{_SUFFIX}"

    # -- reads -----------------------------------------------------------------------

    def _used(self, hashes: Sequence[str]) -> None:
        now = time.time()
        for h in hashes:
            with contextlib.suppress(OSError):
                os.utime(self._path(h), (now, now))  # the use order survives a restart

    def _read(self, block_hash: str) -> torch.Tensor | None:
        try:
            return load_file(str(self._path(block_hash)), device=self.device)["kv"]
        except Exception:  # a missing or damaged file: recompute instead
            log.warning("disk tier: block %s unreadable, dropped", block_hash)
            return None
