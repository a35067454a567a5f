"""`ragwarm query "…"`: one question through the cache-aware RAG client."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import click

from ragwarm.client.fallback import ROUTED
from ragwarm.client.rag import Answer


def summary_lines(answer: Answer) -> list[str]:
    worker_ttft = (f" (worker {answer.worker_ttft_ms:.1f} ms)"
                   if answer.worker_ttft_ms is not None else "")
    lines = [
        f"ttft:    {answer.ttft_ms:.1f} ms{worker_ttft}, end to end {answer.e2e_ttft_ms:.1f} ms "
        f"(retrieval {answer.retrieve_ms:.1f} ms, routing {answer.route_ms:.1f} ms)",
        f"cached:  {answer.cached_tokens} of {answer.prompt_tokens} prompt tokens "
        f"(prefix {answer.prefix_tokens})",
        f"worker:  {answer.worker_id}" + (f", after {', '.join(answer.failed_workers)} failed"
                                          if answer.failed_workers else "")
        + (f" ({answer.routing})" if answer.routing != ROUTED else ""),
        f"sources: {', '.join(r.chunk_id for r in answer.chunk_refs) or '(none)'}",
    ]
    return lines


@click.command()
@click.argument("question")
@click.option("--tenant", default=None, help="Tenant (default: RAGWARM_CLIENT_TENANT).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=None,
              help="Tokens to generate (default: RAGWARM_CLIENT_MAX_TOKENS).")
@click.option("--json", "as_json", is_flag=True, help="Print the answer as one JSON object.")
def query(question: str, tenant: str | None, max_tokens: int | None, as_json: bool) -> None:
    """Ask QUESTION: retrieve the top-3 chunks, route to the worker holding the prompt's
    prefix, stream the answer, and print TTFT, cached tokens and the worker."""
    from ragwarm.client.rag import ClientError, RagClient, quiet_http_logs
    from ragwarm.kafka.common import KafkaUnreachable, quiet_client_logs
    from ragwarm.models import ModelMissing

    quiet_client_logs()
    quiet_http_logs()
    if not question.strip():
        raise click.UsageError("QUESTION is empty")
    from ragwarm.client.wire import StreamsUnavailable

    on_token = None if as_json else (lambda text: click.echo(text, nl=False))
    try:
        try:
            with RagClient.open() as client:
                answer = client.query(question, tenant, max_tokens, on_token)
        except StreamsUnavailable as exc:
            click.echo(f"{exc}\nAnswering without it: reading rag.chunks and worker.events "
                       "in this process, as the gateway does (slower to start).", err=True)
            answer = asyncio.run(answer_alone(question, tenant, max_tokens, on_token))
    except (ClientError, ModelMissing, KafkaUnreachable) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(answer.to_json()))
        return
    click.echo("\n")
    for line in summary_lines(answer):
        click.echo(line)


async def answer_alone(question: str, tenant: str | None, max_tokens: int | None,
                       on_token: Callable[[str], None] | None,
                       catch_up_s: float = 300.0) -> Answer:
    """One answer while the streams app is down: the gateway's own path in this process (a
    replica of the index from rag.chunks, unless a Qdrant server is set, and a view of the
    workers from worker.events), read up to the topics' ends before the question is asked."""
    from ragwarm.cli.tree import tree_of
    from ragwarm.client.independent import open_gateway_client
    from ragwarm.client.settings import ClientSettings
    from ragwarm.gateway.app import own_path
    from ragwarm.gateway.settings import GatewaySettings

    async def echo(text: str) -> None:
        if on_token is not None:
            on_token(text)

    tree = tree_of()
    client = await open_gateway_client(own_path(tree.get(GatewaySettings)),
                                       tree.get(ClientSettings), tree.models)
    async with client:
        deadline = time.monotonic() + catch_up_s
        for feed in client.feeds:
            while not feed.caught_up.is_set():
                if time.monotonic() > deadline:
                    raise click.ClickException(
                        f"{feed.topic} not read to its end within {catch_up_s:.0f} s "
                        f"({feed.records} records so far); is Kafka up?")
                await asyncio.sleep(0.2)
        return await client.query(question, tenant, max_tokens, echo)
