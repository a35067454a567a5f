"""The chart's topics file is generated from schemas/topics.py and kept in sync."""

from __future__ import annotations

from ragwarm.kafka.strimzi import CHART_TOPICS, render
from ragwarm.settings import REPO_ROOT


def test_chart_topics_match_the_schema() -> None:
    assert (REPO_ROOT / CHART_TOPICS).read_text() == render(), (
        "regenerate with: python -m ragwarm.kafka.strimzi")
