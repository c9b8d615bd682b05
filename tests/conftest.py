"""Shared fixtures: storages and devices to parametrize over, and a quiet TorchRL logger."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

logging.getLogger("torchrl").setLevel(logging.WARNING)
torch.set_num_threads(1)

STORAGES = ["memory", "memmap"]
# The CUDA case carries the `gpu` mark, so `pytest -m gpu` (the `gpu` nox session) runs it.
DEVICES = ["cpu", *([pytest.param("cuda", marks=pytest.mark.gpu)] if torch.cuda.is_available() else [])]


@pytest.fixture
def minari_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temporary Minari root (``MINARI_DATASETS_PATH``) for the whole test, hypothesis examples too (dataset ids
    never repeat): the offline modules use it for every test (``pytestmark = pytest.mark.usefixtures(...)``)."""
    with tempfile.TemporaryDirectory() as root:
        monkeypatch.setenv("MINARI_DATASETS_PATH", root)
        yield Path(root)


@pytest.fixture
def small_dictionary_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dictionaries trained after 40 frames, so that the tests' short streams have one: the compression modules
    use it for every test (``pytestmark = pytest.mark.usefixtures(...)``)."""
    import rlbuf._frames as frames_module

    monkeypatch.setattr(frames_module, "DICTIONARY_AFTER", 40)


@pytest.fixture(params=STORAGES)
def storage(request: pytest.FixtureRequest) -> str:
    """Each storage kind rlbuf offers."""
    return str(request.param)


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    """Each training device available here (CUDA only where a GPU is present)."""
    return str(request.param)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run ``stress`` tests only when asked for (``-m stress``, as ``nox -s stress`` does)."""
    if "stress" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="stress test: run with -m stress")
    for item in items:
        if "stress" in item.keywords:
            item.add_marker(skip)
