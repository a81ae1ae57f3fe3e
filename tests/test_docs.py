"""The documents keep their shape: links resolve, the README's figures are the benchmark pages' figures.

The writing rules are in CONTRIBUTING.md: the README stays under 20 KB and the architecture
under 35 KB; a figure lives on one benchmark page, which the README's results table quotes and
links to; the documents speak of the project, not of how it was built.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\((?P<target>[^)\s]+)\)")
FIGURE = re.compile(r"\d+\.\d+x")


def _documents() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    found = {ROOT / name for name in listed} | set(ROOT.glob("*.md")) | set((ROOT / "docs").rglob("*.md"))
    # test data (reports rendered by old code, kept as they were) is not documentation
    return sorted(p for p in found if p.is_file() and not {".venv", "tests"} & set(p.relative_to(ROOT).parts))


def anchor(heading: str) -> str:
    """GitHub's anchor for a markdown heading.

    Example:
        >>> anchor("## Compile and verify")
        'compile-and-verify'
        >>> anchor("# Ours against DeepSparse 1.8.0: `benchmarks/peers.py`")
        'ours-against-deepsparse-180-benchmarkspeerspy'
    """
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    fenced = False
    out = set()
    for line in lines:
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            out.add(anchor(line))
    return out


@pytest.mark.parametrize("document", _documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(document):
    text = re.sub(r"```.*?```", "", document.read_text(encoding="utf-8"), flags=re.S)
    broken = []
    for match in LINK.finditer(text):
        target = match["target"]
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, fragment = target.partition("#")
        resolved = (document.parent / path).resolve() if path else document
        if not resolved.exists() or fragment and resolved.suffix == ".md" and fragment not in _anchors(resolved):
            broken.append(target)
    assert not broken, f"{document.relative_to(ROOT)}: links that lead nowhere: {broken}"


def test_readme_results_quote_their_pages():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Results", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|") and "](" in line]
    assert len(rows) >= 5, "the README's results table has fewer than 5 rows"
    for row in rows:
        page = ROOT / LINK.search(row)["target"].partition("#")[0]
        figures = FIGURE.findall(row)
        assert figures, f"a results row quotes no figure: {row}"
        text = page.read_text(encoding="utf-8")
        # a page's table may print the ratio bare ("1.10" in an "x dense" column)
        missing = [f for f in figures if not re.search(rf"(?<![\d.]){re.escape(f[:-1])}x?(?![\d])", text)]
        assert not missing, f"{page.name} does not show {missing}, quoted by the README row {row!r}"


def test_document_sizes():
    assert (ROOT / "README.md").stat().st_size <= 20 * 1024
    assert (ROOT / "docs" / "ARCHITECTURE.md").stat().st_size <= 35 * 1024
    for needed in ("CHANGELOG.md", "CONTRIBUTING.md", "benchmarks/README.md"):
        assert (ROOT / needed).is_file(), needed


@pytest.mark.parametrize("document", _documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_documents_speak_of_the_project(document):
    text = document.read_text(encoding="utf-8")
    assert not re.search(r"\bsessions?\b", text, flags=re.I), f"{document.relative_to(ROOT)} speaks of sessions"
    headings = [line for line in text.splitlines() if line.startswith("#")]
    assert not [h for h in headings if re.search(r"\bissue \d+", h, flags=re.I)], "a heading names a ticket"
