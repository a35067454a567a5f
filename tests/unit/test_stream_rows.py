"""`Rows`: the tables hold JSON, the handlers see typed models, converted in one place."""

from __future__ import annotations

import json

import pytest

from streams.decide.records import WorkerState
from streams.handle.deps import Rows
from streams.sim import dict_tables


def test_rows_write_json_and_read_models() -> None:
    tables = dict_tables()
    tables.worker_states["w1"] = WorkerState(worker_id="w1", ready=True, mem_total=100)
    raw = tables.workers["w1"]
    assert isinstance(raw, dict) and json.loads(json.dumps(raw)) == raw  # JSON, never pickle
    assert tables.worker_states["w1"] == WorkerState(worker_id="w1", ready=True, mem_total=100)
    assert tables.worker_states.get("w2") is None


def test_missing_or_empty_rows_are_absent() -> None:
    table: dict = {"a": WorkerState(worker_id="a").model_dump(mode="json"), "b": None, "c": {}}
    rows = Rows(table, WorkerState)
    assert [k for k, _ in rows.items()] == ["a"] and len(rows.values()) == 1
    with pytest.raises(KeyError):
        rows["b"]
