"""Key discovery: exactly the listed key modules, and none of them loads a heavy library."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

from learners.keys import KEY_MODULES, all_keys, key_groups

ROOT = Path(__file__).resolve().parents[2]


def test_key_groups_are_the_listed_modules_in_order():
    assert [name for name, _ in key_groups()] == list(KEY_MODULES)
    for name, keys in key_groups():
        assert keys == tuple(importlib.import_module(name).KEYS)


def test_every_key_is_declared_once():
    names = [k.name for k in all_keys()]
    assert len(names) == len(set(names))


def test_importing_the_keys_loads_no_heavy_library(heavy_after):
    """`angelps conf` and `angelps schedule` gather the keys: no torch, Ray, numpy or pyarrow."""
    assert heavy_after("from learners.keys import all_keys\nall_keys()") == []


def _declares_keys(path: Path) -> bool:
    """Whether a source file assigns a module-level ``KEYS`` (parsed, not imported)."""
    tree = ast.parse(path.read_text(), str(path))
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == "KEYS" for t in targets):
            return True
    return False


def test_every_module_that_declares_keys_is_a_listed_key_module():
    """A new KEYS list that is not in KEY_MODULES would be unknown to the loader: fail here."""
    # A package may stand for the module that holds its KEYS (decay re-exports decay.keys.KEYS).
    listed = {_owner(name) for name in KEY_MODULES}
    found = set()
    for pkg in ("decay", "angelps", "learners"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if _declares_keys(path):
                rel = path.relative_to(ROOT).with_suffix("")
                found.add(".".join(p for p in rel.parts if p != "__init__"))
    assert found, "the scan found no key module"
    assert found <= listed, f"declare these in learners.keys.KEY_MODULES: {sorted(found - listed)}"


def _owner(name: str) -> str:
    """The module that assigns ``name``'s KEYS (a package may re-export a submodule's)."""
    keys = importlib.import_module(name).KEYS
    for mod in list(sys.modules.values()):
        if getattr(mod, "KEYS", None) is keys and _declares_keys(Path(mod.__file__ or "")):
            return mod.__name__
    return name
