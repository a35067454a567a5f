"""A small guide document of three sections, for the tests of the chunk store and its
replica."""

from __future__ import annotations


def section(title: str, topic: str, n: int = 40) -> str:
    sentences = " ".join(
        f"{topic} detail number {i} explains the {topic} behaviour." for i in range(n)
    )
    return f"## {title}\n\n{sentences}"


V1 = "\n\n".join(
    [
        "# Guide",
        section("Installing", "installation"),
        section("Sync waves", "sync wave"),
        section("Projects", "project"),
    ]
)
