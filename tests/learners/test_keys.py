"""Key discovery: exactly the listed key modules, and none of them loads a heavy library."""

from __future__ import annotations

import importlib
import subprocess
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


def test_importing_the_keys_loads_no_heavy_library():
    """`angelps conf` and `angelps schedule` gather the keys: no torch, Ray, numpy or pyarrow."""
    code = (
        "import sys\n"
        "from learners.keys import all_keys\n"
        "all_keys()\n"
        "heavy = [m for m in ('torch', 'ray', 'numpy', 'pyarrow', 'pandas') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == ""
