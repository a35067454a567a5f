"""WorkerSettings: engine and cache fields from RAGWARM_WORKER_* with clear validation errors."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from workers.settings import WorkerSettings


def test_defaults() -> None:
    settings = WorkerSettings()
    assert (settings.device, settings.dtype, settings.block_size) == ("auto", "auto", 16)
    assert settings.eviction_policy == "slru" and settings.threads is None


def test_environment_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGWARM_WORKER_DEVICE", "cpu")
    monkeypatch.setenv("RAGWARM_WORKER_THREADS", "2")
    monkeypatch.setenv("RAGWARM_WORKER_KV_BYTES", "1048576")
    settings = WorkerSettings()
    assert (settings.device, settings.threads, settings.kv_bytes) == ("cpu", 2, 1048576)


def test_unknown_eviction_policy_lists_the_valid_names() -> None:
    with pytest.raises(ValidationError, match="valid names: gdsf, lfu-aged, lru"):
        WorkerSettings(eviction_policy="fifo")


def test_bad_device_is_rejected() -> None:
    with pytest.raises(ValidationError):
        WorkerSettings(device="tpu")  # type: ignore[arg-type]
