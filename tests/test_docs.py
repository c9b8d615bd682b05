"""Every ```python block in README.md and docs/ runs, in order, one namespace per file."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _blocks(path: Path) -> list[str]:
    return BLOCK.findall(path.read_text(encoding="utf-8"))


# An example that does what the docs recommend draws no NextStepResetWarning (one example shows it, caught).
@pytest.mark.filterwarnings("error::rlbuf.errors.NextStepResetWarning")
@pytest.mark.parametrize("path", [p for p in DOCUMENTS if _blocks(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_code_blocks_run(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__doc_example__"}
    for number, block in enumerate(_blocks(path), start=1):
        code = compile(block, f"{path.relative_to(ROOT)}[block {number}]", "exec")  # docs/coming-from/gymnasium.md is not docs/gymnasium.md
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


SPHINX_ROLE = re.compile(r":(class|func|meth|mod|attr|exc|obj|data):`")


def test_no_sphinx_roles_in_the_sources() -> None:
    """The site and `--help` print Sphinx roles as raw text: docstrings use [`Name`][rlbuf.Name]."""
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in sorted((ROOT / "rlbuf").rglob("*.py"))
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
             if SPHINX_ROLE.search(line)]
    assert found == []


def test_each_readme_block_imports_the_modules_it_uses() -> None:
    """A README block copied alone must not fail on a module an earlier block imported (`torch`, `np` ...)."""
    blocks = [ast.parse(block) for block in _blocks(ROOT / "README.md")]
    imported = [_imported_names(tree) for tree in blocks]
    modules = set().union(*imported)
    missing = {}
    for number, (tree, own) in enumerate(zip(blocks, imported, strict=True), start=1):
        used = {node.value.id for node in ast.walk(tree)
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)}
        if (used & modules) - own:
            missing[f"block {number}"] = sorted((used & modules) - own)
    assert missing == {}


def _imported_names(tree: ast.Module) -> set[str]:
    """Names bound to modules by `import x` / `import x as y` (not `from x import Name`)."""
    return {(alias.asname or alias.name).split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
            for alias in node.names}


def test_one_version_in_the_package_the_changelog_and_the_site() -> None:
    import tomllib

    import rlbuf

    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    assert rlbuf.__version__ == version
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "## [Unreleased]" in changelog and f"## [{version}] - " in changelog
    # The site page includes the file (pymdownx.snippets), so the two never differ.
    assert (ROOT / "docs" / "changelog.md").read_text(encoding="utf-8").strip() == '--8<-- "CHANGELOG.md"'
    assert "docs/scripts/version.py" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
