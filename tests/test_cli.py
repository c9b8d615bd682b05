"""The `rlbuf` command: help on every command, `python -m rlbuf`, and `rlbuf inspect`."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torchrl

from rlbuf import CheckpointError, EpisodeStats, ReplayBuffer, RolloutBuffer, _inspect
from rlbuf.cli import main
from rlbuf.demos import DEMOS
from rlbuf.demos._options import ARGS, RunArgs
from rlbuf.demos._progress import Progress

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("argv", [[], ["demo"], ["demo", "ppo"], ["demo", "dqn"], ["demo", "ppo-continuous"],
                                  ["demo", "distill"], ["demo", "her"], ["inspect"]])
def test_every_command_has_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: rlbuf")
    assert ":class:" not in text and "][rlbuf." not in text  # no markup the terminal shows raw
    if argv[:1] == ["demo"] and len(argv) == 2:
        for option in ("--seed", "--device", "--storage {memory,memmap}", "--out", "--checkpoint-every", "--resume",
                       "--stop-after-frames", "--frames"):
            assert option in text


def test_demo_help_says_when_resume_is_exact(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "ppo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "exactly as if never stopped when that checkpoint is a scheduled one (--checkpoint-every)" in text


def test_dqn_help_offers_prioritized_replay(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "dqn", "--help"])
    assert "--prioritized, --no-prioritized" in capsys.readouterr().out


def test_python_dash_m_rlbuf() -> None:
    result = subprocess.run([sys.executable, "-m", "rlbuf", "--help"], capture_output=True, text=True, cwd=ROOT,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert "demo" in result.stdout and "inspect" in result.stdout


def test_version_prints_rlbufs_version(capsys: pytest.CaptureFixture[str]) -> None:
    import rlbuf

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"rlbuf {rlbuf.__version__}\n"
    result = subprocess.run([sys.executable, "-m", "rlbuf", "--version"], capture_output=True, text=True, cwd=ROOT,
                            check=False)
    assert (result.returncode, result.stdout) == (0, f"rlbuf {rlbuf.__version__}\n"), result.stderr


HEAVY = ("torch", "torchrl", "tensordict", "numba")


def heavy_modules_after(code: str) -> list[str]:
    """Run ``code`` in a fresh interpreter; return which heavy libraries it imported."""
    probe = f"import sys\ntry:\n    {code}\nexcept SystemExit:\n    pass\nprint(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1].replace("'", '"'))


@pytest.mark.parametrize(
    "code",
    [
        "import rlbuf",
        "import rlbuf.cli",
        "from rlbuf import RlbufError, __version__",
        "import runpy; sys.argv = ['rlbuf', '--help']; runpy.run_module('rlbuf', run_name='__main__')",
        "import runpy; sys.argv = ['rlbuf', '--version']; runpy.run_module('rlbuf', run_name='__main__')",
        "from rlbuf.cli import main; main(['--version'])",
        "from rlbuf.cli import main; main(['demo', '--help'])",
        "from rlbuf.cli import build_parser; build_parser()",
        *[f"from rlbuf.cli import main; main(['demo', {name!r}, '--help'])" for name in DEMOS],
        "from rlbuf.cli import main; main(['inspect', '--help'])",
    ],
)
def test_the_command_and_the_package_import_no_torch(code: str) -> None:
    """Every ``--help`` answers without torch (issue 21: under 0.5 s; timed by benchmarks/cli.py, not here)."""
    assert heavy_modules_after(code) == []


def test_a_demos_help_shows_its_module_docstring_as_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "ppo-continuous", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "PPO on Pendulum-v1, CleanRL-style" in text and "the Recorder stores the step" in text
    assert "``" not in text and "][" not in text


def test_every_demo_has_its_options_and_a_module() -> None:
    assert list(ARGS) == list(DEMOS)
    for name, options in ARGS.items():
        assert importlib.import_module(f"rlbuf.demos.{name.replace('-', '_')}").Args is options


def test_inspect_imports_no_torch(checkpoint: Path) -> None:
    code = f"from rlbuf.cli import main; assert main(['inspect', {str(checkpoint)!r}]) == 0"
    assert heavy_modules_after(code) == []


def test_public_names_resolve_on_first_use() -> None:
    import rlbuf

    assert set(rlbuf.__all__) <= set(dir(rlbuf))
    # The three lists of public names in rlbuf/__init__.py are kept by hand: they must agree.
    typed = {alias.asname or alias.name: node.module
             for block in ast.parse((ROOT / "rlbuf" / "__init__.py").read_text(encoding="utf-8")).body
             if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
             for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert typed == rlbuf._MODULE_OF
    assert set(rlbuf.__all__) == {*rlbuf._MODULE_OF, "__version__"}
    for name, module in rlbuf._MODULE_OF.items():
        assert getattr(rlbuf, name) is getattr(importlib.import_module(module), name)
    assert rlbuf.ReplayBuffer.__module__ == "rlbuf.replay"
    with pytest.raises(AttributeError, match="module 'rlbuf' has no attribute 'NoSuchName'"):
        _ = rlbuf.NoSuchName  # type: ignore[attr-defined]


def test_bad_usage_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "ppo", "--storage", "tape"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'tape'" in capsys.readouterr().err


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    buffer = ReplayBuffer(16, obs_shape=(3,), action_shape=(), action_dtype=torch.int64, prioritized=True, seed=0)
    for step in range(5):
        buffer.add(torch.randn(3), step % 2, 1.0, torch.randn(3), step == 4, truncated=False)
    buffer.save(tmp_path / "ckpt")
    return tmp_path / "ckpt"


def test_inspect_prints_a_table(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(checkpoint)]) == 0
    text = capsys.readouterr().out
    assert "kind        ReplayBuffer" in text
    assert "size        5 / 16 rows" in text
    assert "storing device cpu" in text
    assert f"torchrl {torchrl.__version__}" in text  # the version that wrote it, nightlies included
    assert ["next_obs", "next.observation", "(3,)", "float32"] in [line.split() for line in text.splitlines()]
    assert "tensors/state.fields.action.bin" in text
    assert text.rstrip().endswith("status      ok")
    assert "failed" not in text


def test_inspect_json(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(checkpoint), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["error"] is None
    assert report["kind"] == "ReplayBuffer" and report["capacity"] == 16
    assert {f["name"]: f["shape"] for f in report["fields"]}["obs"] == [3]
    assert {f["status"] for f in report["files"]} == {"ok"}


def test_inspect_rollout_capacity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    RolloutBuffer(4, 2, obs_shape=(3,), action_shape=()).save(tmp_path / "rollout")
    assert main(["inspect", str(tmp_path / "rollout"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["capacity"] == 8


def test_the_inspect_table_of_a_forged_manifest_never_raises(checkpoint: Path) -> None:
    report = _inspect.inspect_checkpoint(checkpoint)
    for versions in ([1, 2], "x", None):
        forged = {**report, "versions": versions, "fields": [{**report["fields"][0], "key": [1, 2]}]}
        text = _inspect.format_report(forged)
        assert f"versions    {versions}" in text and "1.2" in text


def test_inspect_flags_a_corrupted_file(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = checkpoint / "tensors" / "state.fields.reward.bin"
    data = bytearray(target.read_bytes())
    data[0] ^= 0xFF
    target.write_bytes(bytes(data))
    assert main(["inspect", str(checkpoint)]) == 1
    text = capsys.readouterr().out
    assert "tensors/state.fields.reward.bin" in text
    row = next(line for line in text.splitlines() if "state.fields.reward.bin" in line)
    assert row.rstrip().endswith("failed")
    assert "status      FAILED:" in text and "XXH3-128 mismatch" in text
    assert main(["inspect", str(checkpoint), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    assert {f["path"]: f["status"] for f in report["files"]}["tensors/state.fields.reward.bin"] == "failed"


def test_inspect_flags_a_missing_file_and_a_bad_manifest(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (checkpoint / "tensors" / "state.fields.obs.bin").unlink()
    assert main(["inspect", str(checkpoint), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert {f["path"]: f["status"] for f in report["files"]}["tensors/state.fields.obs.bin"] == "missing"
    (checkpoint / "manifest.json").write_text("{not json")
    assert main(["inspect", str(checkpoint)]) == 1
    assert "manifest.json: unreadable" in capsys.readouterr().out


def test_inspect_refuses_what_is_not_a_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(tmp_path)]) == 1
    assert "not a checkpoint directory, demo checkpoint or demo output folder" in capsys.readouterr().out
    # A path that does not exist was reported as "not a checkpoint directory" alone (helper 75).
    assert main(["inspect", str(tmp_path / "no" / "such")]) == 1
    assert f"{tmp_path / 'no' / 'such'}: does not exist (expected a checkpoint directory" in capsys.readouterr().out


def test_inspect_refuses_an_unexpected_pickle(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (checkpoint / "prefetch.pkl").write_bytes(b"\x80\x04N.")
    assert main(["inspect", str(checkpoint)]) == 1
    assert "unexpected file 'prefetch.pkl'" in capsys.readouterr().out


def _small_checkpoint(path: Path) -> Path:
    buffer = ReplayBuffer(8, obs_shape=(2,), action_shape=())
    buffer.add(torch.zeros(2), 0.0, 1.0, torch.ones(2), False, truncated=False)
    buffer.save(path)
    return path


def test_inspect_of_a_tensors_directory_that_links_to_itself_is_one_line_of_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _small_checkpoint(tmp_path / "ckpt")
    for item in (path / "tensors").iterdir():
        item.unlink()
    (path / "tensors").rmdir()
    (path / "tensors").symlink_to("tensors")
    assert main(["inspect", str(path)]) == 1
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    [status] = [line for line in out.out.splitlines() if line.startswith("status")]
    assert "FAILED" in status and "link" in status
    with pytest.raises(CheckpointError, match="link"):
        ReplayBuffer.load(path)


def test_inspect_of_a_manifest_listing_200_000_files_does_bounded_work(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    path = _small_checkpoint(tmp_path / "ckpt")
    manifest = json.loads((path / "manifest.json").read_text())
    entry = next(iter(manifest["files"].values()))
    manifest["files"].update({f"tensors/x{i}.bin": entry for i in range(200_000)})
    (path / "manifest.json").write_text(json.dumps(manifest))
    checked: list[str] = []
    check_file = _inspect._check_file

    def counting(root: Path, rel: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        checked.append(rel)
        return check_file(root, rel, *args, **kwargs)

    monkeypatch.setattr(_inspect, "_check_file", counting)
    assert main(["inspect", str(path)]) == 1
    out = capsys.readouterr().out
    assert "lists 200009 files, more than the 10000" in out.splitlines()[-1]
    assert len(checked) == _inspect.LISTED_FILES
    assert f"and {200_009 - _inspect.LISTED_FILES} more files" in out
    with pytest.raises(CheckpointError, match="lists 200009 files"):
        ReplayBuffer.load(path)


@pytest.mark.parametrize("duplicate", ["format_version", "file entry"])
def test_a_manifest_with_a_key_twice_is_refused_by_load_and_inspect(tmp_path: Path, duplicate: str) -> None:
    path = _small_checkpoint(tmp_path / "ckpt")
    text = (path / "manifest.json").read_text()
    if duplicate == "format_version":
        text = text.replace('"format_version": 2,', '"format_version": 2, "format_version": 1,', 1)
    else:
        manifest = json.loads(text)
        rel, entry = next(iter(manifest["files"].items()))
        text = text.replace('"files": {', '"files": {' + json.dumps(rel) + ": " + json.dumps(entry) + ", ", 1)
    (path / "manifest.json").write_text(text)
    with pytest.raises(CheckpointError, match="appears twice"):
        ReplayBuffer.load(path)
    report = _inspect.inspect_checkpoint(path)
    assert not report["ok"] and "appears twice" in report["error"]


# -- progress on stderr ------------------------------------------------------------------------------
def last_frame(stderr: str) -> str:
    """The bar as a terminal shows it last: the text after the last carriage return."""
    return [frame for frame in stderr.replace("\n", "\r").split("\r") if frame.strip()][-1]


@pytest.mark.parametrize("stop_at_target", [True, False])
def test_a_bar_closed_before_the_end_stays_where_it_was(stop_at_target: bool,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    progress = Progress(RunArgs(frames=1_000, progress=True, target_return=10.0, stop_at_target=stop_at_target), 0)
    stats = EpisodeStats(1)
    for _ in range(20):
        stats.update(1.0, True)            # a mean return of 1: the target (10) is not reached
    progress.log(300, stats)
    progress.close()                        # as after a Ctrl-C at 300 frames
    frame = last_frame(capsys.readouterr().err)
    assert "300/1" in frame and " 30%" in frame and "100%" not in frame


def test_a_run_done_at_its_target_closes_the_bar_at_100_percent(capsys: pytest.CaptureFixture[str]) -> None:
    progress = Progress(RunArgs(frames=1_000, progress=True, target_return=10.0), 0)
    stats = EpisodeStats(1)
    for _ in range(20):
        stats.update(50.0, True)
    progress.log(300, stats)
    assert progress.done(300)
    progress.close()
    frame = last_frame(capsys.readouterr().err)
    assert "100%" in frame and "300/300" in frame


TINY_PPO = ["--frames", "2048", "--num-steps", "32", "--epochs", "2", "--checkpoint-every", "1024",
            "--no-stop-at-target"]


def test_ctrl_c_leaves_the_bar_where_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from test_demos import interrupt_at

    interrupt_at(monkeypatch, 512)          # a real SIGINT once the demo has logged 512 frames
    assert main(["demo", "ppo", "--out", str(tmp_path / "run"), "--progress", *TINY_PPO]) == 130
    errors = capsys.readouterr().err
    assert errors.splitlines()[-1].startswith("rlbuf demo ppo: interrupted at 512 frames")
    bar = last_frame(errors[:errors.rindex("rlbuf demo ppo: interrupted")])
    assert "512/2" in bar and " 25%" in bar and "100%" not in bar


def test_a_demo_logging_to_a_file_writes_lines_not_bar_frames(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "ppo", "--out", str(tmp_path / "run"), *TINY_PPO]) == 0  # stderr is no terminal here
    errors = capsys.readouterr().err
    assert "\r" not in errors and "\x1b" not in errors
    lines = [line for line in errors.splitlines() if " frames (" in line]
    assert lines[0].startswith("256/2048 frames (12%), ") and lines[-1].startswith("2048/2048 frames (100%), ")
    assert 5 <= len(lines) <= 10            # about one a tenth of --frames, not one per update
    assert main(["demo", "ppo", "--out", str(tmp_path / "quiet"), "--no-progress", *TINY_PPO]) == 0
    assert " frames (" not in capsys.readouterr().err
