"""The prefix hashing contract: block-chain hashes every component computes the same way.

Clients, the RAG port and workers hash token blocks with these functions, so a prefix
warmed from a KB event has the hash a later query's prompt starts with.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence

BLOCK_SIZE = 16
HASH_CHARS = 32


def root_hash(tenant: str, model: str) -> str:
    """The salt of every chain: two tenants or two models never share a block hash."""
    # JSON keeps the separator unambiguous ("a|b", "c" must differ from "a", "b|c").
    payload = json.dumps(["ragwarm-prefix-v1", tenant, model]).encode()
    return hashlib.sha256(payload).hexdigest()[:HASH_CHARS]


def block_hashes(
    token_ids: Sequence[int], *, tenant: str, model: str, block_size: int = BLOCK_SIZE
) -> list[str]:
    """Chain hashes of the full blocks: h_i = sha256(raw(h_{i-1}) + uint32le(tokens_i)).

    `raw(h)` is the 16 bytes the 32-hex-char hash stands for; h_0's parent is
    `root_hash(tenant, model)`. A trailing partial block is not hashed.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    parent = bytes.fromhex(root_hash(tenant, model))
    packer = struct.Struct(f"<{block_size}I")
    hashes: list[str] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        block = token_ids[start : start + block_size]
        try:
            data = packer.pack(*block)
        except struct.error as exc:
            raise ValueError(f"token ids must be integers in [0, 2**32): {list(block)}") from exc
        parent = hashlib.sha256(parent + data).digest()[: HASH_CHARS // 2]
        hashes.append(parent.hex())
    return hashes
