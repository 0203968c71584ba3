"""Griffe extension for the API reference: doctest examples are shown as code.

Docstrings carry doctests (``>>>`` lines and their output) under ``Example:`` and in plain
paragraphs. Markdown would read them as nested block quotes and take ``[...]`` for links, so
this extension wraps every run of doctest lines that is not already in a fence in a ``pycon``
code fence before the docstring is rendered. Docstrings in the source are not changed.
Loaded by ``mkdocs.yml`` (``extensions`` of the mkdocstrings Python handler).
"""

from __future__ import annotations

from typing import Any

import griffe


def fence_doctests(text: str) -> str:
    """``text`` with each run of doctest lines (from a ``>>>`` line to a blank line) fenced."""
    out: list[str] = []
    in_fence = False
    in_doctest = False
    indent = ""
    for line in text.splitlines():
        stripped = line.strip()
        if in_doctest and not stripped:
            out.append(f"{indent}```")
            in_doctest = False
        if not in_doctest and stripped.startswith(("```", "~~~")):
            in_fence = not in_fence
        if not in_fence and not in_doctest and stripped.startswith(">>>"):
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}```pycon")
            in_doctest = True
        out.append(line)
    if in_doctest:
        out.append(f"{indent}```")
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    """Fence the doctests of every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:  # noqa: D102
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fence_doctests(obj.docstring.value)
