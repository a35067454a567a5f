"""A client whose canonical-prompt settings differ from the streams app's refuses to start."""

from __future__ import annotations

import pytest

from rag.settings import RagSettings
from ragwarm.client.contract import PromptMismatch
from ragwarm.client.rag import RagClient
from ragwarm.client.settings import ClientSettings

pytestmark = pytest.mark.integration


def test_a_client_with_another_top_k_fails_naming_the_setting(namespace, streams_factory,
                                                               kafka_settings):
    app = streams_factory(namespace, "contract", env={"RAGWARM_RAG_TOP_K": "2"}).start()
    assert app.get("/ragwarm/health")["prompt"]["params"]["top_k"] == 2
    settings = ClientSettings(streams_url=app.url, emit_queries=False, retrieval="streams")
    with pytest.raises(PromptMismatch, match=r"RAGWARM_RAG_TOP_K is 2 there and 3 here"):
        RagClient.open(settings, kafka_settings, rag=RagSettings(top_k=3))
    # The same setting on both sides opens (no worker is needed for that).
    with RagClient.open(settings, kafka_settings, rag=RagSettings(top_k=2)) as client:
        assert client.top_k == 2
