"""Question tails: a prefill of a tracked prefix also warms the prompts its questions send.

A repeat of a question reuses, with request caching, its whole prompt; a prefix warmed
without its question leaves the question's tokens to compute at every ask (tens of
milliseconds on a CPU), so a policy that re-warms prefixes after edits, evictions or a
restart lost its median to plain request caching. The tails ride on the prefix's own
blocks: each costs the KV of a few blocks, is unpinned (evicted before the prefix) and
is invalidated with the prefix, since it has the same chunk refs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from schemas import WarmupCommand
from streams.deps import HandlerDeps
from streams.logic import PrefixPlan, command_id
from streams.records import PrefixState


def question_prefills(
    commands: Sequence[WarmupCommand],
    state: PrefixState | None,
    tails: Callable[[str], list[int]],
    limit: int,
    new_id: Callable[[], str],
) -> list[WarmupCommand]:
    """`commands`, each prefill of the prefix followed by one per question of `state` (the
    last asked first, `limit` at most): its tokens and then the question's (`tails`)."""
    questions = state.questions[:limit] if state is not None else []
    out: list[WarmupCommand] = []
    for cmd in commands:
        out.append(cmd)
        if cmd.op != "prefill" or not cmd.token_ids:
            continue
        for question in questions:
            if ids := tails(question):
                out.append(cmd.model_copy(update={
                    "command_id": new_id(), "token_ids": [*cmd.token_ids, *ids], "pin": False,
                    "reason": f"{cmd.reason}: an asked question".lstrip(": "),
                }))
    return out


async def with_question_tails(p: HandlerDeps, plan: PrefixPlan) -> list[WarmupCommand]:
    """The plan's commands with their question tails (`RAGWARM_STREAMS_WARM_QUESTION_TAILS`)."""
    limit = p.settings.warm_question_tails
    if not limit or not any(c.op == "prefill" for c in plan.commands):
        return list(plan.commands)
    questions = plan.state.questions[:limit] if plan.state is not None else []

    def question_ids() -> dict[str, list[int]]:
        return {q: p.rag.question_ids(q) for q in questions}

    # On the store thread: the tokenizer is the indexer's, which runs there.
    ids = await p.blocking(question_ids)
    return question_prefills(plan.commands, plan.state, ids.__getitem__, limit, command_id)
