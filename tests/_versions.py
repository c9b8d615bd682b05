"""Checkpoint states whose every tensor holds one version number, for tests of saves and loads.

A load that mixed two versions, or read bytes a later save rewrote, fails ``whole_version``.

Example:
    >>> whole_version(versioned_state(3, rows=2, odd_names=True))
    3
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rlbuf.checkpoint import load_state


def versioned_state(version: int, *, rows: int = 300, odd_names: bool = False) -> dict[str, Any]:
    """A ``Demo`` state whose tensors all hold ``version``; with ``odd_names``, odd and even
    versions name one of their files differently (a spare's files then come and go)."""
    state: dict[str, Any] = {"kind": "Demo", "rows": rows, "x": torch.full((rows, 4), float(version))}
    state["odd" if odd_names and version % 2 else "even"] = torch.full((rows,), float(version))
    return state


def whole_version(state: dict[str, Any]) -> int:
    """The one version every tensor of a ``versioned_state`` holds (asserted)."""
    version, rows = int(state["x"][0, 0]), state["rows"]
    assert torch.equal(state["x"], torch.full((rows, 4), float(version)))
    [name] = [name for name in ("odd", "even") if name in state]
    assert torch.equal(state[name], torch.full((rows,), float(version)))
    return version


def loaded_version(path: Path) -> int:
    """Load the ``Demo`` checkpoint at ``path``; the one version it holds (asserted whole)."""
    return whole_version(load_state(path, kind="Demo"))
