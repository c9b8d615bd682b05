"""noxfile.py picks a supported interpreter that runs here, and fails (never skips) without one."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("nox")
ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("noxfile", ROOT / "noxfile.py")
assert _spec is not None and _spec.loader is not None
noxfile = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(noxfile)


def _fake_python(folder: Path, name: str, status: int) -> None:
    script = folder / name
    script.write_text(f"#!/bin/sh\nexit {status}\n")
    script.chmod(0o755)


def test_first_python_skips_an_interpreter_that_does_not_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_python(tmp_path, "python3.11", 127)  # a pyenv shim for a version that is not installed
    _fake_python(tmp_path, "python3.12", 0)
    _fake_python(tmp_path, "python3.13", 0)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert noxfile.first_python() == "3.12"
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert noxfile.first_python() is None


def test_nox_fails_when_no_supported_python_exists(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "-s", "tests"],
                            capture_output=True, text=True, cwd=ROOT, check=False,
                            env={**os.environ, "PATH": str(tmp_path)})
    assert result.returncode != 0
    assert "no supported Python on PATH: rlbuf needs Python 3.11 to 3.13" in result.stderr
    assert "skipped" not in result.stdout + result.stderr


def test_one_supported_range_everywhere() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["requires-python"] == ">=3.11,<3.14"
    versions = [c.rsplit(" ", 1)[1] for c in project["classifiers"] if c.startswith("Programming Language :: Python :: 3.")]
    assert tuple(versions) == noxfile.SUPPORTED_PYTHONS == ("3.11", "3.12", "3.13")
    for page in ("README.md", "docs/getting-started.md", "docs/index.md"):
        assert "Python 3.11 to 3.13" in (ROOT / page).read_text(encoding="utf-8"), page
