"""docs/decay.md, generated from the registry (a test fails when the file is stale)."""

from __future__ import annotations


def render_markdown() -> str:
    """The catalogue page: every schedule with its formula, keys and defaults, and every key."""
    from decay.render import render

    return render()
