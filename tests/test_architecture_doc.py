"""docs/architecture.md's folder map names every module of the four packages, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("angelconf", "decay", "angelps", "learners")


def mapped_modules(text: str) -> set[str]:
    """The module paths the folder map of ``text`` lists (the indented tree in a code block)."""
    block = text.split("## The folders", 1)[1].split("```", 2)[1]
    found: set[str] = set()
    stack: list[tuple[int, str]] = []
    for line in block.splitlines():
        m = re.match(r"^( *)([^\s,]+(?:, [^\s,]+)*)", line)
        if not m:
            continue
        depth, names = len(m.group(1)), m.group(2)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        prefix = stack[-1][1] if stack else ""
        for name in (n.strip() for n in names.split(",")):
            if name.endswith("/"):
                stack.append((depth, prefix + name))
            elif name.endswith(".py"):
                found.add(prefix + name)
    return found


def package_modules() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def test_the_folder_map_lists_every_module() -> None:
    listed = mapped_modules((ROOT / "docs" / "architecture.md").read_text())
    missing = sorted(m for m in package_modules() - listed if not m.endswith("/__init__.py"))
    assert not missing, f"docs/architecture.md's folder map does not list: {missing}"
    gone = sorted(listed - package_modules())
    assert not gone, f"docs/architecture.md's folder map lists modules that do not exist: {gone}"


def test_the_map_reader_sees_a_missing_module() -> None:
    text = "## The folders\n\n```\npkg/\n  a.py   one\n  sub/\n    b.py, c.py  two\n  d.py\n```\n"
    assert mapped_modules(text) == {"pkg/a.py", "pkg/sub/b.py", "pkg/sub/c.py", "pkg/d.py"}
