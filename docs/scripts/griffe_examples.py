"""Griffe extension for the API reference: read rlbuf's ``Example:`` sections as doctest examples.

rlbuf's docstrings (Google style) title their doctests ``Example:``. Griffe only knows the
plural ``Examples:`` as an examples section and would render the singular one as an admonition
of plain Markdown, mangling ``>>> td["advantage"][0]`` into a broken link. Renaming the title
before the docstring is parsed gives highlighted, copyable ``>>>`` blocks instead.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_SINGULAR = re.compile(r"^(\s*)Example:[ \t]*$", re.MULTILINE)


class DoctestExamples(griffe.Extension):
    """Rename ``Example:`` section titles to ``Examples:`` in every docstring."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _SINGULAR.sub(r"\1Examples:", obj.docstring.value)
