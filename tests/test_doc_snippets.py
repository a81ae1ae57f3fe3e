"""Every code snippet in the README and the user guides runs as written.

Each document's ```python and ```bash blocks run in the order they appear, in one fresh
process and one namespace per document (a later block may use what an earlier one defined,
as a reader would), in a scratch folder that holds links to the repository's
`experiments/` and `benchmarks/`. Shell blocks run with `bash -euo pipefail`, this venv's
`bin/` first on PATH. A block that must not run here (a `make` target, `nnictl`, an hour's
benchmark) carries the comment ``<!-- snippet: not run (why) -->`` on the line before its
fence, and the reason is required. Other fences (```text, ```yaml, plain ```) are not code.
The README's snippets run in `make test`, the guides' (minutes together) in `make test-slow`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs" / "guide").glob("*.md"))]
RUN_LANGUAGES = ("python", "bash")
SKIP = re.compile(r"<!--\s*snippet:\s*not run\s*\((?P<why>[^)]*)\)\s*-->")
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<info>[^`]*)$")
# a document's snippets together may take this long (the BERT and sweep examples compile real models)
TIMEOUT_S = 600


@dataclass(frozen=True)
class Snippet:
    language: str   # "python" or "bash"
    line: int       # 1-based line of the opening fence
    code: str


def snippets(text: str) -> tuple[list[Snippet], list[int]]:
    """The runnable blocks of a markdown text, and the lines of blocks skipped by a marker.

    Example:
        >>> text = "<!-- snippet: not run (loops) -->\\n```bash\\nyes\\n```\\n```python\\nx = 1\\n```\\n"
        >>> runs, skipped = snippets(text)
        >>> [(s.language, s.line, s.code) for s in runs], skipped
        ([('python', 5, 'x = 1\\n')], [2])
    """
    lines = text.splitlines()
    runs: list[Snippet] = []
    skipped: list[int] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        language = (opening["info"].strip().split() or [""])[0]
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith("```"):
            end += 1
        indent = len(opening["indent"])
        code = "".join(line[indent:] + "\n" for line in lines[i + 1:end])
        marker = SKIP.search(lines[i - 1]) if i > 0 else None
        if marker is not None:
            if not marker["why"].strip():
                raise ValueError(f"line {i}: a snippet marked 'not run' must say why")
            skipped.append(i + 1)
        elif language in RUN_LANGUAGES:
            runs.append(Snippet(language, i + 1, code))
        i = end + 1
    return runs, skipped


# Runs in the child process: the blocks in order, python in one namespace, bash through bash.
RUNNER = r"""
import json, subprocess, sys, traceback
blocks = json.load(open(sys.argv[1]))
namespace = {"__name__": "__main__"}
for block in blocks:
    where = f"{block['document']}:{block['line']} ({block['language']})"
    print(f"--- {where}", flush=True)
    if block["language"] == "python":
        try:
            exec(compile(block["code"], where, "exec"), namespace)
        except BaseException:
            traceback.print_exc()
            print(f"SNIPPET FAILED: {where}", flush=True)
            sys.exit(1)
    else:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", block["code"]])
        if done.returncode != 0:
            print(f"SNIPPET FAILED: {where} (exit {done.returncode})", flush=True)
            sys.exit(1)
"""


def test_snippet_parser_reads_markers_and_fences():
    text = "\n".join([
        "```python", "a = 1", "```",
        "<!-- snippet: not run (needs nnictl) -->", "```bash", "nnictl create", "```",
        "```yaml", "k: v", "```",
        "  ```bash", "  echo indented", "  ```",
    ])
    runs, skipped = snippets(text)
    assert [(s.language, s.line, s.code) for s in runs] == [("python", 1, "a = 1\n"), ("bash", 11, "echo indented\n")]
    assert skipped == [5]
    with pytest.raises(ValueError, match="must say why"):
        snippets("<!-- snippet: not run () -->\n```bash\nx\n```\n")


def test_readme_has_runnable_snippets():
    runs, _ = snippets((ROOT / "README.md").read_text(encoding="utf-8"))
    assert any(s.language == "python" for s in runs), "the README shows no Python that runs"


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_skip_says_why(document):
    snippets((ROOT / document).read_text(encoding="utf-8"))  # raises on a 'not run' marker without a reason


# the README's snippets run in `make test`; the guides' (several minutes together) in `make test-slow`
RUN_CASES = [pytest.param(d, marks=pytest.mark.first(3) if d == "README.md" else pytest.mark.slow) for d in DOCUMENTS]


@pytest.mark.parametrize("document", RUN_CASES)
def test_document_snippets_run(document, tmp_path, cache_dir):
    runs, _ = snippets((ROOT / document).read_text(encoding="utf-8"))
    if not runs:
        pytest.skip(f"{document} has no runnable snippets")
    for folder in ("experiments", "benchmarks"):
        (tmp_path / folder).symlink_to(ROOT / folder)
    blocks = tmp_path / "blocks.json"
    blocks.write_text(json.dumps([{"document": document, "line": s.line, "language": s.language, "code": s.code}
                                  for s in runs]))
    runner = tmp_path / "run_snippets.py"
    runner.write_text(RUNNER)
    env = dict(os.environ, SPARTA_EXPLORE_CACHE=str(cache_dir), MPLBACKEND="Agg",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    done = subprocess.run([sys.executable, str(runner), str(blocks)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, f"{document}: a snippet failed\n{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
