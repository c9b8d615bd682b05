"""The demos run end to end on a tiny budget (they must run, not learn), and resume exactly.

`nox -s demos-full` runs them with their default budgets, to learn.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from rlbuf.cli import main
from rlbuf.demos import _checkpoint, _progress, _run

ROOT = Path(__file__).resolve().parent.parent

# Small enough to run in seconds, large enough that every demo trains and checkpoints.
TINY = {
    "ppo": ["--num-steps", "32", "--epochs", "2"],
    "dqn": ["--learning-starts", "256"],
    "ppo-continuous": ["--num-steps", "32", "--epochs", "2", "--num-minibatches", "4"],
    "distill": ["--teacher-frames", "512", "--num-steps", "32", "--gradient-steps", "4", "--eval-episodes", "2"],
    "her": ["--n-bits", "6", "--num-envs", "8", "--learning-starts", "256", "--batch-size", "32", "--hidden", "32"],
}


def demo(name: str, out: Path, *extra: str, frames: int = 2048) -> int:
    return main(["demo", name, "--out", str(out), "--frames", str(frames), "--checkpoint-every", "1024",
                 "--no-progress", "--no-stop-at-target", *TINY[name], *extra])


def final_parameters(out: Path) -> dict[str, torch.Tensor]:
    saved = torch.load(out / "model.pt", weights_only=True)
    return {f"{net}.{key}": value for net, state in saved.items() if isinstance(state, dict)
            for key, value in state.items()}


@pytest.mark.parametrize("name", ["ppo", "dqn", "ppo-continuous", "distill", "her"])
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


# Checkpoint boundaries the Ctrl-C test hits exactly: the DQN demos (dqn, her) log (and so get interrupted, in
# the test) every 1000 frames, the others after every 256-frame rollout.
EVERY = {"ppo": 1024, "dqn": 1000, "ppo-continuous": 1024, "distill": 1024, "her": 1000}


def interrupt_at(monkeypatch: pytest.MonkeyPatch, frames: int) -> None:
    """Press Ctrl-C (a real SIGINT to this process) once, when the demo logs ``frames`` or more."""
    log = _progress.Progress.log

    def log_then_interrupt(self: _progress.Progress, at: int, *args: Any, **kwargs: Any) -> float | None:
        recent = log(self, at, *args, **kwargs)
        if at >= frames and not pressed:
            pressed.append(at)
            signal.raise_signal(signal.SIGINT)
        return recent

    pressed: list[int] = []
    monkeypatch.setattr(_progress.Progress, "log", log_then_interrupt)


@pytest.mark.parametrize("name", ["ppo", "dqn", "ppo-continuous", "distill", "her"])
def test_stopped_or_interrupted_and_resumed_runs_end_with_the_same_parameters(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    every = EVERY[name]
    options = ["--storage", "memmap" if name == "dqn" else "memory", "--checkpoint-every", str(every)]
    assert demo(name, tmp_path / "whole", *options) == 0
    assert demo(name, tmp_path / "split", *options, "--stop-after-frames", str(every)) == 0
    stopped = json.loads((tmp_path / "split" / "summary.json").read_text())
    assert stopped["status"] == "stopped"
    assert not (tmp_path / "split" / "model.pt").exists()

    interrupt_at(monkeypatch, every)
    capsys.readouterr()
    assert demo(name, tmp_path / "ctrl-c", *options) == 130
    monkeypatch.undo()
    checkpoint = tmp_path / "ctrl-c" / "checkpoints" / f"frames-{every:012d}"
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"rlbuf demo {name}: interrupted at {every} frames; checkpoint {checkpoint}; "
        f"continue with: rlbuf demo {name} --resume {tmp_path / 'ctrl-c'}")
    assert json.loads((checkpoint / "meta.json").read_text())["reason"] == "interrupt"
    assert json.loads((tmp_path / "ctrl-c" / "summary.json").read_text())["status"] == "interrupted"

    whole = final_parameters(tmp_path / "whole")
    for run in ("split", "ctrl-c"):
        assert main(["demo", name, "--resume", str(tmp_path / run), "--no-progress"]) == 0
        reason = "interrupt" if run == "ctrl-c" else "scheduled"
        assert (f"resuming {tmp_path / run} from checkpoints/frames-{every:012d} ({reason}): "
                f"{every} of 2048 frames done") in capsys.readouterr().out
        resumed = final_parameters(tmp_path / run)
        assert whole.keys() == resumed.keys()
        for key in whole:
            assert torch.equal(whole[key], resumed[key]), (run, key)
        summaries = [json.loads((tmp_path / r / "summary.json").read_text()) for r in ("whole", run)]
        assert summaries[0]["frames"] == summaries[1]["frames"]
        assert summaries[0]["episodes"] == summaries[1]["episodes"]
        assert summaries[0]["resumed_at_frames"] == [] and summaries[1]["resumed_at_frames"] == [every]


def test_ctrl_c_in_a_terminal_saves_and_says_how_to_resume(tmp_path: Path) -> None:
    """A real SIGINT from outside, sent once the resumed run has said what it resumed."""
    out = tmp_path / "run"
    assert demo("ppo", out, "--stop-after-frames", "1024") == 0
    command = [sys.executable, "-m", "rlbuf", "demo", "ppo", "--resume", str(out), "--frames", "1000000",
               "--no-progress"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT) as process:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert first == f"resuming {out} from checkpoints/frames-000000001024 (scheduled): 1024 of 1000000 frames done\n"
        process.send_signal(signal.SIGINT)
        rest, errors = process.communicate(timeout=600)
    assert process.returncode == 130, errors
    assert "Traceback" not in errors
    checkpoint = _run.latest_checkpoint(out)
    assert checkpoint is not None
    frames = _checkpoint.read_meta(checkpoint)["frames"]
    assert frames > 1024 and _checkpoint.read_meta(checkpoint)["reason"] == "interrupt"
    assert errors.splitlines()[-1] == (f"rlbuf demo ppo: interrupted at {frames} frames; checkpoint {checkpoint}; "
                                       f"continue with: rlbuf demo ppo --resume {out}")
    assert rest == ""

    assert main(["demo", "ppo", "--resume", str(out), "--frames", str(frames + 256), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["frames"] == frames + 256
    assert summary["resumed_at_frames"] == [1024, frames]


def test_ctrl_c_while_distill_trains_its_teacher_resumes_through_the_distill_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "distill"
    interrupt_at(monkeypatch, 512)
    assert demo("distill", out, "--teacher-frames", "1024", frames=512) == 130
    monkeypatch.undo()
    checkpoint = out / "teacher" / "checkpoints" / f"frames-{512:012d}"
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"rlbuf demo distill: interrupted at 512 frames; checkpoint {checkpoint}; "
        f"continue with: rlbuf demo distill --resume {out}")
    assert main(["demo", "distill", "--resume", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert f"resuming {out / 'teacher'} from checkpoints/frames-{512:012d} (interrupt): 512 of 1024 frames" in printed
    assert f"resuming {out}: no checkpoint of this stage yet, it starts at frame 0" in printed
    assert json.loads((out / "teacher" / "summary.json").read_text())["frames"] == 1024
    assert json.loads((out / "summary.json").read_text())["status"] == "finished"


def test_resume_refuses_a_folder_without_a_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert demo("dqn", tmp_path / "killed", frames=1024) == 0
    for path in (tmp_path / "killed").iterdir():  # as if killed (SIGKILL) right after setup
        if path.name != "config.json":
            (path.unlink() if path.is_file() else shutil.rmtree(path))
    capsys.readouterr()
    assert main(["demo", "dqn", "--resume", str(tmp_path / "killed"), "--no-progress"]) == 2
    assert capsys.readouterr().err == (
        f"rlbuf demo dqn: --resume {tmp_path / 'killed'}: no checkpoint to resume from (the run was stopped before "
        f"its first one); start it again with another --out, or remove {tmp_path / 'killed'}\n")
    assert [p.name for p in (tmp_path / "killed").iterdir()] == ["config.json"]


@pytest.mark.parametrize("device", ["cuda", "mps"])
def test_a_device_this_machine_lacks_is_refused_before_anything_is_written(
        device: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if getattr(torch, device).is_available():
        pytest.skip(f"this machine has a {device} device")
    assert main(["demo", "ppo", "--device", device, "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"rlbuf demo ppo: --device: {device} was asked for, but ")
    assert len(error.splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_resume_refuses_changed_hyperparameters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert demo("ppo", tmp_path / "run", "--stop-after-frames", "1024") == 0
    capsys.readouterr()
    assert main(["demo", "ppo", "--resume", str(tmp_path / "run"), "--lr", "0.1"]) == 2
    assert "--lr: cannot change on --resume" in capsys.readouterr().err
    assert main(["demo", "dqn", "--resume", str(tmp_path / "run")]) == 2
    assert "holds a 'ppo' run, not 'dqn'" in capsys.readouterr().err


def test_fresh_run_refuses_an_existing_run_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert demo("dqn", tmp_path / "run", frames=512) == 0
    capsys.readouterr()
    assert demo("dqn", tmp_path / "run", frames=512) == 2
    assert "already holds a run; pass --resume" in capsys.readouterr().err


def test_pendulum_compare_stops_on_ctrl_c_and_the_same_command_continues(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from rlbuf.demos import ppo_continuous

    command = ["compare", "--seeds", "1", "--out", str(tmp_path), "--frames", "4096"]
    interrupt_at(monkeypatch, 2048)                   # after the first rollout of the first run
    assert ppo_continuous.main(command) == 130
    monkeypatch.undo()
    assert "interrupted at 2048 frames; run the same command again" in capsys.readouterr().err
    assert not (tmp_path / "compare.json").exists()
    assert ppo_continuous.main(command) == 0
    report = json.loads((tmp_path / "compare.json").read_text())
    assert [run["frames"] for variant in ("bootstrapped", "folded") for run in report[variant]["runs"]] == [4096] * 2
    resumed = json.loads((tmp_path / "bootstrapped-seed1" / "summary.json").read_text())
    assert resumed["status"] == "finished" and resumed["resumed_at_frames"] == [2048]
    assert (tmp_path / "compare.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("hindsight", [True, False])
def test_her_demo_reports_success_rates_and_samples_relabelled_goals_only_with_hindsight(
        hindsight: bool, tmp_path: Path) -> None:
    from rlbuf import ReplayBuffer
    from rlbuf.demos.bitflip import BitFlipEnv

    out = tmp_path / "her"
    assert demo("her", out, "--hindsight" if hindsight else "--no-hindsight", frames=1024) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["variant"] == ("hindsight (future, 0.8)" if hindsight else "no hindsight")
    assert summary["success_window"] == 100 and summary["episodes"] >= 100
    assert 0.0 <= summary["success_rate"] <= 1.0 and 0.0 <= summary["mean_return_last_20"] <= 1.0

    checkpoint = _run.latest_checkpoint(out)
    assert checkpoint is not None
    buffer = ReplayBuffer.load(checkpoint / "buffer", reward_fn=BitFlipEnv.compute_reward if hindsight else None)
    batch = buffer.sample(2048)
    stored = buffer.sample_by_index(batch.index)
    relabelled = (batch.obs["desired_goal"] != stored.obs["desired_goal"]).any(-1)
    # ratio 0.8; a goal drawn equal to the stored one (rare with 6 bits) counts as not relabelled
    assert 0.6 < relabelled.float().mean().item() < 0.85 if hindsight else not relabelled.any()
    assert torch.equal(batch.obs["desired_goal"], batch.next_obs["desired_goal"])
    expected = BitFlipEnv.compute_reward(batch.next_obs["achieved_goal"].numpy(), batch.next_obs["desired_goal"].numpy(), {})
    assert torch.equal(batch.reward, torch.from_numpy(expected))
    assert torch.equal(batch.terminated, stored.terminated) and torch.equal(batch.truncated, stored.truncated)


def test_her_compare_runs_both_variants_and_plots_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rlbuf.demos import her

    results = her.compare(1, tmp_path, 512, {"n_bits": 4, "num_envs": 8, "learning_starts": 256, "batch_size": 32,
                                             "hidden": 16, "progress": False})
    assert list(results) == ["hindsight", "no-hindsight"]
    assert [run["frames"] for variant in results.values() for run in variant["runs"]] == [512, 512]
    assert all(0.0 <= variant["mean"] <= 1.0 for variant in results.values())
    assert (tmp_path / "compare.png").read_bytes().startswith(b"\x89PNG")
    assert json.loads((tmp_path / "compare.json").read_text()) == json.loads(json.dumps(results))
