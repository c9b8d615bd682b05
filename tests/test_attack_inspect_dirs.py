"""Helper 102's attack on ``rlbuf inspect`` and the loaders with hostile directories: links out of the directory,
named pipes, oversized and unnameable files. Each is a clear rlbuf error (a report that says it, for inspect),
never a traceback, a hang or a read of a file outside the directory given."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from rlbuf import CheckpointError, ReplayBuffer
from rlbuf._inspect import inspect_checkpoint
from rlbuf.cli import main
from rlbuf.mixing import MixedReplay


def _saved(path: Path, reward: float = 0.5) -> Path:
    buffer = ReplayBuffer(8, obs_shape=(2,), action_shape=(), seed=0)
    buffer.add(torch.zeros(2), 1.0, reward, torch.ones(2), False, truncated=False)
    buffer.save(path)
    return path


def _demo_checkpoint(path: Path, buffer: Path | None = None, *, state: bytes = b"state", demo: str = "ppo") -> Path:
    """A demo checkpoint as the demos write it: ``buffer/``, ``state.pt`` and ``meta.json`` naming its digest."""
    path.mkdir(parents=True)
    if buffer is None:
        _saved(path / "buffer")
    else:
        (path / "buffer").symlink_to(buffer, target_is_directory=True)
    (path / "state.pt").write_bytes(state)
    (path / "meta.json").write_text(json.dumps({"demo": demo, "frames": 64,
                                                "state_sha256": hashlib.sha256(state).hexdigest()}))
    return path


def _described_nothing(report: dict[str, Any]) -> bool:
    """The report carries no field read from a manifest (none was read)."""
    return report.get("kind") is None and not report.get("fields") and not report["files"]


def test_a_genuine_demo_checkpoint_passes(tmp_path: Path) -> None:
    # The control of the cases below: the same layout, without links, is whole.
    report = inspect_checkpoint(_demo_checkpoint(tmp_path / "run"))
    assert report["ok"], report["error"]
    assert report["demo"] == {"demo": "ppo", "frames": 64, "state_status": "ok"}


def test_a_manifest_linked_from_outside_is_refused_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The report described the other checkpoint's manifest (kind, fields, files) before saying it was a link.
    outside = _saved(tmp_path / "outside")
    root = tmp_path / "ck"
    root.mkdir()
    (root / "manifest.json").symlink_to(outside / "manifest.json")
    opened = _opened_files(monkeypatch)
    report = inspect_checkpoint(root)
    assert not report["ok"] and "symbolic link" in report["error"]
    assert _described_nothing(report) and str(outside / "manifest.json") not in opened


@pytest.mark.parametrize("where", ["buffer", "checkpoints/frames-000064"])
def test_a_buffer_or_checkpoint_directory_linked_from_outside_is_not_inspected(tmp_path: Path, where: str) -> None:
    # A demo folder whose buffer/ (or newest checkpoint) linked to another directory inspected that one, "ok".
    outside = _saved(tmp_path / "outside")
    if where == "buffer":
        root = _demo_checkpoint(tmp_path / "run", buffer=outside)
    else:
        root = tmp_path / "run"
        (root / "checkpoints").mkdir(parents=True)
        (root / where).symlink_to(_demo_checkpoint(tmp_path / "elsewhere"), target_is_directory=True)
    report = inspect_checkpoint(root)
    assert not report["ok"] and "links inside it are not followed" in report["error"]
    assert _described_nothing(report)
    with pytest.raises(CheckpointError):
        ReplayBuffer.load(root)


def test_a_state_file_linked_from_outside_is_never_hashed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # state.pt linked to a file elsewhere was read and hashed, and the checkpoint reported whole.
    root = _demo_checkpoint(tmp_path / "run")
    secret = tmp_path / "secret.pt"
    shutil.move(root / "state.pt", secret)
    (root / "state.pt").symlink_to(secret)
    opened = _opened_files(monkeypatch)
    report = inspect_checkpoint(root)
    assert report["demo"]["state_status"] == "outside" and str(secret) not in opened
    assert not report["ok"] and "state.pt" in report["error"]


def test_a_meta_file_linked_from_outside_is_never_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _demo_checkpoint(tmp_path / "run")
    elsewhere = _demo_checkpoint(tmp_path / "elsewhere", demo="read-from-outside")
    (root / "meta.json").unlink()
    (root / "meta.json").symlink_to(elsewhere / "meta.json")
    opened = _opened_files(monkeypatch)
    report = inspect_checkpoint(root)
    assert str(elsewhere / "meta.json") not in opened
    assert report["demo"]["demo"] is None and "symbolic link" in report["demo"]["state_status"]
    assert not report["ok"]


@pytest.mark.parametrize("name", ["meta.json", "manifest.json"])
def test_a_named_pipe_in_place_of_a_json_file_does_not_hang(tmp_path: Path, name: str) -> None:
    # A FIFO named meta.json blocked `rlbuf inspect` for ever in its read (no writer ever comes).
    root = _demo_checkpoint(tmp_path / "run")
    pipe = root / name if name == "meta.json" else root / "buffer" / name
    pipe.unlink()
    os.mkfifo(pipe)
    reports: list[dict[str, Any]] = []
    worker = threading.Thread(target=lambda: reports.append(inspect_checkpoint(root)), daemon=True)
    worker.start()
    worker.join(timeout=20)
    if worker.is_alive():  # release the blocked read so the thread ends, then fail
        os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(timeout=20)
        pytest.fail(f"inspect blocked on a named pipe {name}")
    assert not reports[0]["ok"]


def test_an_oversized_manifest_is_refused_before_it_is_read(tmp_path: Path) -> None:
    # load refused a manifest over 64 MiB unread; inspect read it whole first (a sparse file here: no disk used).
    root = _saved(tmp_path / "ck")
    with open(root / "manifest.json", "r+b") as file:
        file.truncate(65 << 20)
    report = inspect_checkpoint(root)
    assert not report["ok"] and "larger than" in report["error"]
    with pytest.raises(CheckpointError, match="larger than"):
        ReplayBuffer.load(root)


@pytest.mark.parametrize("name", ["a" * 300, "x/" + "b" * 300 + "/c"])
def test_a_path_the_system_cannot_name_is_an_rlbuf_error(tmp_path: Path, name: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # OSError (ENAMETOOLONG) escaped from `rlbuf inspect` and from MixedReplay.load as a traceback.
    path = str(tmp_path / name)
    assert main(["inspect", path]) == 1
    assert "FAILED" in capsys.readouterr().out
    with pytest.raises(CheckpointError):
        MixedReplay.load(path)
    with pytest.raises(CheckpointError):
        ReplayBuffer.load(path)


@pytest.mark.parametrize("dtype", [[], {}, ["float32"]])
def test_a_file_entry_whose_dtype_is_no_name_is_refused_by_name(tmp_path: Path, dtype: Any,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    # An unhashable dtype ([] or {}) raised TypeError inside the files check: a traceback from `rlbuf inspect`,
    # "cannot load: TypeError: unhashable type" from load.
    root = _saved(tmp_path / "ck")
    manifest = json.loads((root / "manifest.json").read_text())
    entry = next(entry for rel, entry in manifest["files"].items() if rel.endswith("reward.bin"))
    entry["dtype"] = dtype
    (root / "manifest.json").write_text(json.dumps(manifest))
    assert main(["inspect", str(root)]) == 1
    assert "malformed manifest entry" in capsys.readouterr().out
    with pytest.raises(CheckpointError, match="malformed manifest entry"):
        ReplayBuffer.load(root)


def _opened_files(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The real paths of the files opened from now on (by os.open and io.open: every read of rlbuf and pathlib)."""
    opened: list[str] = []
    for module in (os, io):
        real = module.open

        def spying(file: Any, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            result = _real(file, *args, **kwargs)
            if isinstance(file, (str, Path)):
                opened.append(os.path.realpath(file))
            return result

        monkeypatch.setattr(module, "open", spying)
    return opened


def test_a_mixed_checkpoints_part_manifest_linked_from_outside_is_never_read(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # MixedReplay.load hashed a part's manifest.json through a link (read_bytes) before the part's load refused it.
    offline, online = (ReplayBuffer(8, obs_shape=(2,), action_shape=(), seed=0) for _ in range(2))
    offline.add(torch.zeros(2), 1.0, 0.5, torch.ones(2), False, truncated=False)
    root = tmp_path / "mixed"
    MixedReplay(offline, online, seed=0).save(root)
    part = next(root.glob("online-*")) / "manifest.json"
    outside = tmp_path / "outside.json"
    shutil.move(part, outside)
    part.symlink_to(outside)
    opened = _opened_files(monkeypatch)
    with pytest.raises(CheckpointError, match="symbolic link"):
        MixedReplay.load(root)
    assert str(outside) not in opened
