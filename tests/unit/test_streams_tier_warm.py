"""A ready worker with a KV tier below device memory: after device memory's share, the next
most used tracked prefixes are warmed into the tier (`WarmupCommand.placement == "tier"`),
within its free room, and none that device memory takes or the worker holds."""

from __future__ import annotations

from schemas import WorkerEvent
from streams.decide import logic
from streams.decide.records import PrefixOp, PrefixState, WorkerState
from streams.handle import handlers
from streams.sim import run_sync
from tests.unit.conftest import REFS, Port, pipeline

PER_TOKEN = 10  # 32 tokens a prefix: 320 bytes


def _tracked(p, names: str) -> None:
    # Updated later = used more recently: "1" is the least used, the last the most.
    for i, name in enumerate(names):
        p.tables.prefix_states[name * 64] = PrefixState(
            tenant="default", chunk_refs=REFS, token_ids=[7] * 32, expires_at=150.0,
            updated_at=50.0 + i,
        )


def _ready(**kw) -> WorkerEvent:
    return WorkerEvent(worker_id="w2", kind="ready", mem_total_bytes=700, **kw)


def test_a_ready_worker_with_a_tier_gets_the_next_prefixes_placed_there() -> None:
    p, out = pipeline(Port({("default", "d.md#0"): "1" * 64}), prefix_ttl_s=60.0,
                      hot_tokens=False, kv_bytes_per_token=PER_TOKEN, warmup_steps=1)
    _tracked(p, "12345")
    run_sync(handlers.on_worker_event(p, _ready(tier_total_bytes=1_000, tier_bytes=300)))
    sent = [(o.prefix_hash[0], o.tier) for o in out.ops]
    # Device memory takes the two most used (least used of them first); the tier's 700 free
    # bytes the next two, most used first; the least used stays cold.
    assert sent == [("4", False), ("5", False), ("3", True), ("2", True)]
    assert {o.reason for o in out.ops if o.tier} == {"worker ready (KV tier)"}
    assert p.stats["ready_tier_warms"] == 2
    for op in out.ops:
        run_sync(handlers.on_prefix_op(p, op))
    placements = {c.prefix_hash[0]: c.placement for c in out.commands}
    assert placements == {"4": "device", "5": "device", "3": "tier", "2": "tier"}
    assert {c.worker_id for c in out.commands} == {"w2"} and not any(c.pin for c in out.commands)


def test_no_tier_or_the_setting_off_warms_device_memory_only() -> None:
    for tier_total, on in ((0, True), (1_000, False)):
        p, out = pipeline(Port({("default", "d.md#0"): "1" * 64}), prefix_ttl_s=60.0,
                          hot_tokens=False, kv_bytes_per_token=PER_TOKEN, warmup_steps=1,
                          tier_warmup=on)
        _tracked(p, "12345")
        run_sync(handlers.on_worker_event(p, _ready(tier_total_bytes=tier_total)))
        assert [(o.prefix_hash[0], o.tier) for o in out.ops] == [("4", False), ("5", False)]


def test_the_tier_share_goes_with_the_last_step_and_skips_what_the_worker_holds() -> None:
    p, out = pipeline(Port({("default", "d.md#0"): "1" * 64}), prefix_ttl_s=60.0,
                      hot_tokens=False, kv_bytes_per_token=PER_TOKEN, warmup_steps=2)
    _tracked(p, "12345")
    run_sync(handlers.on_worker_event(p, _ready(tier_total_bytes=1_000)))
    assert not any(o.tier for o in out.ops)  # step 1 of 2: device memory only
    out.ops.clear()
    beat = WorkerEvent(worker_id="w2", kind="heartbeat", mem_total_bytes=700, mem_used_bytes=320,
                       warm_prefixes=["5" * 64], tier_prefixes=["3" * 64],
                       tier_total_bytes=1_000, tier_bytes=320)
    run_sync(handlers.on_worker_event(p, beat))
    tier = [o.prefix_hash[0] for o in out.ops if o.tier]
    assert tier == ["2", "1"]  # "3" is in its tier already; 680 bytes free hold two


def test_a_worker_past_the_threshold_still_gets_its_tier_share() -> None:
    p, out = pipeline(Port({("default", "d.md#0"): "1" * 64}), prefix_ttl_s=60.0,
                      hot_tokens=False, kv_bytes_per_token=PER_TOKEN, warmup_steps=2)
    _tracked(p, "12345")
    run_sync(handlers.on_worker_event(p, _ready(tier_total_bytes=1_000)))
    out.ops.clear()
    beat = WorkerEvent(worker_id="w2", kind="heartbeat", mem_total_bytes=700, mem_used_bytes=690,
                       tier_total_bytes=1_000)
    run_sync(handlers.on_worker_event(p, beat))
    assert out.ops and all(o.tier for o in out.ops)  # no device step: the tier's share only
    assert p.stats["warm_steps_stopped"] == 1
    state = p.tables.worker_states["w2"]
    assert isinstance(state, WorkerState) and state.warm_step == 0 and state.tier_total == 1_000


def test_a_lost_tier_prefill_is_resent_to_a_tier_and_a_device_one_to_the_device() -> None:
    p, out = pipeline(Port({("default", "d.md#0"): "1" * 64}), prefix_ttl_s=60.0,
                      hot_tokens=False, kv_bytes_per_token=PER_TOKEN, warmup_steps=1)
    _tracked(p, "12345")
    run_sync(handlers.on_worker_event(p, _ready(tier_total_bytes=1_000, tier_bytes=300)))
    for op in out.ops:
        run_sync(handlers.on_prefix_op(p, op))
    sent = {c.prefix_hash: c.placement for c in out.commands}
    assert sorted(sent.values()) == ["device", "device", "tier", "tier"]
    assert {h[0] for h, place in sent.items() if p.tables.prefix_states[h].tier} == {"2", "3"}
    # No worker confirmed any of them: each is sent again where it was going.
    for prefix_hash, placement in sent.items():
        state = p.tables.prefix_states[prefix_hash]
        plan = logic.plan_prefix_op(PrefixOp(op="resend", prefix_hash=prefix_hash), state,
                                    [WorkerState(worker_id="w2", ready=True, mem_total=700,
                                                 tier_total=1_000)],
                                    state.prefill_at + 30.0, 60.0)
        (cmd,) = plan.commands
        assert (cmd.op, cmd.placement, plan.state.tier) == ("prefill", placement,
                                                            placement == "tier")
