"""Which llama.cpp slots hold a prefix ragwarm dropped: pure matching over `/slots` output."""

from __future__ import annotations

from workers.engines.remote import slots_holding
from workers.kv.blocks import block_hashes


def hashes_of(prompt: str, tenant: str) -> list[str]:
    # One "token" per character, blocks of 4: enough to give prefixes distinct chain hashes.
    return block_hashes([ord(c) for c in prompt], tenant=tenant, model="m", block_size=4)


def slot(slot_id: int, prompt: str | None, held: int = 11) -> dict:
    shown = {} if prompt is None else {"prompt": prompt}
    return {"id": slot_id, "n_ctx": 4096, "n_prompt_tokens": held} | shown


def test_a_slot_whose_prompt_starts_with_a_dropped_prefix_is_named() -> None:
    dropped_prefix = hashes_of("abcdefgh", "t1")[-1]
    slots = [slot(0, "abcdefgh and a question"), slot(1, "zzzzzzzz other"),
             slot(2, "abcdefgh erased", held=0)]
    assert slots_holding(slots, {dropped_prefix: "t1"}, hashes_of) == [0]


def test_the_tenant_of_the_dropped_prefix_is_the_one_hashed() -> None:
    # The server keeps no tenant; the same text hashed for another tenant is another prefix.
    dropped_prefix = hashes_of("abcdefgh", "t1")[-1]
    assert slots_holding([slot(0, "abcdefgh")], {dropped_prefix: "t2"}, hashes_of) == []


def test_a_prompt_shorter_than_the_prefix_or_empty_holds_nothing_of_it() -> None:
    dropped_prefix = hashes_of("abcdefgh", "t1")[-1]
    slots = [slot(0, "abcd"), slot(1, ""), slot(3, "abcdefgh")]
    assert slots_holding(slots, {dropped_prefix: "t1"}, hashes_of) == [3]


def test_nothing_dropped_names_no_slot() -> None:
    assert slots_holding([slot(0, "abcdefgh"), {"id": 1, "n_prompt_tokens": 9}], {},
                         hashes_of) == []


def test_a_server_that_hides_prompts_gets_every_slot_holding_tokens_reset() -> None:
    # Without LLAMA_SERVER_SLOTS_DEBUG, /slots shows counts only: what a slot holds is unknown.
    dropped = {hashes_of("abcdefgh", "t1")[-1]: "t1"}
    slots = [{"id": 0, "n_ctx": 2048}, {"id": 1, "n_prompt_tokens": 11},
             {"id": 2, "n_prompt_tokens": 0}]
    assert slots_holding(slots, dropped, hashes_of) == [1]
