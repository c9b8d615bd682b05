"""Griffe extension for the API reference: docstrings as the pages in ``docs/reference/`` need them.

rlbuf's docstrings (Google style) title their doctests ``Example:``. Griffe only knows the
plural ``Examples:`` as an examples section and would render the singular one as an admonition
of plain Markdown, mangling ``>>> td["advantage"][0]`` into a broken link. Renaming the title
before the docstring is parsed gives highlighted, copyable ``>>>`` blocks instead.

A docstring links a guide page as seen from ``docs/`` (``[Pixels and memory](pixels.md)``); the
API pages live one folder down, in ``docs/reference/``, so such links get a ``../``.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_SINGULAR = re.compile(r"^(\s*)Example:[ \t]*$", re.MULTILINE)
_GUIDE_LINK = re.compile(r"\]\((?![a-z]+:|/|#|\.\./)([^)\s]+\.md(?:#[^)\s]*)?)\)")


class DoctestExamples(griffe.Extension):
    """Rename ``Example:`` section titles to ``Examples:``, and point guide links out of ``reference/``."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            value = _SINGULAR.sub(r"\1Examples:", obj.docstring.value)
            obj.docstring.value = _GUIDE_LINK.sub(r"](../\1)", value)
