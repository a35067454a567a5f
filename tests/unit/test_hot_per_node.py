"""Seed 000, deployment: "keep ≥1 hot instance per node" — the rule and the hot-set plan."""

from __future__ import annotations

from schemas import WorkerEvent
from streams.decide.fleet import MIN_HOT_PER_NODE, apply_worker_event, hot_targets
from streams.decide.records import WorkerState
from streams.handle import handlers
from streams.sim import run_sync
from tests.unit.conftest import P1, Port, pipeline, query


def worker(wid: str, node: str | None, *, held=(), used=0, pinned=0, ready=True) -> WorkerState:
    return WorkerState(
        worker_id=wid, node=node, ready=ready, mem_total=1000, mem_used=used, pinned=pinned,
        prefixes=list(held), last_seen=100.0,
    )


def test_the_seed_keeps_one_hot_instance_per_node() -> None:
    assert MIN_HOT_PER_NODE == 1  # seed 000: "每节点至少保留1个热实例"


def test_every_node_without_a_holder_gets_its_roomiest_worker() -> None:
    workers = [
        worker("w1", "n1", held=[P1]),
        worker("w2", "n1"),
        worker("w3", "n2", used=600),
        worker("w4", "n2", used=100),  # more room: the cold weight 1 - 0.1^2
        worker("w5", "n3", ready=False),  # a node with no ready worker cannot hold it
    ]
    assert hot_targets(P1, workers) == ["w4"]
    assert hot_targets("b" * 64, workers) == ["w1", "w4"]  # ties go to the lower id


def test_a_node_whose_workers_are_over_the_warmup_threshold_takes_none() -> None:
    workers = [worker("w1", "n1", pinned=800), worker("w2", "n2")]
    assert hot_targets(P1, workers) == ["w2"]


def test_workers_reporting_no_node_count_as_one() -> None:
    # Events before v4 carry no node: the old placement (one worker) holds.
    workers = [worker("w1", None, held=[P1]), worker("w2", None)]
    assert hot_targets(P1, workers) == []
    assert hot_targets(P1, [worker("w1", None), worker("w2", None)]) == ["w1"]


def test_the_node_comes_from_the_workers_events() -> None:
    row = apply_worker_event(None, WorkerEvent(worker_id="w", kind="ready", node="n7"), 1.0)
    assert row.node == "n7"
    later = apply_worker_event(row, WorkerEvent(worker_id="w", kind="heartbeat"), 2.0)
    assert later.node == "n7"  # an event without one (an older worker's) keeps what is known


def two_nodes(p, *, held: bool) -> None:
    for wid, node in (("w1", "n1"), ("w2", "n2")):
        row = worker(wid, node, held=[P1] if held and wid == "w1" else [])
        p.tables.worker_states[wid] = row


def test_a_hot_prefix_held_on_one_node_is_warmed_on_the_other() -> None:
    port = Port({("default", "d.md#0"): "1" * 64})
    p, out = pipeline(port, hot_min_count=1.0, track_queries=False, kv_bytes_per_token=1)
    for _ in range(2):
        run_sync(handlers.on_query(p, query()))
    run_sync(handlers.plan_hot(p))  # new: the prefix's owner places it (one worker)
    out.ops.clear()
    two_nodes(p, held=True)
    run_sync(handlers.plan_hot(p))
    assert [(o.op, o.target_worker, o.pin) for o in out.ops] == [("warm_on", "w2", True)]


def test_a_new_hot_prefix_goes_to_the_owners_pick_and_to_every_other_node() -> None:
    port = Port({("default", "d.md#0"): "1" * 64})
    p, out = pipeline(port, hot_min_count=1.0, track_queries=False, kv_bytes_per_token=1)
    two_nodes(p, held=False)
    for _ in range(2):
        run_sync(handlers.on_query(p, query()))
    run_sync(handlers.plan_hot(p))
    # choose_worker picks w1 (equal room, lower id): n1 is covered by the untargeted op.
    assert [(o.op, o.target_worker) for o in out.ops] == [("warm", None), ("warm_on", "w2")]
    assert p.stats["hot_per_node"] == 1
