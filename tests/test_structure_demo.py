"""The recurrent PPO demo runs end to end on a tiny budget and resumes exactly (it must run, not learn)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from test_demos import interrupt_at

from rlbuf.cli import main
from rlbuf.demos._options import MLP_DEFAULTS, RECURRENT_DEFAULTS
from rlbuf.demos.ppo import Args
from rlbuf.demos.ppo_recurrent import HideVelocities, make_envs


def recurrent(out: Path, *extra: str) -> int:
    return main(["demo", "ppo", "--recurrent", "--out", str(out), "--frames", "1024", "--num-envs", "4",
                 "--num-steps", "16", "--hidden", "16", "--checkpoint-every", "512", "--no-progress",
                 "--no-stop-at-target", *extra])


def parameters(out: Path) -> dict[str, torch.Tensor]:
    saved: dict[str, torch.Tensor] = torch.load(out / "model.pt", weights_only=True)["policy"]
    return saved


def test_recurrent_demo_runs_and_resumes_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert recurrent(tmp_path / "whole") == 0
    summary = json.loads((tmp_path / "whole" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["frames"] == 1024 and summary["args"]["recurrent"]
    assert summary["episodes"] > 0
    assert recurrent(tmp_path / "split", "--stop-after-frames", "512") == 0
    interrupt_at(monkeypatch, 512)  # Ctrl-C on a --checkpoint-every boundary: the resumed run is exact too
    assert recurrent(tmp_path / "ctrl-c") == 130
    monkeypatch.undo()
    checkpoint = tmp_path / "ctrl-c" / "checkpoints" / f"frames-{512:012d}"
    assert json.loads((checkpoint / "meta.json").read_text())["reason"] == "interrupt"
    assert json.loads((tmp_path / "ctrl-c" / "summary.json").read_text())["status"] == "interrupted"
    whole = parameters(tmp_path / "whole")
    for run in ("split", "ctrl-c"):
        assert main(["demo", "ppo", "--resume", str(tmp_path / run), "--no-progress"]) == 0
        resumed = parameters(tmp_path / run)
        assert whole.keys() == resumed.keys()
        assert all(torch.equal(whole[key], resumed[key]) for key in whole), run


def test_velocities_are_hidden() -> None:
    envs = make_envs(2)
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (2, 2)
    full, _ = HideVelocities(__import__("gymnasium").make("CartPole-v1")).env.reset(seed=0)
    assert obs[0].tolist() == [float(full[0]), float(full[2])]


def test_recurrent_defaults_replace_only_the_mlp_defaults() -> None:
    fields = {field.name: field.default for field in dataclasses.fields(Args)}
    assert {name: fields[name] for name in MLP_DEFAULTS} == MLP_DEFAULTS
    args = Args(recurrent=True, epochs=7)
    assert args.epochs == 7 and args.num_steps == RECURRENT_DEFAULTS["num_steps"]
    assert Args().num_steps == MLP_DEFAULTS["num_steps"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_recurrent_demo_trains_on_cuda(tmp_path: Path) -> None:
    assert recurrent(tmp_path / "run", "--device", "cuda") == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["frames"] == 1024
    assert all(tensor.is_cuda for tensor in parameters(tmp_path / "run").values())
