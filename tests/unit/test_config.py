"""docs/configuration.md's settings table is the one `ragwarm config --markdown` prints."""

from __future__ import annotations

from pathlib import Path

MARKER = "<!-- settings-table -->"
PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_configuration_table_is_the_generated_one():
    from ragwarm.cli.config import markdown

    table = PAGE.read_text().split(MARKER, 1)[1]
    assert table.strip() == markdown().strip(), (
        "docs/configuration.md is out of date: replace everything after the settings-table "
        "marker with the output of `ragwarm config --markdown`"
    )
