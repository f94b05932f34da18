"""Every relative link in the README and docs/*.md (results pages included) points at a file that exists."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)  # code blocks are not links
    links = [m.group(1).split("#")[0] for m in _LINK.finditer(text)]
    return [x for x in links if x and not re.match(r"^[a-z]+:", x)]  # skip http:, mailto:, pure anchors


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    missing = [x for x in _relative_links(page) if not (page.parent / x).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"


def test_the_check_sees_links():
    assert "docs/results.md" in _relative_links(ROOT / "README.md")
