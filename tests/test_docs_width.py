"""Every line of every code block in README.md and docs/ fits the page at 1280 px, scrollbar-free.

``MAX_CHARS`` is the number of monospace characters a code block of the site shows without a
horizontal scrollbar in a 1280 px wide window: measured with ``docs/scripts/code_width.py`` (the
built site in headless Chromium 150 at ``--window-size=1280,2000``; for each ``pre > code`` the
inner width, ``clientWidth`` minus the padding, divided by the width of one character of the code
font), which gives 80 characters with mkdocs-material 9.8's default layout (both sidebars shown,
code at 0.85 of the body font; Roboto Mono and the DejaVu Sans Mono fallback both 0.6 em wide).
A longer line hides its end (often the comment that matters) behind a scrollbar. The API
reference wraps its long docstring lines instead (``docs/assets/extra.css``).

``test_rendered_pages_do_not_scroll`` checks the rendered pages themselves when Chromium and
mkdocs are installed, and is skipped otherwise.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MAX_CHARS = 80
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})")

def code_lines(text: str) -> list[tuple[int, str]]:
    """``(line number, line)`` of every line inside a fenced code block, the fence's indentation removed."""
    found: list[tuple[int, str]] = []
    closing: str | None = None
    indent = ""
    for number, line in enumerate(text.splitlines(), start=1):
        match = FENCE.match(line)
        if closing is None:
            if match is not None:
                closing, indent = match["fence"], match["indent"]
        elif match is not None and match["fence"].startswith(closing) and not line[match.end():].strip():
            closing = None
        else:
            found.append((number, line.removeprefix(indent)))
    return found


def too_long(path: Path) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{number}: {len(line)} characters: {line.strip()}"
            for number, line in code_lines(path.read_text(encoding="utf-8")) if len(line) > MAX_CHARS]


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_code_lines_fit_the_page(path: Path) -> None:
    assert too_long(path) == []


def test_code_lines_are_found_in_every_kind_of_block() -> None:
    text = ("intro\n```python\nx = 1\n```\n\n- item\n\n    ```bash\n    rlbuf demo ppo\n    ```\n"
            "~~~text\n```\nnot a fence\n~~~\nafter\n")
    assert code_lines(text) == [(3, "x = 1"), (9, "rlbuf demo ppo"), (12, "```"), (13, "not a fence")]
    long_line = "x" * (MAX_CHARS + 1)
    assert [len(line) for _, line in code_lines(f"```\n{long_line}\n```\n{long_line}\n")] == [MAX_CHARS + 1]


PAGES = ["index.html", "getting-started/index.html", "gymnasium/index.html",
         "coming-from/gymnasium/index.html", "reference/replay/index.html", "reference/gym/index.html"]


def test_rendered_pages_do_not_scroll(tmp_path: Path) -> None:
    """The built pages in headless Chromium at 1280 px: no code block scrolls, and MAX_CHARS fit."""
    sys.path.insert(0, str(ROOT / "docs" / "scripts"))
    try:
        import code_width
    finally:
        sys.path.remove(str(ROOT / "docs" / "scripts"))
    pytest.importorskip("mkdocs")
    if code_width.chromium() is None:
        pytest.skip("no chromium on the PATH")
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--quiet", "--site-dir", str(site)], cwd=ROOT,
                   check=True, env={"PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1",
                                    "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    measured = {page: code_width.measure(site, page) for page in PAGES}
    assert {page: found["overflowing"] for page, found in measured.items()} == {page: [] for page in PAGES}
    assert measured["getting-started/index.html"]["fits"] >= MAX_CHARS
