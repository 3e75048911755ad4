"""docs/decay.md, generated from the catalogue and the key declarations (a test fails when the
file is stale). Regenerate with ``python -m decay.render > docs/decay.md``."""

from __future__ import annotations


def render_markdown() -> str:
    """The catalogue page: every schedule with its formula, keys and defaults, and every key."""
    # Imported here, not at the top: decay/__init__ imports this module, and a top-level import
    # would load decay.render before ``python -m decay.render`` runs it (runpy then warns).
    from decay.render import render

    return render()
