"""The dependency direction of DESIGN.md, checked on the imports themselves (parsed with ast).

decay    -> standard library (decay/torch.py may import torch)
angelps  -> ray, torch, numpy, pyarrow (pandas for hash factorize); never decay or learners
learners -> angelps, decay and the third-party libraries
entry points (angelps/__main__.py, angelps/cli.py) -> learners
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STDLIB = set(sys.stdlib_module_names) | {"__future__"}
PROJECT = {"decay", "angelps", "learners"}
THIRD_PARTY = {"ray", "torch", "numpy", "pyarrow", "pandas", "tqdm", "matplotlib"}

ALLOWED = {
    "decay": STDLIB | {"decay"},
    "angelps": STDLIB | {"angelps", "ray", "torch", "numpy", "pyarrow", "pandas"},
    "learners": STDLIB | PROJECT | THIRD_PARTY,
}
EXCEPTIONS = {
    "decay/torch.py": {"torch"},
    "angelps/__main__.py": {"learners"},
    "angelps/cli.py": {"learners"},
}


def imported_top_levels(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: stays inside the package
                names.add(path.relative_to(ROOT).parts[0])
            elif node.module:
                names.add(node.module.split(".")[0])
    return names


def package_files() -> list[Path]:
    return sorted(p for pkg in ALLOWED for p in (ROOT / pkg).rglob("*.py"))


@pytest.mark.parametrize("path", package_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_follow_the_layering(path: Path) -> None:
    rel = path.relative_to(ROOT).as_posix()
    pkg = rel.split("/")[0]
    allowed = ALLOWED[pkg] | EXCEPTIONS.get(rel, set())
    bad = sorted(imported_top_levels(path) - allowed)
    assert not bad, f"{rel} imports {', '.join(bad)}, which the layering of DESIGN.md forbids"


def test_the_checker_sees_violations(tmp_path: Path) -> None:
    # The layering test must be able to fail: an import inside a function is found too.
    f = tmp_path / "probe.py"
    f.write_text("def f():\n    import numpy\n    from angelps import config\n")
    assert imported_top_levels(f) == {"numpy", "angelps"}


def test_all_three_packages_exist() -> None:
    for pkg in ALLOWED:
        assert (ROOT / pkg / "__init__.py").exists(), pkg
