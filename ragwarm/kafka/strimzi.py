"""Strimzi `KafkaTopic` specs generated from `schemas.topics` (the Helm chart's topics file)."""

from __future__ import annotations

import json
from pathlib import Path

from schemas.topics import TOPICS

CHART_TOPICS = Path("infra") / "helm" / "ragwarm" / "files" / "topics.json"


def topics_document() -> dict:
    """Every topic with its partitions and config; the chart names and labels the resources."""
    return {
        "source": "schemas/topics.py (regenerate: python -m ragwarm.kafka.strimzi)",
        "topics": [
            {"name": t.name, "resource": t.name.replace(".", "-"), "key": t.key,
             "partitions": t.partitions, "config": dict(t.config)}
            for t in TOPICS.values()
        ],
    }


def render() -> str:
    return json.dumps(topics_document(), indent=2) + "\n"


if __name__ == "__main__":
    from ragwarm.settings import REPO_ROOT

    (REPO_ROOT / CHART_TOPICS).write_text(render())
