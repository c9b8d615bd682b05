"""A service checkpoint replaces the one at its path in one step: a learner killed mid-save leaves one whole."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlbuf._ray_checkpoint import write_checkpoint


def _save(path: Path, generation: int) -> None:
    def save_shards(staging: Path) -> list[Any]:
        staging.mkdir()
        (staging / "shard-0").write_text(str(generation))
        return []
    write_checkpoint(path, save_shards, {"generation": generation})


def test_a_save_killed_while_replacing_the_checkpoint_leaves_one_whole(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # The old checkpoint was renamed away, then the new one renamed in: killed between the two, path held
    # neither (helper 44). Here every rename "kills" the learner right after it moves its directory.
    path = tmp_path / "replay"
    _save(path, 1)
    renamed = Path.rename

    def rename_then_die(self: Path, target: Any) -> Any:
        renamed(self, target)
        raise KeyboardInterrupt("killed")
    monkeypatch.setattr(Path, "rename", rename_then_die)
    _save(path, 2)  # one exchange: no rename of the checkpoint
    monkeypatch.undo()
    assert json.loads((path / "service.json").read_text())["generation"] == 2
    assert (path / "shard-0").read_text() == "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["replay"]  # the old one removed
