"""Bearer keys shared by the worker API and the streams views: which tenant a key grants."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

ALL_TENANTS = "*"  # in a tenant→key map, the tenant of operator keys


class Forbidden(Exception):
    """A valid key asked for a tenant it does not grant."""


@dataclass(frozen=True)
class Grant:
    """What one key may do: one tenant's data, or every tenant's (`tenant` None: an operator)."""

    tenant: str | None

    @property
    def operator(self) -> bool:
        return self.tenant is None

    def allows(self, tenant: str | None) -> bool:
        return self.tenant is None or tenant == self.tenant


def _digest(token: str) -> bytes:
    # Comparing fixed-size digests keeps the comparison time independent of the key length.
    return hashlib.sha256(token.encode("utf-8")).digest()


class KeyRing:
    """The accepted keys: an operator key (every tenant) and tenant-bound keys.

    An empty ring means authentication is off (a dev setup); `enabled` tells which.
    """

    def __init__(
        self, operator_key: str | None = None, tenant_keys: Mapping[str, str] | None = None
    ) -> None:
        keys: list[tuple[bytes, str | None]] = (
            [(_digest(operator_key), None)] if operator_key else []
        )
        for tenant, key in (tenant_keys or {}).items():
            if not key:
                raise ValueError(f"tenant {tenant!r}: empty key")
            keys.append((_digest(key), None if tenant == ALL_TENANTS else tenant))
        self._keys = keys

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def grant(self, authorization: str | None) -> Grant | None:
        """The grant of an `Authorization: Bearer <key>` header; None for a missing/unknown key.

        Every key is compared, in constant time, so timing tells nothing about which matched.
        """
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        given = _digest(token.strip())
        found: Grant | None = None
        for digest, tenant in self._keys:
            if hmac.compare_digest(given, digest) and found is None:
                found = Grant(tenant)
        return found

    @staticmethod
    def tenant_for(grant: Grant, claimed: str | None) -> str | None:
        """The tenant a request acts for: its claim if granted, else the key's own tenant.

        Raises `Forbidden` when the claim names a tenant the key does not grant. None means
        an operator made no claim (the caller applies its default or asks for one).
        """
        if claimed is None:
            return grant.tenant
        if not grant.allows(claimed):
            raise Forbidden(f"this key does not grant tenant {claimed!r}")
        return claimed
