"""rlbuf.offline: a dataset larger than the memory an import may take loads into a memmap buffer.

No cgroup can be set from a test, so the budget is the kernel's ``RLIMIT_DATA``: since Linux 4.7 it
bounds a process's private writable memory (its heap, anonymous mappings, thread stacks), and not a
shared file mapping such as a memmap storage's files. A child process imports a small dataset first
(its threads, pools and allocator arenas started, as in any program that has run for a while), sets
the limit to the memory it has then plus ``BUDGET``, and imports a dataset six times that size:
into ``storage="memmap"`` it loads, every row in place. The same import into ``storage="memory"``
under the same limit is refused (MemoryError), which shows the limit holds on this kernel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

minari = pytest.importorskip("minari")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
from minari.data_collector import EpisodeBuffer  # noqa: E402

import rlbuf  # noqa: E402

BUDGET = 16 << 20
"""Private memory the large import may add (a worker thread's stack, two chunks' arrays ...)."""
EPISODES, STEPS, WIDTH = 200, 1000, 64  # observations: 200 x 1001 x 64 float64, 102 MB (6.1 x BUDGET)

CHILD = r"""
import json, resource, sys
import torch
from rlbuf.offline import from_minari

def status(key):
    with open("/proc/self/status") as file:
        return next(int(line.split()[1]) * 1024 for line in file if line.startswith(key + ":"))

small, large, storage, scratch, budget = sys.argv[1:]
options = {"storage": storage, **({"scratch_dir": scratch} if storage == "memmap" else {})}
from_minari(small, **options).close()
resource.setrlimit(resource.RLIMIT_DATA, (status("VmData") + int(budget), resource.getrlimit(resource.RLIMIT_DATA)[1]))
anon = status("RssAnon")
try:
    buffer = from_minari(large, **options)
except (MemoryError, RuntimeError) as error:
    print(json.dumps({"loaded": False, "error": f"{type(error).__name__}: {error}"[:300]}))
else:
    rows = buffer.sample_by_index(torch.tensor([0, len(buffer) - 1]))
    print(json.dumps({"loaded": True, "rows": len(buffer), "first_obs": rows.obs[0].tolist(),
                      "last_next_obs": rows.next_obs[1].tolist(), "anon_added": status("RssAnon") - anon}))
"""


def _write(dataset_id: str, episodes: int, obs: np.ndarray[Any, Any], data_format: str) -> None:
    end = np.arange(STEPS) == STEPS - 1
    buffers = (EpisodeBuffer(seed=n, observations=obs + n, actions=np.zeros((STEPS, 2), np.float32),
                             rewards=np.ones(STEPS), terminations=end, truncations=np.zeros(STEPS, bool))
               for n in range(episodes))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Minari's reminders of metadata
        minari.create_dataset_from_buffers(dataset_id, buffers, data_format=data_format,
                                           observation_space=gym.spaces.Box(-np.inf, np.inf, (WIDTH,), np.float64),
                                           action_space=gym.spaces.Box(-1, 1, (2,), np.float32))


def _import(root: Path, data_format: str, storage: str, scratch: Path) -> dict[str, Any]:
    env = {**os.environ, "MINARI_DATASETS_PATH": str(root),
           "PYTHONPATH": os.pathsep.join([str(Path(rlbuf.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", CHILD, f"small/{data_format}-v0", f"large/{data_format}-v0", storage,
                          str(scratch), str(BUDGET)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.stress
@pytest.mark.parametrize("data_format", ["hdf5", "arrow"])
def test_a_dataset_six_times_the_memory_allowed_loads_into_a_memmap_buffer(data_format: str, tmp_path: Path) -> None:
    obs = np.random.default_rng(0).standard_normal((STEPS + 1, WIDTH))
    os.environ["MINARI_DATASETS_PATH"] = str(tmp_path / "datasets")
    try:
        _write(f"small/{data_format}-v0", 2, obs, data_format)
        _write(f"large/{data_format}-v0", EPISODES, obs, data_format)
    finally:
        del os.environ["MINARI_DATASETS_PATH"]
    assert EPISODES * (STEPS + 1) * WIDTH * 8 > 6 * BUDGET
    control = _import(tmp_path / "datasets", data_format, "memory", tmp_path)
    if control["loaded"]:
        pytest.skip("this kernel does not enforce RLIMIT_DATA (booted with ignore_rlimit_data?)")
    loaded = _import(tmp_path / "datasets", data_format, "memmap", tmp_path / "scratch")
    assert loaded["loaded"], loaded
    assert loaded["rows"] == EPISODES * STEPS
    assert loaded["first_obs"] == obs[0].tolist() and loaded["last_next_obs"] == (obs[-1] + EPISODES - 1).tolist()
    assert loaded["anon_added"] < BUDGET
