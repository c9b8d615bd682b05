"""mkdocs hook: the site shows the package version, read from pyproject.toml (its one source).

``mkdocs.yml`` lists it under ``hooks:``; it sets ``extra.version`` and appends the version to
``site_name`` (the header and every page title).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any


def project_version(root: Path) -> str:
    """The ``[project] version`` of ``root/pyproject.toml``."""
    with open(root / "pyproject.toml", "rb") as file:
        return str(tomllib.load(file)["project"]["version"])


def on_config(config: Any) -> Any:
    """Put the version into the site's name and ``extra.version``."""
    version = project_version(Path(config["config_file_path"]).parent)
    config["extra"]["version"] = version
    config["site_name"] = f"{config['site_name']} {version}"
    return config
