"""The model-free engine of the simulation harness (`workers.sim`): `CostEngine` keeps the
same cache bookkeeping as the torch engine (prefills and request caching admit entries to the
same `PrefixCache`, lookups match the same block chains, chunk KV is donated and blended by the
same plans) and computes no prompt. Its TTFT is a linear cost model (fixed cost + cost per
prompt token not served from cache) fitted by least squares to a query log's own measured
`ttft_ms`, `prompt_tokens`, `cached_tokens` (`fit_cost`). With `tier_bytes` it keeps a host
KV tier as the torch engine's `HostTier` does (the same index and journal, no tensors): an
evicted block spills there and a hit past the device's chain reads it back at
`restore_per_token_ms`, by the torch engine's own books (`PrefixEngine._restore`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace

from schemas import QueryEvent
from schemas.prefix import prefix_kv_bytes
from workers.engines.base import PrefixEngine, Request
from workers.engines.protocol import GenerationResult, GenerationStep
from workers.kv.blend_cost import BlendCosts, blend_computed, moved_layer_share
from workers.kv.cache import PrefixCache, WarmupRefused
from workers.kv.chunk_kv import DonorIndex, plan_pieces
from workers.kv.memory import Budget
from workers.kv.plan import KVPlan
from workers.kv.request_blocks import make_prefix_cache
from workers.kv.tier_index import TierIndex
from workers.kv.tier_journal import TierJournal, absorb


def make_cache(budget: Budget, clock: Callable[[], float], block_size: int,
               policy: str = "lru", request_caching: str = "entry") -> PrefixCache:
    """A prefix cache on the simulated clock, evicting by `policy` (the policy's worker:
    `Policy.eviction`), request caching per `request_caching` ("block" or "entry", as
    `RAGWARM_WORKER_REQUEST_CACHING`); entries live until evicted unless a TTL is given
    (request caching, like vLLM's, has no TTL)."""
    return make_prefix_cache(request_caching, budget, policy=policy, clock=clock,
                             default_ttl_s=None, block_size=block_size)


# Fallback cost model: SmolLM2-135M, torch engine, 1 thread on a shared 2-core CPU, fitted
# to the 504 rows of run B of `ragwarm bench strategies --quick` (docs/lab/benchmarks-notebook.md).
DEFAULT_COST = (127.0, 3.14)  # (ms fixed, ms per uncached prompt token)

# Reading a token's KV back from the host tier: `ragwarm bench engine --tier host` on the same
# CPU (docs/results.md, 2026-12-04) restored a 512-token prefix and answered in 242 ms
# against 218 ms from the device cache, ~0.05 ms a token, 1/60 of computing it. On a GPU a
# copy over PCIe is cheaper still against its prefill; this errs on the slow side.
DEFAULT_RESTORE_PER_TOKEN_MS = 0.05


# The default selection (`workers.engines.blend.Selection`: hkvd checked at layers 1, 4, 10,
# keeping 2x, 1.41x, 1x the share) on SmolLM2-135M's 30 layers; this module imports no torch.
_CHECKS, _WIDEN, _LAYERS = (1, 4, 10), 2.0, 30
DEFAULT_SHARE = 0.3  # `Selection.share`, where no calibration passes


def moved_cost(share: float) -> float:
    """A moved token's cost in a blend at recompute `share`, as a share of a computed one:
    the layers the default selection runs it through (`moved_layer_share`; 0.378 at 0.3). At
    0.3 it predicts a blend of Argo CD's prompts (p50 582 tokens, ~87% moved) at 46% of the
    full prefill; `bench blend` measured 40% (docs/lab/benchmarks-notebook.md, 2026-11-30), so
    it errs on the slow side. It is not the calibration's `ttft_ratio`: that one's blends
    found the first chunk's KV as an exact prefix (chunk warmups store `opening + chunk`),
    so it credits blending with an exact hit (docs/lab/2026-12-07-blend-cost-model.md)."""
    return moved_layer_share(share, _CHECKS, _WIDEN, _LAYERS)


def calibrated_share(model_id: str) -> float:
    """The recompute share a default worker blends `model_id` at: its stored calibration's
    chosen share (DEFAULT_SHARE where none passes), so that the model-free bench blends at
    the worker's share and charges what that share computes (`CostModel.for_share`)."""
    from workers.calibration import load_calibration

    calibration = load_calibration(model_id)
    if calibration is None or not calibration.passed or calibration.share is None:
        return DEFAULT_SHARE
    return calibration.share


@dataclass(frozen=True)
class CostModel:
    """TTFT ≈ fixed_ms + per_token_ms × (prompt tokens − cached tokens); a blend at
    `recompute_share` computes the tokens no chunk KV covers and pays `moved_share` of a
    token for each moved one (`moved_cost` of that share)."""

    fixed_ms: float
    per_token_ms: float
    fitted_on: int = 0  # measured queries behind the fit (0: the default figures)
    moved_share: float = moved_cost(DEFAULT_SHARE)
    restore_per_token_ms: float = DEFAULT_RESTORE_PER_TOKEN_MS
    recompute_share: float = DEFAULT_SHARE

    def for_share(self, share: float) -> CostModel:
        """This model for a worker blending at `share` (what it recomputes, and its cost)."""
        return replace(self, recompute_share=share, moved_share=moved_cost(share))

    def ttft_ms(self, prompt_tokens: int, cached_tokens: int) -> float:
        return self.fixed_ms + self.per_token_ms * max(0, prompt_tokens - cached_tokens)

    def blend_ttft_ms(self, prompt_tokens: int, cached_tokens: int, moved: int) -> float:
        uncovered = max(0, prompt_tokens - cached_tokens - moved)
        return self.fixed_ms + self.per_token_ms * (uncovered + self.moved_share * moved)


def fit_cost(events: Iterable[QueryEvent]) -> CostModel:
    """Least-squares line of measured TTFT against uncached prompt tokens; the default
    figures when the log has fewer than two distinct uncached sizes."""
    points = [(e.prompt_tokens - e.cached_tokens, e.ttft_ms) for e in events
              if e.ttft_ms is not None and e.prompt_tokens > 0]
    xs = [float(x) for x, _ in points]
    if len(set(xs)) < 2:
        return CostModel(*DEFAULT_COST)
    n, mx = len(points), sum(xs) / len(points)
    my = sum(float(y) for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (float(y) - my) for x, (_, y) in zip(xs, points, strict=True)) / sxx
    slope = max(slope, 0.0)
    return CostModel(max(my - slope * mx, 0.0), slope, n)


@dataclass
class SimTier:
    """A host KV tier without tensors: the torch engine's tiers' index (`KVTier.index`)."""

    index: TierIndex


class CostEngine(PrefixEngine[int]):
    """An engine that holds only each entry's size and answers in estimated time."""

    # No model: no device, no vocabulary beyond the one token it answers with, no context
    # limit of its own (`Limits` bound the prompts, as for every engine).
    device = "none (cost model)"
    vocab_size = 1
    max_model_len = 1 << 30

    def __init__(self, cost: CostModel, cache: PrefixCache, *, model_id: str,
                 kv_bytes_per_token: int, tier_bytes: int = 0) -> None:
        self.cost = cost
        self.cache = cache
        self.model_id = model_id
        self.block_size = cache.block_size
        self.kv_bytes_per_token = kv_bytes_per_token
        self.tokenizer = None
        self._held: dict[str, int] = {}
        # The same donation bookkeeping as the torch engine: a blend's cost needs no tensors.
        self.donors = DonorIndex(self.block_size)
        self.blend_costs = BlendCosts()  # the torch engine's `ChunkBlender.costs`
        self.tier = SimTier(TierIndex(tier_bytes)) if tier_bytes > 0 else None
        self._read_blocks = 0  # blocks read back from the tier, ever
        if self.tier is not None:
            cache.tier = TierJournal(write_through=False)  # a host tier

    def apply(self, plan: KVPlan) -> int:
        if self.tier is not None:
            absorb(self.tier.index, plan.store, _Everything())  # no tensors to miss
        return super().apply(plan)

    def tier_state(self) -> tuple[list[str], int]:
        if self.tier is None:
            return [], 0
        return self.tier.index.prefix_ends(), self.tier.index.bytes_used

    def tier_total(self) -> int:
        return 0 if self.tier is None else self.tier.index.max_bytes

    def restorable(self, hashes: list[str], have: int) -> int:
        return 0 if self.tier is None else self.tier.index.run(hashes, have)

    def _tier_index(self) -> TierIndex | None:
        return None if self.tier is None else self.tier.index

    def _load(self, hashes: list[str]) -> list[None]:
        """No tensors to read: every block the tier holds comes back, and the read counts as
        a use of it (as `KVTier.load` touches what it read)."""
        if self.tier is None:
            return []
        self.tier.index.touch(hashes)
        self._read_blocks += len(hashes)  # charged to the request that reads them
        return [None] * len(hashes)

    @property
    def block_bytes(self) -> int:
        return self.kv_bytes_per_token * self.block_size

    def _held_bytes(self, held: int) -> int:
        return held

    def _prefix_kv(self, tokens: list[int], hashes: list[str], tenant: str) -> tuple[int, int]:
        # Blocks are shared: whatever chain is cached is reused, whoever stored it.
        matched = self._held_run(hashes, tenant)
        nbytes = prefix_kv_bytes(len(tokens), self.kv_bytes_per_token, self.block_size)
        return nbytes, len(tokens) - matched * self.block_size

    def _generate(self, request: Request) -> Iterator[GenerationStep]:
        start = time.perf_counter()
        prompt = request.prompt
        hashes = self.block_hashes(prompt, tenant=request.tenant)
        read = self._read_blocks
        entry, matched = self._reusable(hashes, request.tenant)
        restore_ms = self.cost.restore_per_token_ms * (self._read_blocks - read) * self.block_size
        cached = min(matched * self.block_size, len(prompt) - 1)
        exact_run = self.cache.pool.exact_run(hashes[:matched])
        approx_cached = max(0, cached - exact_run * self.block_size)
        self._donate(request.tenant, prompt, request.chunks, hashes[:matched])  # as torch does
        stored = None
        keep = request.keep
        ttft_ms, moved = self._ttft_ms(request, cached)
        ttft = (ttft_ms + restore_ms) / 1000.0
        # A blended prompt is stored too, as the torch engine stores it (`Block.approx`).
        if keep is not None and hashes and matched < len(hashes):
            n_tokens = len(hashes) * self.block_size
            nbytes = prefix_kv_bytes(n_tokens, self.kv_bytes_per_token, self.block_size)
            try:
                spans = request.chunks
                admitted, evicted = self.cache.admit(
                    tenant=request.tenant, hashes=hashes,
                    nbytes=nbytes, chunk_refs=[*keep.chunk_refs, *(s.ref for s in spans)],
                    ttl_s=keep.ttl_s, kind="request",
                    chunk_starts={s.ref: s.start for s in spans},
                    approx_from=cached // self.block_size if moved else None,
                )
                stored = self._record(admitted, nbytes, evicted,
                                      n_tokens - cached, start)
                self._donate(request.tenant, prompt, spans, hashes)
            except WarmupRefused:
                stored = None  # the answer matters more than caching its prompt
        result = GenerationResult(
            token_ids=(0,), text="", prompt_tokens=len(prompt), cached_tokens=cached,
            prefix_hash=entry.prefix_hash if entry else None, ttft_s=ttft, total_s=ttft,
            finish_reason="length", stored=stored, blended_tokens=moved,
            approx_cached_tokens=approx_cached,
        )
        yield GenerationStep(0, 0, "", result)

    def _ttft_ms(self, request: Request, cached: int) -> tuple[float, int]:
        """The request's TTFT and the tokens it blends, decided as the torch engine decides
        (`ChunkBlender.blend`): by the same estimate (`BlendCosts`), fed the cost model's
        times where the torch engine feeds it its own. So it blends where the worker would,
        not wherever the cost model says a blend is cheaper: until two blends were timed the
        estimate tries only blends that compute at most half the cold tokens, which at the
        shipped calibration's share of 0.9 none does (nor would it pay: `moved_cost`)."""
        cold_tokens = max(0, len(request.prompt) - cached)
        cold = self.cost.ttft_ms(len(request.prompt), cached)
        moved = 0
        if request.chunk_reuse and request.chunks:
            donors = self.chunk_donors(request.tenant, request.prompt, request.chunks, cached)
            plans = plan_pieces(request.chunks, cached, {r: d.held for r, d in donors.items()})
            moved = sum(plan.count for plan in plans)
        computed = blend_computed(cold_tokens - moved, moved, self.cost.recompute_share)
        if moved and self.blend_costs.worth(cold_tokens, computed, moved):
            blended = self.cost.blend_ttft_ms(len(request.prompt), cached, moved)
            self.blend_costs.saw_blend(computed, moved, blended / 1000)
            return blended, moved
        if cold_tokens >= self.block_size:  # as the torch engine samples its forwards
            self.blend_costs.saw_prefill(cold_tokens, cold / 1000)
        return cold, 0


class _Everything:
    """Every block's KV is "available" to a tier without tensors."""

    def __contains__(self, item: object) -> bool:
        return True
