"""What one KB change may re-warm, read once from the fleet (`streams.handle.edits.edit_budget`)."""

from __future__ import annotations

from streams.decide.records import WorkerState
from streams.handle.edits import EditBudget, edit_budget
from tests.unit.conftest import Port, pipeline


def fleet(*workers: WorkerState):
    p, _ = pipeline(Port({}), edit_rewarm_share=0.5, edit_rewarm_rest=7,
                    kv_bytes_per_token=10)
    p.tables.worker_states["w1"] = worker("w1", ready=False)  # the pipeline's own
    for w in workers:
        p.tables.worker_states[w.worker_id] = w
    return p


def worker(wid: str, *, ready: bool = True, pinned: int = 0, tier: int = 0) -> WorkerState:
    return WorkerState(worker_id=wid, ready=ready, mem_total=1000, pinned=pinned,
                       tier_bytes=tier, last_seen=100.0)


def test_the_budget_is_the_edit_share_of_the_ready_workers_memory_less_their_pins() -> None:
    p = fleet(worker("a", pinned=300), worker("b", pinned=100), worker("c", ready=False))
    # 0.5 x 2000 bytes of ready memory at 10 bytes a token; 400 pinned bytes = 40 tokens.
    assert edit_budget(p) == EditBudget(tokens=100, older_tokens=60, rest=0)


def test_pins_past_the_budget_leave_older_dependents_nothing() -> None:
    p = fleet(worker("a", pinned=900))
    assert edit_budget(p) == EditBudget(tokens=50, older_tokens=0, rest=0)


def test_the_rest_is_re_warmed_only_where_every_ready_worker_spills_to_a_tier() -> None:
    assert edit_budget(fleet(worker("a", tier=1), worker("b", tier=5))).rest == 7
    assert edit_budget(fleet(worker("a", tier=1), worker("b"))).rest == 0
    assert edit_budget(fleet(worker("a", tier=1), worker("b", ready=False))).rest == 7
    assert edit_budget(fleet()) == EditBudget(tokens=0, older_tokens=0, rest=0)
