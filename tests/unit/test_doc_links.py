"""Every link to a file of the repository leads somewhere.

Markdown links in the `*.md` files are resolved from the page that holds them; `docs/...`
paths named in code, the Makefile, scripts and infra files are resolved from the repository
root. A page that moved or was never written fails here, with the list of dangling links.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Not the project's files: environments, caches, build and run outputs.
SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", "build", "dist", "out",
             ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis"}
CODE_SUFFIXES = {".py", ".sh", ".yaml", ".yml", ".toml", ".cfg", ".ini", ".tpl", ".json"}
CODE_NAMES = {"Makefile", "Dockerfile"}

# [text](target) and ![alt](target); the target stops at a space (a title may follow).
MD_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
# docs/… as a path: letters, digits and . _ - / after it.
DOCS_PATH = re.compile(r"(?<![\w./-])docs/[\w./-]*")
# In tests, a quoted "docs/…" is data: the knowledge bases of the fixtures name their
# documents so (doc_id="docs/faq.md"), and those are not files of this repository.
QUOTED_DOCS_PATH = re.compile(r"(?<![\w./'\"-])docs/[\w./-]*")
# Fixture documents that tests also name unquoted, in expected messages ("seq 7 (docs/a.md)").
FIXTURE_DOCS = {"docs/a.md", "docs/b.md", "docs/faq.md"}
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto:, …


def project_files() -> Iterator[Path]:
    # os.walk, pruned: `make install` puts a .venv of thousands of files in the checkout.
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        yield from (Path(folder) / name for name in files)


def markdown_targets(text: str) -> list[str]:
    """Local targets of the markdown links in `text`, anchors and queries cut off."""
    text = re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.MULTILINE | re.DOTALL)
    out = []
    for target in MD_LINK.findall(text):
        if EXTERNAL.match(target) or target.startswith("#"):
            continue
        out.append(re.split(r"[#?]", target, maxsplit=1)[0])
    return out


def docs_mentions(text: str, quoted_is_data: bool = False) -> list[str]:
    """`docs/...` paths named in code, trailing sentence punctuation cut off."""
    pattern = QUOTED_DOCS_PATH if quoted_is_data else DOCS_PATH
    return [m.rstrip(".,;:") for m in pattern.findall(text)]


def missing_links() -> list[str]:
    missing = []
    for path in project_files():
        where = path.relative_to(ROOT)
        if path.suffix == ".md":
            base = path.parent
            targets = markdown_targets(path.read_text(errors="replace"))
        elif path.suffix in CODE_SUFFIXES or path.name in CODE_NAMES:
            if path == Path(__file__).resolve():
                continue
            base = ROOT
            in_tests = where.parts[0] == "tests"
            targets = docs_mentions(path.read_text(errors="replace"), quoted_is_data=in_tests)
            if in_tests:
                targets = [t for t in targets if t not in FIXTURE_DOCS]
        else:
            continue
        for target in targets:
            resolved = ROOT / target.lstrip("/") if target.startswith("/") else base / target
            if not resolved.exists():
                missing.append(f"{where}: {target}")
    return sorted(set(missing))


def test_markdown_targets_cut_anchors_and_skip_urls():
    text = ("See [a](docs/a.md#part), ![b](img/b.png \"title\"), [c](https://x.org/c.md), "
            "and [d](#local).\n```\n[f](not/a/link.md)\n```\n")
    assert markdown_targets(text) == ["docs/a.md", "img/b.png"]


def test_docs_mentions_cut_trailing_punctuation():
    text = "# see docs/x.md, and (docs/lab/y.md). Not mydocs/z.md"
    assert docs_mentions(text) == ["docs/x.md", "docs/lab/y.md"]


def test_quoted_paths_are_data_in_tests():
    text = 'doc_id="docs/faq.md"  # a KB document; the reason: see docs/y.md'
    assert docs_mentions(text, quoted_is_data=True) == ["docs/y.md"]
    assert docs_mentions(text) == ["docs/faq.md", "docs/y.md"]


def test_every_linked_file_exists():
    missing = missing_links()
    assert not missing, "links to files that do not exist:\n" + "\n".join(missing)
