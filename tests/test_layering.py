"""The dependency direction of DESIGN.md, checked on the imports themselves (parsed with ast).

angelconf -> standard library only (the key layer decay and angelps share)
decay    -> standard library and angelconf (decay/torch.py may import torch)
angelps  -> ray, torch, numpy, pyarrow (pandas for hash factorize); never decay or learners
learners -> angelps, decay and the third-party libraries
entry point angelps/__main__.py -> learners (the command line lives in learners/cli/)
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STDLIB = set(sys.stdlib_module_names) | {"__future__"}
PROJECT = {"angelconf", "decay", "angelps", "learners"}
THIRD_PARTY = {"ray", "torch", "numpy", "pyarrow", "pandas", "tqdm", "matplotlib", "safetensors"}

ALLOWED = {
    "angelconf": STDLIB | {"angelconf"},
    "decay": STDLIB | {"decay", "angelconf"},
    "angelps": STDLIB | {"angelconf", "angelps", "ray", "torch", "numpy", "pyarrow", "pandas"},
    "learners": STDLIB | PROJECT | THIRD_PARTY,
}
HEAVY = ("numpy", "torch", "ray", "pyarrow", "pandas")
EXCEPTIONS = {
    "decay/torch.py": {"torch"},
    "angelps/__main__.py": {"learners"},
}


def imported_modules(path: Path) -> set[str]:
    """The module names a file imports, anywhere in it (``from a.b import c`` imports ``a.b``)."""
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: stays inside the package
                names.add(path.relative_to(ROOT).parts[0])
            elif node.module:
                names.add(node.module)
    return names


def forbidden(rel: str, modules: set[str]) -> list[str]:
    """The imported modules the layering forbids to the file ``rel`` (relative to the root)."""
    pkg = rel.split("/")[0]
    allowed = ALLOWED[pkg] | EXCEPTIONS.get(rel, set())
    return sorted(m for m in modules if m.split(".")[0] not in allowed)


def package_files() -> list[Path]:
    return sorted(p for pkg in ALLOWED for p in (ROOT / pkg).rglob("*.py"))


@pytest.mark.parametrize("path", package_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_follow_the_layering(path: Path) -> None:
    rel = path.relative_to(ROOT).as_posix()
    bad = forbidden(rel, imported_modules(path))
    assert not bad, f"{rel} imports {', '.join(bad)}, which the layering of DESIGN.md forbids"


def test_the_checker_sees_violations(tmp_path: Path) -> None:
    # The layering test must be able to fail: an import inside a function is found too, and
    # decay may import the key layer (angelconf) but nothing of angelps; angelconf imports no
    # project package.
    f = tmp_path / "probe.py"
    f.write_text(
        "def f():\n    import numpy\n    from angelps import config\n"
        "    from angelconf.config import Key\n    import angelps.shard\n"
    )
    modules = imported_modules(f)
    assert modules == {"numpy", "angelps", "angelconf.config", "angelps.shard"}
    assert forbidden("decay/probe.py", modules) == ["angelps", "angelps.shard", "numpy"]
    assert forbidden("learners/probe.py", modules) == []
    assert forbidden("angelps/probe.py", {"decay.keys", "angelconf.config"}) == ["decay.keys"]
    assert forbidden("angelconf/probe.py", {"angelps.options", "decay"}) == [
        "angelps.options",
        "decay",
    ]


def _fresh(code: str) -> str:
    """What ``code`` prints in a fresh interpreter (what a process imports from nothing)."""
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return run.stdout.strip()


def test_importing_decay_loads_no_heavy_library() -> None:
    # Every decay module but the torch adapter, in a fresh interpreter: the config-only verbs
    # (`angelps conf`, `angelps schedule`) rely on it.
    code = (
        "import importlib, pkgutil, sys\n"
        "import decay, decay.registry, decay.keys, decay.factory\n"
        "for m in pkgutil.iter_modules(decay.__path__, 'decay.'):\n"
        "    if m.name != 'decay.torch':\n"
        "        importlib.import_module(m.name)\n"
        f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})\n"
        "print(','.join(heavy))\n"
    )
    out = _fresh(code)
    assert out == "", f"importing decay loaded {out}"


def test_a_cpu_shard_process_loads_no_torch() -> None:
    # A shard actor imports angelps.server; torch (1-3 s of a shard's start) only for rows on
    # a torch device (angel.ps.gpus > 0).
    code = (
        "import sys\n"
        "import numpy as np\n"
        "import angelps.server, angelps.launch, angelps.client\n"
        "from angelps import OptimizerSpec, TableSpec\n"
        "from angelps.shard import ParameterShard\n"
        "t = TableSpec('s', rows=-1, cols=2, sparse=True, optimizer=OptimizerSpec('adam'))\n"
        "s = ParameterShard(0, 1, [t])\n"
        "s.push(0, 0, {'s': (np.arange(3), np.ones((3, 2), np.float32))}, 0.1)\n"
        "print('torch' in sys.modules)\n"
    )
    assert _fresh(code) == "False"


def test_the_driver_of_a_training_job_never_loads_torch(tmp_path: Path) -> None:
    # torch is the workers' alone: the driver sizes the tables from learners.model_tables and
    # calls the workers through learners.worker_actor, so on a 2-core machine the 1.5-3 s of
    # CPU of its import go to the workers starting beside it. A real job, on a private Ray.
    code = (
        "import sys\n"
        "from learners.cli.main import main\n"
        "rc = main(['train', '--conf', 'conf/lr_a9a.properties', '--set', 'ml.epoch.num=1',\n"
        f"           '--set', 'angel.save.model.path=', '--set', 'angel.log.path={tmp_path}'])\n"
        "print(rc, sorted(m for m in sys.modules if m.split('.')[0] == 'torch')[:3])\n"
    )
    out = _fresh(code).splitlines()
    assert out[-1] == "0 []", out[-5:]


def test_all_three_packages_exist() -> None:
    for pkg in ALLOWED:
        assert (ROOT / pkg / "__init__.py").exists(), pkg
