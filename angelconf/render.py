"""docs/config.md generated from the key declarations (:func:`render_markdown`)."""

from __future__ import annotations

from collections.abc import Sequence

from angelconf.config import Key, format_value

__all__ = ["render_markdown"]


def _doc_default(k: Key) -> str:
    if k.default is None:
        return "(unset)"
    return f"`{format_value(k.default)}`" if format_value(k.default) != "" else '`""`'


def render_markdown(groups: Sequence[tuple[str, Sequence[Key]]]) -> str:
    """The configuration reference (docs/config.md) generated from the declarations."""
    out = [
        "# Configuration reference",
        "",
        "Generated from the key declarations by `python -m angelps conf --markdown`; do not edit",
        "by hand (a test fails when this file is stale).",
        "",
        "Precedence: built-in defaults < `.properties` file < `--set key=value`. A key written as",
        "`<i>` stands for a child index (0, 1, ...), `<table>` for a model's table name (see",
        "docs/decay.md). `angelps conf --conf F` prints the effective configuration and where",
        "each value came from.",
        "",
    ]
    for title, keys in groups:
        out += [f"## {title}", "", "| key | type | default | meaning |", "|---|---|---|---|"]
        for k in sorted(keys, key=lambda k: k.name):
            doc = k.doc.replace("|", "\\|")
            if k.choices:
                doc += f" One of: {', '.join(k.choices)}."
            if k.deprecated:
                doc += f" Deprecated: use `{k.deprecated}`."
            out.append(f"| `{k.name}` | {k.type} | {_doc_default(k)} | {doc} |")
        out.append("")
    return "\n".join(out)
