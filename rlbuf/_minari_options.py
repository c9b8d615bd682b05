"""The reset ``options`` of Minari episodes as buffer fields, for [`from_minari`][rlbuf.offline.from_minari] and
[`to_minari`][rlbuf.offline.to_minari].

Minari keeps an episode's ``options`` (the dict its ``env.reset`` took) in the episode's metadata,
read with ``dataset.storage.get_episode_metadata``: flattened into the HDF5 group's attributes
(``options/<key>/<sub>``; numbers come back as numpy scalars and arrays of their dtype) or as JSON in
the Arrow episode's ``metadata.json`` (numbers come back as Python ``int``, ``float``, ``bool`` and
lists; strings as ``str`` in both). rlbuf stores each option leaf as the field ``option_<key>`` (nested keys
joined by ``__``), the episode's value repeated on each of its rows, as seeds are: numbers, bools and
arrays of them of one shape and dtype in every episode. A string option is the field ``str_option_<key>``:
its UTF-8 bytes (``uint8``), zero-padded to the longest of the dataset (found by a first pass over
every episode's options: ``text_widths``), so it takes one fixed width and comes back exactly (a
string holding ``"\\0"`` is refused: the padding could not be told from it). ``to_minari`` writes the
fields back as each episode's ``options``, in the form its format reads back: numpy values for HDF5,
JSON values for Arrow.

Example:
    >>> paths = option_paths({"low": -0.5, "goal": {"xy": [0.0, 1.0]}}, True, 0)
    >>> [field_name(path) for path in paths]
    ['option_low', 'option_goal__xy']
    >>> text_value("hård", 6, "options")      # a string option: UTF-8 bytes, zero-padded
    array([104, 195, 165, 114, 100,   0], dtype=uint8)
    >>> options_out({"low": np.float64(-0.5), "n": np.int64(3)}, "arrow")
    {'low': -0.5, 'n': 3}
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rlbuf.errors import ConfigError, DtypeError, MissingFieldError, ShapeError

Key = tuple[str, ...]
PREFIX = "option_"
TEXT_PREFIX = "str_option_"
_NAME = re.compile(r"[A-Za-z0-9]+(?:_[A-Za-z0-9]+)*")


def _label(episode: Any, path: Key) -> str:
    return f"episode {episode}: options" + "".join(f'["{key}"]' for key in path)


def _flatten(options: Mapping[str, Any], path: Key = ()) -> dict[Key, Any]:
    out: dict[Key, Any] = {}
    for key, value in options.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, (*path, key)))
        else:
            out[(*path, key)] = value
    return out


def field_name(path: Key, *, text: bool = False) -> str:
    """The buffer field of an option: ``option_<key>`` (``str_option_<key>`` for a string), nested keys
    joined by ``__``.

    Example:
        >>> field_name(("goal", "xy")), field_name(("mode",), text=True)
        ('option_goal__xy', 'str_option_mode')
    """
    return (TEXT_PREFIX if text else PREFIX) + "__".join(path)


def text_widths(metadata: Iterable[Mapping[str, Any]], paths: Sequence[Key],
                first: Mapping[str, Any]) -> dict[Key, int]:
    """For each string option of ``first`` (an episode's metadata) among ``paths``, the most UTF-8 bytes it
    takes in any episode of ``metadata`` (at least 1): the width of its field.

    Example:
        >>> text_widths([{"options": {"mode": "easy"}}, {"options": {"mode": "hård"}}], [("mode",)],
        ...             {"options": {"mode": "easy"}})
        {('mode',): 5}
    """
    texts = [path for path, value in _flatten(first.get("options") or {}).items()
             if path in paths and isinstance(value, str)]
    widths = dict.fromkeys(texts, 1)
    if not texts:
        return widths
    for episode in metadata:
        found = _flatten(episode.get("options") or {})
        for path in texts:
            if isinstance(found.get(path), str):
                widths[path] = max(widths[path], len(found[path].encode("utf-8", "surrogatepass")))
    return widths


def text_value(value: Any, width: int, label: str) -> np.ndarray[Any, Any]:
    """A string option as its field's value: UTF-8 bytes, zero-padded to ``width``.

    Raises:
        DtypeError: not a string (the first episode's is), or a string holding ``"\\0"``.
    """
    if not isinstance(value, str):
        raise DtypeError(f"{label}: expected a str (as the first episode's), got {value!r}; import without it "
                         f"(options=[...] with the other keys, or options=False)")
    if "\0" in value:
        raise DtypeError(f"{label}: expected a str without \"\\0\" (its field is zero-padded), got {value!r}; "
                         f"import without it (options=[...] or options=False)")
    data = value.encode("utf-8", "surrogatepass")
    out = np.zeros(width, np.uint8)
    out[:len(data)] = np.frombuffer(data, np.uint8)
    return out


def option_paths(options: Mapping[str, Any] | None, wanted: bool | Sequence[str], episode: Any) -> list[Key]:
    """The option leaves to store, in their order, as key paths: every one of ``options`` (``True``) or those
    under the given keys.

    Raises:
        ConfigError: ``wanted`` not a bool or a list, or a key that cannot name a field (letters and digits,
            single ``_`` between).
        MissingFieldError: a given key that ``options`` lacks.

    Example:
        >>> option_paths({"low": 0.1, "high": 0.2}, ["high"], 0)
        [('high',)]
    """
    if wanted is False:
        return []
    if wanted is not True and (isinstance(wanted, str) or not isinstance(wanted, Sequence)):
        raise ConfigError(f"options: expected True, False or a list of keys, got {wanted!r}"
                          + (f"; pass [{wanted!r}]" if isinstance(wanted, str) else ""))
    found = _flatten(options or {})
    if wanted is not True:
        missing = [key for key in wanted if not any(path[0] == key for path in found)]
        if missing:
            raise MissingFieldError(f"{_label(episode, ())}: no {', '.join(map(repr, missing))}, got "
                                    f"{sorted(options or {})}; pass the keys it has (options=[...])")
        found = {path: value for path, value in found.items() if path[0] in wanted}
    for path in found:
        for key in path:
            if not isinstance(key, str) or not _NAME.fullmatch(key):
                raise ConfigError(f"{_label(episode, path)}: the key {key!r} cannot name the field "
                                  f"{PREFIX}...: expected letters and digits with single '_' between; import "
                                  f"without it (options=[...] with the other keys, or options=False)")
    return list(found)


def option_value(value: Any, label: str,
                 fix: str = "import without it (options=[...] with the other keys, or options=False)"
                 ) -> np.ndarray[Any, Any]:
    """An option leaf as an array of numbers (0-d for a number).

    Raises:
        DtypeError: a value that is no number, bool or (rectangular) array of them.

    Example:
        >>> option_value([1, 2], "options").dtype
        dtype('int64')
    """
    try:
        array = np.asarray(value)
    except ValueError:
        array = np.asarray(None)
    if array.dtype.kind not in "biuf":
        raise DtypeError(f"{label}: expected a number, a bool or an array of them, got {value!r}; {fix}")
    return array


def check_options(episode: Mapping[str, Any], paths: Sequence[Key], every: bool,
                  first: Mapping[str, Any], widths: Mapping[Key, int] | None = None
                  ) -> dict[str, np.ndarray[Any, Any]]:
    """The episode's stored options, ``{field: value}``, checked against the first episode's.

    Args:
        episode: the episode (``id``, ``options``).
        paths: the option leaves to store (the first episode's, see ``option_paths``).
        every: whether every option is stored (``options=True``): then an episode may have no other.
        first: the first episode, whose options set the shapes and dtypes.
        widths: the width of each string option's field (``text_widths``); a string option not in it is
            refused.

    Raises:
        MissingFieldError: an option the first episode has and this one lacks.
        ConfigError: with ``every``, an option the first episode lacks.
        DtypeError: a value that is no number, or another dtype than the first episode's.
        ShapeError: another shape than the first episode's.
    """
    number = episode.get("id")
    found = _flatten(episode.get("options") or {})
    if every and set(found) - set(paths):
        extra = sorted(set(found) - set(paths))
        raise ConfigError(f"{_label(number, extra[0])}: the first episode has no such option, so its rows would "
                          f"lose it; import the options every episode has (options=[...]), or options=False")
    reference = _flatten(first.get("options") or {})
    out = {}
    for path in paths:
        if path not in found:
            raise MissingFieldError(f"{_label(number, path)}: missing (the first episode has it, every row stores "
                                    f"it); import without it (options=[...] with the other keys, or "
                                    f"options=False)")
        label = _label(number, path)
        if widths is not None and path in widths:
            out[field_name(path, text=True)] = text_value(found[path], widths[path], label)
            continue
        value, expected = option_value(found[path], label), option_value(reference[path], label)
        if value.shape != expected.shape:
            raise ShapeError(f"{label}: expected shape {expected.shape} (as the first episode's), got "
                             f"{value.shape}; import without it (options=[...] or options=False)")
        if value.dtype != expected.dtype:
            raise DtypeError(f"{label}: expected dtype {expected.dtype} (as the first episode's), got "
                             f"{value.dtype}; import without it (options=[...] or options=False)")
        out[field_name(path)] = value
    return out


def row_options(extras: Mapping[str, np.ndarray[Any, Any]], row: int) -> dict[str, Any] | None:
    """The options of the episode of a row, from its ``option_*`` fields (``None`` without any).

    Example:
        >>> row_options({"option_goal__xy": np.zeros((3, 2)), "episode_id": np.zeros(3)}, 1)
        {'goal': {'xy': array([0., 0.])}}
    """
    out: dict[str, Any] = {}
    for name, column in extras.items():
        text = name.startswith(TEXT_PREFIX)
        if text or name.startswith(PREFIX):
            *keys, last = name.removeprefix(TEXT_PREFIX if text else PREFIX).split("__")
            node = out
            for key in keys:
                node = node.setdefault(key, {})
            node[last] = (bytes(column[row]).rstrip(b"\0").decode("utf-8", "surrogatepass") if text
                          else column[row])
    return out or None


def options_out(options: Mapping[str, Any] | None, data_format: str) -> dict[str, Any] | None:
    """Options as Minari's writer takes them: Arrow writes JSON (numpy values become Python ones,
    as it reads them back); HDF5 keeps numpy values, whose dtypes its attributes keep."""
    if not options:
        return None
    out = {}
    for key, value in options.items():
        if isinstance(value, Mapping):
            out[key] = options_out(value, data_format) or {}
        elif data_format == "arrow" and isinstance(value, (np.ndarray, np.generic)):
            out[key] = value.tolist()
        else:
            out[key] = value
    return out


def checked_options(options: Any, episode: int) -> dict[str, Any] | None:
    """The ``options`` of an episode given to ``to_minari``: a dict of str keys whose leaves are numbers,
    bools, strings or arrays of numbers (what both of Minari's formats read back).

    Raises:
        ConfigError: options that are not a dict, or a key that is not a str.
        DtypeError: a leaf of another kind (``None``, a list of strings ...).
    """
    if options is None:
        return None
    if not isinstance(options, Mapping):
        raise ConfigError(f"episode {episode}: options: expected a dict (what env.reset took), got "
                          f"{type(options).__name__}")
    for path, value in _flatten(options).items():
        if not all(isinstance(key, str) for key in path):
            raise ConfigError(f"{_label(episode, path)}: expected str keys (Minari stores them as names), got "
                              f"{next(key for key in path if not isinstance(key, str))!r}")
        if not isinstance(value, str):
            option_value(value, _label(episode, path), "pass a number, a bool, a str or an array of numbers, "
                         "or leave it out")
    return dict(options)
