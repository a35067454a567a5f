"""Workers' name for the prefix hashing contract, which lives in `schemas.prefix`."""

from schemas.prefix import BLOCK_SIZE, HASH_CHARS, block_hashes, root_hash

__all__ = ["BLOCK_SIZE", "HASH_CHARS", "block_hashes", "root_hash"]
