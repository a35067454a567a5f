"""Question tails: a prefill of a tracked prefix also warms the prompts its questions send.

A repeat of a question reuses, with request caching, its whole prompt; a prefix warmed
without its question leaves the question's tokens to compute at every ask (tens of
milliseconds on a CPU), so a policy that re-warms prefixes after edits, evictions or a
restart lost its median to plain request caching. The tails ride on the prefix's own
blocks: each costs the KV of a few blocks, is unpinned (evicted before the prefix) and
is invalidated with the prefix, since it has the same chunk refs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from schemas import WarmupCommand
from streams.decide.logic import PrefixPlan, command_id, with_expiry
from streams.handle.deps import HandlerDeps


def question_prefills(
    commands: Sequence[WarmupCommand],
    tails: Mapping[str, Sequence[int]],
    new_id: Callable[[], str],
) -> list[WarmupCommand]:
    """For each prefill of `commands`, one per question of `tails` (question -> its tokens
    after the prefix, in the order given): the prefill's tokens, then the question's."""
    out: list[WarmupCommand] = []
    for cmd in commands:
        if cmd.op != "prefill" or not cmd.token_ids:
            continue
        why = f"{cmd.reason}: an asked question" if cmd.reason else "an asked question"
        for ids in tails.values():
            if ids:
                out.append(cmd.model_copy(update={
                    "command_id": new_id(), "token_ids": [*cmd.token_ids, *ids], "pin": False,
                    "reason": why,
                }))
    return out


async def send_question_tails(p: HandlerDeps, plan: PrefixPlan) -> None:
    """After the plan's commands: the tails of its prefix's last asked questions
    (`RAGWARM_STREAMS_WARM_QUESTION_TAILS` of them)."""
    limit = p.settings.warm_question_tails
    prefilled = any(c.op == "prefill" for c in plan.commands)
    if not limit or not prefilled or plan.state is None or not plan.state.questions:
        return
    questions = plan.state.questions[:limit]  # the last asked first

    def question_ids() -> dict[str, list[int]]:
        return {q: p.rag.question_ids(q) for q in questions}

    # On the store thread, where the tokenizer's other user (the indexer) runs; after the
    # prefix's own commands went, so that a busy store thread never delays those.
    for cmd in question_prefills(plan.commands, await p.blocking(question_ids), command_id):
        await p.out.command(with_expiry(cmd, p.clock(), p.settings.command_expiry_s))
