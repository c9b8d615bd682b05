"""``rlbuf inspect``: a checkpoint's manifest as a table (or JSON), every file's checksum verified.

PATH may be a buffer checkpoint (written by ``buffer.save``), a demo checkpoint (its
``buffer/`` is inspected, and the SHA-256 of its ``state.pt`` checked) or a demo output folder
(its newest checkpoint). Nothing is unpickled: only JSON is parsed and files are hashed.

Example:
    >>> import tempfile, torch
    >>> from pathlib import Path
    >>> from rlbuf import ReplayBuffer
    >>> buf = ReplayBuffer(8, obs_shape=(2,), action_shape=(), action_dtype=torch.int64, seed=0)
    >>> buf.add(torch.zeros(2), 1, 0.5, torch.ones(2), False, truncated=False)
    >>> path = Path(tempfile.mkdtemp()) / "ckpt"
    >>> buf.save(path)
    >>> report = inspect_checkpoint(path)
    >>> report["ok"], report["kind"], report["size"], report["capacity"]
    (True, 'ReplayBuffer', 1, 8)
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from rlbuf._manifest import (
    MANIFEST,
    buffer_checkpoint,
    file_digest,
    file_matches,
    inside_checkpoint,
    parse_manifest,
    plain_file_text,
    read_manifest,
)
from rlbuf._manifest_state import check_manifest_state
from rlbuf._sizing import manifest_row_bytes
from rlbuf.errors import CheckpointError

LISTED_FILES = 1000
"""The most files a report lists (and checks one by one); a manifest listing more is refused anyway."""


def inspect_checkpoint(path: str | Path) -> dict[str, Any]:
    """Describe and verify a checkpoint; never raises for a damaged one (``ok`` says).

    Returns:
        ``{"path", "ok", "error", "kind", "size", "capacity", "storage", "storing_device",
        "device", "hindsight", "compression": {codec, level} or None, "fields": [{name, key, shape, dtype}],
        "versions", "format_version",
        "files": [{path, dtype, shape, bytes, status}], "files_not_listed", "demo"}`` (the first
        ``LISTED_FILES`` files, in name order); ``status`` is ``ok``,
        ``failed`` (size or checksum differ), ``missing``, or ``outside`` (a path outside the
        checkpoint or a link: never read). ``demo`` (frames, state file
        status) is set for demo checkpoints.

    Example:
        >>> inspect_checkpoint("/nonexistent")["error"]
        '/nonexistent: does not exist (expected a checkpoint directory, demo checkpoint or demo output folder: check the path)'
    """
    root = Path(path)
    report: dict[str, Any] = {"path": str(root), "ok": False, "error": None, "demo": None, "files": []}
    try:
        buffer_dir = buffer_checkpoint(root)
        exists = root.exists()
    except OSError as error:  # a name too long, a directory without permission: said, not raised
        report["error"] = f"{root}: unreadable ({error.strerror})"
        return report
    if buffer_dir is None:
        report["error"] = (f"{root}: not a checkpoint directory, demo checkpoint or demo output folder (links inside "
                           f"it are not followed)" if exists else f"{root}: does not exist (expected a checkpoint "
                                                                  f"directory, demo checkpoint or demo output folder: check the path)")
        return report
    if buffer_dir != root:
        report["demo"] = _demo_part(buffer_dir.parent)
    report["path"] = str(buffer_dir)
    try:  # as load reads it: a plain file inside the checkpoint, of a manifest's size at most (never a link or a pipe)
        manifest = parse_manifest(plain_file_text(buffer_dir / MANIFEST), buffer_dir / MANIFEST)
        if not isinstance(manifest, dict):
            raise CheckpointError("not a JSON object")
    except CheckpointError as error:
        report["error"] = f"{buffer_dir / MANIFEST}: unreadable ({error})"
        return report
    try:
        manifest = read_manifest(buffer_dir)  # the version verified: a save may have swapped in a newer one
        check_manifest_state(manifest)  # what load refuses too: the manifest has no checksum of its own
    except CheckpointError as error:
        report["error"] = str(error) if str(buffer_dir) in str(error) else f"{buffer_dir / MANIFEST}: {error}"
    try:
        # Files of a verified checkpoint are not hashed a second time.
        _describe(report, buffer_dir, manifest, verified=report["error"] is None)
    except Exception as error:  # documented as never raising: a forged manifest is reported, not raised
        report["error"] = f"{buffer_dir / MANIFEST}: malformed ({type(error).__name__}: {error})"
        return report
    demo_ok = report["demo"] is None or report["demo"]["state_status"] == "ok"
    if report["error"] is None and not demo_ok:
        report["error"] = f"{buffer_dir.parent / 'state.pt'}: {report['demo']['state_status']} (SHA-256 mismatch)"
    report["ok"] = report["error"] is None
    return report


def _describe(report: dict[str, Any], buffer_dir: Path, manifest: dict[str, Any], *, verified: bool) -> None:
    state: dict[str, Any] = manifest["state"] if isinstance(manifest.get("state"), dict) else {}
    options: dict[str, Any] = state["options"] if isinstance(state.get("options"), dict) else {}
    files: dict[str, Any] = manifest["files"] if isinstance(manifest.get("files"), dict) else {}
    report.update({
        "kind": state.get("kind"),
        "format_version": manifest.get("format_version"),
        "versions": manifest.get("versions"),
        "size": state.get("size"),
        "capacity": _capacity(options),
        "bytes_per_transition": _with_compressed_frames(
            manifest_row_bytes(state.get("kind"), options, _as_list(state.get("spec"))), options, files, state),
        "compression": {"codec": options["compression"], "level": options.get("compression_level")}
        if isinstance(options.get("compression"), str) else None,
        "storage": options.get("storage"),
        "storing_device": options.get("storing_device"),
        "device": options.get("device") or options.get("storing_device"),
        "hindsight": options.get("hindsight"),
        "fields": [{"name": s.get("name"), "key": s.get("key"), "shape": s.get("shape"), "dtype": s.get("dtype")}
                   for s in _as_list(state.get("spec")) if isinstance(s, dict)],
        "files": [_check_file(buffer_dir, str(rel), files[rel], verified=verified)
                  for rel in sorted(files)[:LISTED_FILES]],
        "files_not_listed": max(0, len(files) - LISTED_FILES),
    })


def _with_compressed_frames(estimate: float | None, options: dict[str, Any], files: dict[str, Any],
                            state: dict[str, Any]) -> float | None:
    """The estimate with a compressed buffer's frames as the checkpoint holds them: their bytes per stored
    row (the final observations' too) and 16 bytes of offset, size and checksum."""
    size = state.get("size")
    if estimate is None or not options.get("compression"):
        return estimate
    if not isinstance(size, int) or size <= 0:  # no frame compressed yet: their size is not known (as in repr)
        return estimate + 16
    held: int = sum(entry["bytes"] for rel, entry in files.items() if isinstance(entry, dict) and isinstance(
        entry.get("bytes"), int) and str(rel).endswith(("frames.bytes.bin", "finals.bytes.bin")))
    return estimate + 16 + held / size


def format_report(report: dict[str, Any]) -> str:
    """The report of ``inspect_checkpoint`` as a readable table.

    Example:
        >>> print(format_report(inspect_checkpoint("/nonexistent")))
        checkpoint  /nonexistent
        status      FAILED: /nonexistent: does not exist (expected a checkpoint directory, demo checkpoint or demo output folder: check the path)
    """
    lines = [f"checkpoint  {report['path']}"]
    if "kind" in report:
        versions, compression = report.get("versions"), report.get("compression")
        lines += [
            f"kind        {report['kind']}  (format version {report['format_version']})",
            f"size        {report['size']} / {report['capacity']} rows",
            *([f"memory      about {report['bytes_per_transition']:,.0f} bytes per row (estimate)"
               + (" + compressed frames" if compression and not report.get("size") else "")]
              if report.get("bytes_per_transition") else []),
            f"storage     {report['storage']}  (storing device {report['storing_device']}, "
            f"device {report['device']})",
            *([f"compression {compression['codec']}, level {compression['level'] or 'default'}  (frames kept "
               "compressed: the frame field holds each one's size in bytes)"] if compression else []),
            *([f"hindsight   {hindsight.get('strategy')}, ratio {hindsight.get('ratio')}  "
               "(load with ReplayBuffer.load(path, reward_fn=...))"]
              if isinstance(hindsight := report.get("hindsight"), dict) else []),
            "versions    " + (", ".join(f"{k} {v}" for k, v in versions.items()) if isinstance(versions, dict)
                                else str(versions)),
        ]
    if report["demo"] is not None:
        demo = report["demo"]
        lines.append(f"demo        {demo['demo']} at {demo['frames']} frames  (state.pt: {demo['state_status']})")
    if report.get("fields"):
        lines += ["", "fields", *_table(["name", "key", "shape", "dtype"],
                                        [[f["name"], _key(f["key"]), _shape(f["shape"]), f["dtype"]]
                                         for f in report["fields"]])]
    if report["files"]:
        lines += ["", "files", *_table(["file", "dtype", "shape", "bytes", "checksum"],
                                       [[f["path"], f["dtype"], _shape(f["shape"]), f["bytes"], f["status"]]
                                        for f in report["files"]])]
    if report.get("files_not_listed"):
        lines.append(f"  ... and {report['files_not_listed']} more files, not listed")
    if "kind" in report:
        lines.append("")
    lines.append("status      " + ("ok" if report["ok"] else f"FAILED: {report['error']}"))
    return "\n".join(lines)


def inspect_main(path: str, *, as_json: bool) -> int:
    """Print the report for ``path``; return 0 when the checkpoint is whole, else 1.

    Example:
        >>> inspect_main("/nonexistent", as_json=False)
        checkpoint  /nonexistent
        status      FAILED: /nonexistent: does not exist (expected a checkpoint directory, demo checkpoint or demo output folder: check the path)
        1
    """
    report = inspect_checkpoint(path)
    print(json.dumps(_finite(report), indent=1, allow_nan=False) if as_json else format_report(report))
    return 0 if report["ok"] else 1


def _demo_part(checkpoint: Path) -> dict[str, Any]:
    try:
        meta = parse_manifest(plain_file_text(checkpoint / "meta.json"), checkpoint / "meta.json")
        if not isinstance(meta, dict):
            raise CheckpointError("not a JSON object")
    except CheckpointError as error:
        status = "missing meta.json" if not os.path.lexists(checkpoint / "meta.json") else f"unreadable meta.json ({error})"
        return {"demo": None, "frames": None, "state_status": status}
    state = inside_checkpoint(checkpoint, "state.pt")
    status = ("outside" if state is None else "missing" if not state.is_file()  # a link is never read
              else "ok" if file_digest(state, "sha256") == meta.get("state_sha256") else "failed")
    return {"demo": meta.get("demo"), "frames": meta.get("frames"), "state_status": status}


def _capacity(options: dict[str, Any]) -> Any:
    if "capacity" in options:
        return options["capacity"]
    if "num_steps" in options and "num_envs" in options:
        return options["num_steps"] * options["num_envs"]
    return None


def _check_file(root: Path, rel: str, entry: Any, *, verified: bool) -> dict[str, Any]:
    """The file's report row; ``verified``: ``read_manifest`` checked its size and checksum already."""
    entry = entry if isinstance(entry, dict) else {}
    target = inside_checkpoint(root, rel)
    if target is None:
        status = "outside"  # never read: an absolute path, `..` or a link
    elif not target.is_file():
        status = "missing"
    elif not verified and not file_matches(target, entry):
        status = "failed"
    else:
        status = "ok"
    return {"path": rel, "dtype": entry.get("dtype"), "shape": entry.get("shape"), "bytes": entry.get("bytes"),
            "status": status}


def _key(key: Any) -> str:
    return ".".join(map(str, key)) if isinstance(key, list) else str(key)


def _finite(value: Any) -> Any:
    """``value`` with each NaN or infinity a forged manifest holds as its name (``"nan"``): JSON has none."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


def _shape(shape: Any) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")" if isinstance(
        shape, list) else str(shape)


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    cells = [header, *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]


def _as_list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []
