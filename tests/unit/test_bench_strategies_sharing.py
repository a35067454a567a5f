"""Policies whose request is the same computation share one TTFT measurement."""

from __future__ import annotations

from ragwarm.bench.strategies.lanes import SimClock
from workers.cost_engine import CostEngine, CostModel, make_cache
from workers.kv.blend_cost import BlendCosts
from workers.kv.memory import Budget
from workers.sim import MeasurementMemo, Measurements, SimWorker

PROMPT = list(range(100))  # 6 full blocks of 16 and 4 tokens


class CountingEngine(CostEngine):
    """A cost engine whose every run takes a little longer, so runs are told apart."""

    runs = 0

    def _generate(self, request):
        type(self).runs += 1
        for step in super()._generate(request):
            result = step.result
            if result is not None:
                bumped = result.ttft_s + CountingEngine.runs / 1e6
                step = type(step)(step.index, step.token_id, step.text,
                                  type(result)(**{**result.__dict__, "ttft_s": bumped}))
            yield step


def worker(clock: SimClock, name: str, *, caching: bool = True,
           blending: bool = False) -> SimWorker:
    cache = make_cache(Budget(10**9, 1000, 10**9), clock, 16)
    engine = CountingEngine(CostModel(100.0, 1.0), cache, model_id="m", kv_bytes_per_token=1)
    if blending:  # tries any blend computing fewer tokens (the sharing is tested, not the gate)
        engine.blend_costs = BlendCosts(explore_ratio=1.0)
    return SimWorker(engine, clock, worker_id=name, cache_requests=caching, ttft_runs=3,
                     chunk_reuse=blending)


def test_same_cached_tokens_share_one_measurement_and_others_measure_their_own():
    clock = SimClock()
    warm_a, warm_b, cold = worker(clock, "a"), worker(clock, "b"), worker(clock, "c")
    for w in (warm_a, warm_b):  # both already served this prompt: a full-prompt hit
        w.serve(PROMPT, "t", [])
    CountingEngine.runs = 0
    shared = Measurements()
    first = warm_a.serve(PROMPT, "t", [], shared)
    assert CountingEngine.runs == 3  # two trials, then the request as deployed
    second = warm_b.serve(PROMPT, "t", [], shared)
    assert CountingEngine.runs == 4  # run once, as deployed, for its cache; not timed
    assert second.ttft_s == first.ttft_s and second.result.cached_tokens == 96
    third = cold.serve(PROMPT, "t", [], shared)
    assert CountingEngine.runs == 7 and third.result.cached_tokens == 0  # its own measurement
    assert len(shared) == 2 and shared.reused == 1 and warm_b.reruns == 1


def test_trials_touch_nothing_so_a_measured_request_counts_one_hit_like_a_shared_one():
    clock = SimClock()
    measured, sharing = worker(clock, "a"), worker(clock, "b")
    for w in (measured, sharing):
        w.serve(PROMPT, "t", [])  # the prompt's entry, stored by its first ask
    (entry_a,), (entry_b,) = measured.cache.entries(), sharing.cache.entries()
    hits = entry_a.hits, entry_b.hits
    shared = Measurements()
    measured.serve(PROMPT, "t", [], shared)  # two trials, then the request
    sharing.serve(PROMPT, "t", [], shared)  # the request alone
    assert (entry_a.hits, entry_b.hits) == (hits[0] + 1, hits[1] + 1)
    assert measured.cache.touching and sharing.cache.touching


def test_a_request_with_no_effect_reuses_without_running():
    clock = SimClock()
    caching, plain = worker(clock, "a"), worker(clock, "none", caching=False)
    shared = Measurements()
    first = caching.serve(PROMPT, "t", [], shared)
    CountingEngine.runs = 0
    again = plain.serve(PROMPT, "t", [], shared)
    assert CountingEngine.runs == 0  # nothing to store, nothing cached to touch
    assert again.ttft_s == first.ttft_s and again.result.prefix_hash is None
    assert len(plain.cache) == 0


def test_the_lower_median_of_the_runs_is_reported():
    clock = SimClock()
    CountingEngine.runs = 0
    served = worker(clock, "a").serve(PROMPT, "t", [], Measurements())
    base = CostModel(100.0, 1.0).ttft_ms(100, 0) / 1000
    assert served.ttft_s == base + 2 / 1e6  # runs 1, 2, 3: the median one


def test_per_query_memo_measures_every_ask():
    memo = MeasurementMemo()
    first = memo.for_query(PROMPT)
    first.record(0, None, 1.0)  # type: ignore[arg-type]
    assert memo.for_query(PROMPT) is not first and len(memo.for_query(PROMPT)) == 0


def test_run_wide_memo_reuses_an_earlier_query_of_the_same_computation():
    clock = SimClock()
    warm, plain = worker(clock, "a"), worker(clock, "none", caching=False)
    memo = MeasurementMemo(across_queries=True)
    first_ask = [w.serve(PROMPT, "t", [], memo.for_query(PROMPT)) for w in (warm, plain)]
    CountingEngine.runs = 0
    again = memo.for_query(PROMPT)
    plain_again = plain.serve(PROMPT, "t", [], again)
    assert CountingEngine.runs == 0  # same prompt, nothing cached: the first ask's figure
    assert plain_again.ttft_s == first_ask[1].ttft_s
    warm_again = warm.serve(PROMPT, "t", [], again)
    # Now 96 tokens cached: another computation, measured (two trials and the request).
    assert CountingEngine.runs == 3 and warm_again.result.cached_tokens == 96
    third = memo.for_query(PROMPT)
    assert warm.serve(PROMPT, "t", [], third).ttft_s == warm_again.ttft_s
    assert CountingEngine.runs == 4  # run once, as deployed, for its cache; not timed
    assert len(third) == 2 and third.reused == 3  # none twice, then warm's third ask
    other = list(range(1, 101))
    assert len(memo.for_query(other)) == 0  # another prompt measures its own


def test_a_blending_worker_shares_only_where_no_chunk_kv_is_held():
    from schemas import ChunkRef
    from workers.kv.chunk_kv import ChunkSpan

    clock = SimClock()
    exact, blending = worker(clock, "a"), worker(clock, "b", blending=True)
    ref = ChunkRef(chunk_id="d#0", content_hash="0" * 16)
    spans = [ChunkSpan((ref.chunk_id, ref.content_hash), 20, 60)]
    shared = Measurements()
    exact.serve(PROMPT, "t", [ref], shared, spans)
    nothing_held = blending.serve(PROMPT, "t", [ref], shared, spans)
    assert nothing_held.chunk_kv == (0, 40) and shared.reused == 1  # the exact computation
    # Its stored prompt donated the chunk: another prompt with it may blend, and measures.
    other = [*range(200, 220), *PROMPT[20:60], *range(300, 340)]
    moved = [ChunkSpan((ref.chunk_id, ref.content_hash), 20, 60)]
    answer = blending.serve(other, "t", [ref], Measurements(), moved)
    assert answer.chunk_kv[0] > 0 and answer.result.blended_tokens == answer.chunk_kv[0]
    assert blending.own_measurements == 1
