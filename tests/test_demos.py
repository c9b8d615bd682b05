"""The demos run end to end on a tiny budget (they must run, not learn), and resume exactly.

`nox -s demos-full` runs them with their default budgets, to learn.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlbuf.cli import main

# Small enough to run in seconds, large enough that every demo trains and checkpoints.
TINY = {
    "ppo": ["--num-steps", "32", "--epochs", "2"],
    "dqn": ["--learning-starts", "256"],
    "ppo-continuous": ["--num-steps", "32", "--epochs", "2", "--num-minibatches", "4"],
    "distill": ["--teacher-frames", "512", "--num-steps", "32", "--gradient-steps", "4", "--eval-episodes", "2"],
}


def demo(name: str, out: Path, *extra: str, frames: int = 2048) -> int:
    return main(["demo", name, "--out", str(out), "--frames", str(frames), "--checkpoint-every", "1024",
                 "--no-progress", "--no-stop-at-target", *TINY[name], *extra])


def final_parameters(out: Path) -> dict[str, torch.Tensor]:
    saved = torch.load(out / "model.pt", weights_only=True)
    return {f"{net}.{key}": value for net, state in saved.items() if isinstance(state, dict)
            for key, value in state.items()}


@pytest.mark.parametrize("name", ["ppo", "dqn", "ppo-continuous", "distill"])
def test_demo_writes_curve_summary_model_and_checkpoints(name: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    storage = "memmap" if name == "dqn" else "memory"
    assert demo(name, tmp_path / name, "--storage", storage) == 0
    out = tmp_path / name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished"
    assert summary["frames"] >= 2048
    assert summary["args"]["storage"] == storage
    assert (out / "curve.png").read_bytes().startswith(b"\x89PNG")
    assert final_parameters(out)
    checkpoints = sorted((out / "checkpoints").glob("frames-*"))
    assert 1 <= len(checkpoints) <= 2
    assert {p.name for p in checkpoints[-1].iterdir()} == {"buffer", "state.pt", "meta.json"}
    assert (checkpoints[-1] / "buffer" / "manifest.json").is_file()
    assert main(["inspect", str(out)]) == 0
    assert f"outputs in {out}/" in capsys.readouterr().out
    if name == "distill":
        assert summary["teacher_return"] > 0 and summary["student_return"] > 0
        assert (out / "teacher" / "model.pt").is_file()


@pytest.mark.parametrize("name", ["ppo", "dqn", "ppo-continuous", "distill"])
def test_interrupted_and_resumed_run_ends_with_the_same_parameters(name: str, tmp_path: Path) -> None:
    storage = ["--storage", "memmap" if name == "dqn" else "memory"]
    assert demo(name, tmp_path / "whole", *storage) == 0
    assert demo(name, tmp_path / "split", *storage, "--stop-after-frames", "1024") == 0
    stopped = json.loads((tmp_path / "split" / "summary.json").read_text())
    assert stopped["status"] == "stopped"
    assert not (tmp_path / "split" / "model.pt").exists()
    assert main(["demo", name, "--resume", str(tmp_path / "split"), "--no-progress"]) == 0

    whole, resumed = final_parameters(tmp_path / "whole"), final_parameters(tmp_path / "split")
    assert whole.keys() == resumed.keys()
    for key in whole:
        assert torch.equal(whole[key], resumed[key]), key
    summaries = [json.loads((tmp_path / run / "summary.json").read_text()) for run in ("whole", "split")]
    assert summaries[0]["frames"] == summaries[1]["frames"]
    assert summaries[0]["episodes"] == summaries[1]["episodes"]
    assert summaries[0]["resumed_at_frames"] == [] and summaries[1]["resumed_at_frames"] == [1024]


def test_run_killed_before_its_first_checkpoint_restarts_from_zero(tmp_path: Path) -> None:
    assert demo("dqn", tmp_path / "whole", frames=1024) == 0
    assert demo("dqn", tmp_path / "killed", frames=1024) == 0
    for path in (tmp_path / "killed").iterdir():  # as if killed right after setup
        if path.name != "config.json":
            (path.unlink() if path.is_file() else __import__("shutil").rmtree(path))
    assert main(["demo", "dqn", "--resume", str(tmp_path / "killed"), "--no-progress"]) == 0
    whole, resumed = final_parameters(tmp_path / "whole"), final_parameters(tmp_path / "killed")
    assert all(torch.equal(whole[key], resumed[key]) for key in whole)
    assert json.loads((tmp_path / "killed" / "summary.json").read_text())["resumed_at_frames"] == []


def test_resume_refuses_changed_hyperparameters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert demo("ppo", tmp_path / "run", "--stop-after-frames", "1024") == 0
    capsys.readouterr()
    assert main(["demo", "ppo", "--resume", str(tmp_path / "run"), "--lr", "0.1"]) == 1
    assert "--lr: cannot change on --resume" in capsys.readouterr().err
    assert main(["demo", "dqn", "--resume", str(tmp_path / "run")]) == 1
    assert "holds a 'ppo' run, not 'dqn'" in capsys.readouterr().err


def test_fresh_run_refuses_an_existing_run_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert demo("dqn", tmp_path / "run", frames=512) == 0
    capsys.readouterr()
    assert demo("dqn", tmp_path / "run", frames=512) == 1
    assert "already holds a run; pass --resume" in capsys.readouterr().err
