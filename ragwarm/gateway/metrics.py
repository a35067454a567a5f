"""Prometheus metrics of the gateway, in a registry of its own (no global state).

Requests are counted by route and status by a middleware, so refusals (401, 400, 503)
count too; answers add what only an answer knows: cached tokens, retrieval time, time to
first token as the app sees it, and how often a worker failed and the next one answered.
A streamed answer's status is 200 once its headers went out, whatever came after; a
failure mid-stream is counted in `ragwarm_gateway_stream_errors_total`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ragwarm.client.rag import Answer

CONTENT_TYPE = CONTENT_TYPE_LATEST
# A request spans a refused key (~1 ms) to a cold 4k-token prompt on two CPU cores (~1 min).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
RETRIEVAL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
UNMATCHED = "unmatched"  # the route label of a path no route serves (bounded cardinality)


class GatewayMetrics:
    """The metrics the gateway exports on `/metrics`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("ragwarm_gateway_requests_total", "HTTP requests answered.",
                                ["route", "status"], registry=r)
        self.latency = Histogram("ragwarm_gateway_request_duration_seconds",
                                 "Seconds from request arrival to the last byte sent.",
                                 ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self.answers = Counter("ragwarm_gateway_answers_total", "Answers completed.",
                               ["stream"], registry=r)
        self.prompt_tokens = Counter("ragwarm_gateway_prompt_tokens_total",
                                     "Prompt tokens of the answers.", registry=r)
        self.cached_tokens = Counter("ragwarm_gateway_cached_tokens_total",
                                     "Prompt tokens the worker served from its KV cache.",
                                     registry=r)
        self.retrieval = Histogram("ragwarm_gateway_retrieval_duration_seconds",
                                   "Seconds to retrieve a question's chunks.",
                                   buckets=RETRIEVAL_BUCKETS, registry=r)
        self.ttft = Histogram("ragwarm_gateway_time_to_first_token_seconds",
                              "Seconds from request to first token: retrieval, routing and "
                              "the worker's prefill.", buckets=LATENCY_BUCKETS, registry=r)
        self.failovers = Counter("ragwarm_gateway_failovers_total",
                                 "Workers that failed a request another worker then answered.",
                                 registry=r)
        self.stream_errors = Counter("ragwarm_gateway_stream_errors_total",
                                     "Streams that ended with an error event.", registry=r)

    def request(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route=route, status=str(status)).inc()
        self.latency.labels(route=route).observe(seconds)

    def answered(self, answer: Answer, *, stream: bool) -> None:
        self.answers.labels(stream=str(stream).lower()).inc()
        self.prompt_tokens.inc(answer.prompt_tokens)
        self.cached_tokens.inc(answer.cached_tokens)
        self.retrieval.observe(answer.retrieve_ms / 1000)
        self.ttft.observe(answer.e2e_ttft_ms / 1000)
        self.failovers.inc(len(answer.failed_workers))

    def render(self) -> bytes:
        return generate_latest(self.registry)
