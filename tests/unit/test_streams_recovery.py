"""Index recovery: which documents to re-index from kb.changes, and which record of each."""

from __future__ import annotations

import asyncio

from schemas import KbChange
from streams.decide.records import DocState
from streams.shell.faults import Backoff
from streams.shell.recovery import pick_changes, plan_reindex, recover_index, recover_until_done
from tests.unit.conftest import IndexPort, Port, pipeline


def _doc(version: int, deleted: bool = False, tenant: str = "default") -> DocState:
    return DocState(version=version, tenant=tenant, deleted=deleted)


def _kb(doc: str, version: int, tenant: str = "default") -> KbChange:
    return KbChange(op="upsert", doc_id=doc, version=version, text=f"v{version}", tenant=tenant)


def test_plan_reindex_finds_missing_and_behind_documents():
    docs = {"a": _doc(3), "b": _doc(2), "c": _doc(5), "gone": _doc(4, deleted=True),
            "old": _doc(6, deleted=True)}
    indexed = {("default", "b"): 2, ("default", "c"): 4, ("default", "old"): 5}
    assert plan_reindex(docs, indexed) == {
        ("default", "a"): 3,  # missing (a fresh disk)
        ("default", "c"): 5,  # behind
        ("default", "old"): 6,  # deleted since the index saw it
    }


def test_a_consistent_index_needs_nothing():
    assert plan_reindex({"a": _doc(3)}, {("default", "a"): 3}) == {}


def test_pick_changes_prefers_the_table_version_then_the_oldest_newer_one():
    need = {("default", "a"): 3, ("default", "b"): 3, ("t2", "a"): 1}
    changes = [_kb("a", 1), _kb("a", 3), _kb("a", 4), _kb("b", 7), _kb("b", 5), _kb("x", 1)]
    chosen = pick_changes(changes, need)
    assert chosen[("default", "a")].version == 3
    assert chosen[("default", "b")].version == 5  # compaction left only newer ones
    assert ("t2", "a") not in chosen


def test_recover_index_re_indexes_from_kb_changes_before_ready():
    port = IndexPort({})
    p, _ = pipeline(port)
    p.tables.doc_states["a"] = _doc(2)
    p.tables.doc_states["b"] = _doc(1)
    log = [_kb("a", 1), _kb("a", 2), _kb("b", 1)]
    asked = []

    def read(wanted):
        asked.append(wanted)
        return log

    assert asyncio.run(recover_index(p, read)) == 2
    assert asked == [{("default", "a"), ("default", "b")}]
    assert sorted((c.doc_id, c.version) for c in port.applied) == [("a", 2), ("b", 1)]
    assert asyncio.run(recover_index(p, read)) == 0  # now consistent


def test_readiness_is_open_by_default_and_closed_while_recovering():
    p, _ = pipeline(Port({}))
    assert p.readiness.index.is_set()
    p.readiness.wait_for_recovery()
    assert not p.readiness.index.is_set()
    p.readiness.recovered()
    assert p.readiness.index.is_set() and p.readiness.reason == "ready"


def test_recovery_retries_a_failing_read_until_it_passes(caplog):
    port = IndexPort({})
    p, _ = pipeline(port)
    p.tables.doc_states["a"] = _doc(1)
    p.readiness.wait_for_recovery()
    calls = []

    def read(wanted):
        calls.append(wanted)
        if len(calls) < 3:
            raise OSError("broker down")
        return [_kb("a", 1)]

    asyncio.run(recover_until_done(p, read, Backoff(initial_s=0.001, max_s=0.002)))
    failed = [r for r in caplog.records if r.getMessage().startswith("index recovery failed")]
    assert len(calls) == 3 and len(failed) == 2 and failed[0].exc_info[0] is OSError
    assert [c.doc_id for c in port.applied] == ["a"]
    assert p.readiness.index.is_set()
