"""Every ```python block in README.md and docs/ runs, in order, one namespace per file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _blocks(path: Path) -> list[str]:
    return BLOCK.findall(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("path", [p for p in DOCUMENTS if _blocks(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_code_blocks_run(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__doc_example__"}
    for number, block in enumerate(_blocks(path), start=1):
        code = compile(block, f"{path.name}[block {number}]", "exec")
        exec(code, namespace)


def test_readme_has_the_two_quickstart_lines() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    quickstart = text.split("## Quickstart", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [line for line in quickstart.strip().splitlines() if line.strip()]
    assert lines == [
        "python -m pip install nox && python -m nox -s demo",
        "python -m pip install nox && python -m nox -s tests",
    ]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert lines[1] in ci
