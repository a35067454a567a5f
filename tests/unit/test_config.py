"""The README documents every RAGWARM_ setting the settings models declare."""

from __future__ import annotations


def test_readme_lists_every_setting():
    from pathlib import Path

    from ragwarm.cli.config import rows, settings_classes

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    missing = [var for cls in settings_classes() for var, _, _ in rows(cls) if var not in readme]
    assert missing == [], "README is out of date: run `ragwarm config --markdown`"
