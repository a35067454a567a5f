"""The client refuses a streams app whose canonical-prompt parameters differ, naming the setting."""

from __future__ import annotations

import pytest

from ragwarm.client.contract import PromptMismatch, check_prompt
from ragwarm.client.core import opened_health
from ragwarm.client.wire import StreamsUnavailable
from schemas.prefix import PromptParams
from streams.shell.views.health import health_body

OURS = PromptParams.of(system_prompt="Answer.", top_k=3, model="m", block_size=16)


def test_equal_parameters_pass():
    check_prompt(health_body("app", OURS), OURS, "http://s")


@pytest.mark.parametrize(
    ("change", "setting"),
    [
        ({"top_k": 2}, "RAGWARM_RAG_TOP_K"),
        ({"model": "other"}, "RAGWARM_MODEL_LLM_NAME"),
        ({"system_prompt": "Be brief."}, "RAGWARM_RAG_SYSTEM_PROMPT"),
        ({"block_size": 32}, "block size"),
    ],
)
def test_a_differing_parameter_is_named(change, setting):
    fields = {"system_prompt": "Answer.", "top_k": 3, "model": "m", "block_size": 16} | change
    theirs = PromptParams.of(**fields)
    with pytest.raises(PromptMismatch, match=setting) as caught:
        check_prompt(health_body("app", theirs), OURS, "http://s")
    assert "http://s" in str(caught.value)


def test_an_app_that_publishes_no_parameters_is_refused():
    with pytest.raises(PromptMismatch, match="publishes no prompt parameters"):
        check_prompt({"status": "ok"}, OURS, "http://s")


def test_opening_checks_the_prompt_or_keeps_the_outage_only_where_it_may():
    down = StreamsUnavailable("the streams app at http://s does not answer")
    assert opened_health(health_body("app", OURS), OURS, "http://s", optional=False) is None
    assert opened_health(down, OURS, "http://s", optional=True) is down  # opens without it
    with pytest.raises(StreamsUnavailable):
        opened_health(down, OURS, "http://s", optional=False)
    theirs = PromptParams.of(system_prompt="Answer.", top_k=2, model="m", block_size=16)
    for optional in (False, True):  # an app that answers otherwise is refused either way
        with pytest.raises(PromptMismatch, match="RAGWARM_RAG_TOP_K"):
            opened_health(health_body("app", theirs), OURS, "http://s", optional=optional)
