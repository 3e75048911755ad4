"""docs/decay.md is generated from the registry and must not be stale; every schedule has a
catalogue plot."""

from __future__ import annotations

from pathlib import Path

import decay
from decay.render import EXAMPLES, example

ROOT = Path(__file__).resolve().parents[2]


def test_docs_decay_md_is_up_to_date() -> None:
    text = (ROOT / "docs" / "decay.md").read_text(encoding="utf-8")
    assert text == decay.render_markdown(), (
        "docs/decay.md is stale: run python -m decay.render > docs/decay.md"
    )


def test_every_schedule_and_key_is_documented_with_a_plot() -> None:
    md = decay.render_markdown()
    assert set(EXAMPLES) == set(decay.names())
    for name in decay.names():
        assert f"### {name}\n" in md
        assert (ROOT / "docs" / "img" / "decay" / f"{name}.png").is_file(), name
        example(name)  # every example builds
    for key in decay.KEYS:
        assert f"| `{key.name}` |" in md
    for fix in ("ml.learn.decay", "+Infinity", "scala.MatchError", "denominator"):
        assert fix in md
