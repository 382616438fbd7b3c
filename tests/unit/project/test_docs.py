"""The documentation hangs together: docs/index.md lists every page, and every relative link in
README, CHANGELOG, CONTRIBUTING and docs/ points at a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"


def _links(path: Path) -> list[str]:
    return [t for t in re.findall(r"\]\(([^)#\s]+)\)", path.read_text(encoding="utf-8")) if "://" not in t]


def test_docs_index_lists_every_page() -> None:
    listed = set(_links(DOCS / "index.md"))
    pages = {p.name for p in DOCS.glob("*.md") if p.name != "index.md"}
    assert pages - listed == set(), f"docs/index.md does not list {sorted(pages - listed)}"


def test_every_relative_link_resolves() -> None:
    broken = []
    for path in [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "CONTRIBUTING.md", *sorted(DOCS.glob("*.md"))]:
        for target in _links(path):
            if not (path.parent / target).exists():
                broken.append(f"{path.relative_to(ROOT)} -> {target}")
    assert broken == []
