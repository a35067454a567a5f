"""The README's settings table is the one `ragwarm config --markdown` prints."""

from __future__ import annotations

from pathlib import Path

MARKER = "<!-- settings-table -->"


def test_readme_table_is_the_generated_one():
    from ragwarm.cli.config import markdown

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme.split(MARKER, 1)[1]
    assert table.strip() == markdown().strip(), (
        "README is out of date: replace everything after the settings-table marker with "
        "the output of `ragwarm config --markdown`"
    )
