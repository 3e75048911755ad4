"""The dependency direction of docs/architecture.md, checked on the imports themselves (parsed with ast).

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
# grpc: Ray's own transport, used to check that an address answers as Ray.
THIRD_PARTY = {
    "ray",
    "grpc",
    "torch",
    "numpy",
    "pyarrow",
    "pandas",
    "tqdm",
    "matplotlib",
    "safetensors",
}

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
    assert not bad, (
        f"{rel} imports {', '.join(bad)}, which the layering of docs/architecture.md forbids"
    )


def test_the_checker_sees_violations(tmp_path: Path) -> None:
    # The layering test must be able to fail: an import inside a function is found too, and
    # decay may import the key layer (angelconf) but nothing of angelps; angelconf imports no
    # project package.
    f = tmp_path / "probe.py"
    f.write_text(
        "def f():\n    import numpy\n    from angelps import config\n"
        "    from angelconf.config import Key\n    import angelps.server.shard\n"
    )
    modules = imported_modules(f)
    assert modules == {"numpy", "angelps", "angelconf.config", "angelps.server.shard"}
    assert forbidden("decay/probe.py", modules) == ["angelps", "angelps.server.shard", "numpy"]
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
    # A shard actor imports angelps.server.shard_server; torch (1-3 s of a shard's start) only for rows on
    # a torch device (angel.ps.gpus > 0).
    code = (
        "import sys\n"
        "import numpy as np\n"
        "import angelps.server.shard_server, angelps.server.launch, angelps.client.ps_client\n"
        "from angelps import OptimizerSpec, TableSpec\n"
        "from angelps.server.shard import ParameterShard\n"
        "t = TableSpec('s', rows=-1, cols=2, sparse=True, optimizer=OptimizerSpec('adam'))\n"
        "s = ParameterShard(0, 1, [t])\n"
        "s.push(0, 0, {'s': (np.arange(3), np.ones((3, 2), np.float32))}, 0.1)\n"
        "print('torch' in sys.modules)\n"
    )
    assert _fresh(code) == "False"


def test_the_driver_of_a_training_job_never_loads_torch(tmp_path: Path) -> None:
    # torch is the workers' alone: the driver sizes the tables from learners.models.tables and
    # calls the workers through learners.worker.actor, so on a 2-core machine the 1.5-3 s of
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


# --- no import cycles between modules, no function-local import that hides one -----------------

#: The function-local imports of project modules that stay, each with why it is deferred: they
#: keep torch, Ray, pyarrow or matplotlib out of the processes and verbs that do not need them
#: (`angelps conf`/`schedule`/`plot`, the driver, a CPU shard). Any other import of a project
#: module inside a function fails the test below: move the shared code so the import can go to
#: the top of the file instead of hiding a cycle.
LAZY_IMPORTS = {
    ("decay/docs.py", "decay.render"): "rendering the docs table only when asked",
    ("angelps/file_store.py", "angelps.fs"): "pyarrow only for a path on object storage",
    ("learners/cli/export.py", "learners.runs.export_formats"): "torch only when exporting",
    ("learners/cli/predict.py", "learners.runs.predict_output"): "pyarrow only when writing",
    ("learners/job/learner.py", "learners.job.local_predict"): "torch only in GraphLearner.load",
    ("learners/runs/export_formats.py", "learners.runs.standalone"): "torch only for TorchScript",
    ("learners/cli/export.py", "angelps.checkpoint.local_dir"): "pyarrow only for a missing model",
    ("learners/cli/predict.py", "angelps.checkpoint.local_dir"): "pyarrow only for a missing model",
    ("learners/cli/plot.py", "learners.runs.curves"): "a plot verb loads no pyarrow up front",
    ("learners/cli/plot.py", "learners.runs.folders"): "a plot verb loads no pyarrow up front",
    ("learners/cli/plot.py", "learners.runs.plot"): "a plot verb loads no pyarrow up front",
    ("learners/cli/predict.py", "angelps.fs"): "pyarrow only for an output URL",
    ("learners/cli/predict.py", "learners.job.learner"): "torch and Ray only when predicting",
    ("learners/cli/schedule.py", "learners.job.schedule_length"): "pyarrow only for --conf jobs",
    ("learners/cli/schedule.py", "learners.models.tables"): "numpy only for per-table keys",
    (
        "learners/models/angel_layers.py",
        "angelps.table",
    ): "numpy only when a JSON optimizer sets values",
    (
        "learners/models/angel_json.py",
        "angelps.optimizers.registry",
    ): "numpy only for a JSON graph's FCLayers",
    ("learners/cli/train.py", "learners.job.learner"): "torch and Ray only when training",
    ("learners/cli/train.py", "learners.job.loop_options"): "after the keys are checked",
    ("learners/cli/train.py", "learners.job.preflight"): "pyarrow only when training",
    ("learners/runs/folders.py", "angelps.fs"): "pyarrow only for a run on object storage",
    ("learners/runs/plot.py", "learners.runs.plot_draw"): "matplotlib only when drawing",
    ("learners/worker/actor.py", "learners.worker.train_worker"): "torch in the actor only",
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_imports(path: Path, modules: set[str]) -> list[tuple[str, bool]]:
    """(imported project module, inside a function?) for every import of ``path``, those under
    ``if TYPE_CHECKING:`` included (a cycle of type-only imports is still a cycle of the design:
    break it with a Protocol or by moving the type); ``from pkg import sub`` names the module
    ``pkg.sub`` when it is one."""
    out: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                out.extend((a.name, in_function) for a in child.names if a.name in modules)
            elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
                for a in child.names:
                    full = f"{child.module}.{a.name}"
                    if full in modules:
                        out.append((full, in_function))
                    elif child.module in modules:
                        out.append((child.module, in_function))
            visit(child, inner)

    visit(ast.parse(path.read_text(), str(path)), False)
    return out


def import_graph() -> tuple[dict[str, set[str]], dict[tuple[str, str], bool]]:
    """Module -> the project modules it imports; and every function-local such import."""
    files = {_module_name(p): p for p in package_files()}
    graph: dict[str, set[str]] = {m: set() for m in files}
    local: dict[tuple[str, str], bool] = {}
    for m, p in files.items():
        for target, in_function in project_imports(p, set(files)):
            if target != m:
                graph[m].add(target)
            if in_function:
                local[(p.relative_to(ROOT).as_posix(), target)] = True
    return graph, local


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


def test_no_import_cycle_between_modules() -> None:
    # No exception is listed: the imports under ``if TYPE_CHECKING:`` (angelps/optim.py,
    # angelps/storage/rows.py, learners/job/predict_inputs.py, learners/cli/predict.py, the
    # packages' faces) close no cycle.
    graph, _ = import_graph()
    found = cycles(graph)
    assert not found, "import cycles (function-local and type-only imports count): " + "; ".join(
        " <-> ".join(c) for c in found
    )


def test_function_local_imports_of_project_modules_are_only_the_listed_lazy_ones() -> None:
    _, local = import_graph()
    hidden = sorted(k for k in local if k not in LAZY_IMPORTS)
    assert not hidden, (
        "function-local imports of project modules that are not listed as lazy in "
        f"LAZY_IMPORTS (move the shared code instead of hiding a cycle): {hidden}"
    )
    stale = sorted(k for k in LAZY_IMPORTS if k not in local)
    assert not stale, f"LAZY_IMPORTS lists imports that no longer exist: {stale}"


def test_the_cycle_checker_sees_cycles(tmp_path: Path) -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    f = tmp_path / "probe.py"
    f.write_text(
        "from typing import TYPE_CHECKING\nfrom p import sub, name\nif TYPE_CHECKING:\n"
        "    import p.typed\ndef f():\n    import p.lazy\n"
    )
    got = project_imports(f, {"p", "p.sub", "p.typed", "p.lazy"})
    assert got == [("p.sub", False), ("p", False), ("p.typed", False), ("p.lazy", True)]


# --- local disk or object storage is chosen in one place per kind of use -----------------------

#: The modules that may look at a path to tell a local disk from object storage, each with what
#: it chooses; everything else asks the store one of them returns (no `is_remote`/`is_url` branch).
PATH_KIND_TESTS = {
    "angelps/fs.py": "the primitive calls: os, or pyarrow's file system of the URL",
    "angelps/file_store.py": "files_for: how a path is read (inputs, JSON, runs, metrics)",
    "angelps/checkpoint/store.py": "store_for: how a checkpoint or a backup is written",
    "learners/runs/log_store.py": "run_logs_for: where a job's runs are logged",
    "learners/job/cluster.py": "a Ray address (ray://host:port), not a path",
}
_KIND_TESTS = {"is_remote", "is_url", "_is_url"}
#: The same test written out: ``"://" in path``, ``path.startswith("file://")``.
_URL_MARKS = {"://", "file://"}


def path_kind_tests(path: Path) -> list[int]:
    """The lines of ``path`` that test whether a path is local or remote: a call, an import or a
    definition of ``is_remote``/``is_url``, or the test written out (a ``"://"`` or
    ``"file://"`` literal)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        named = (
            (isinstance(node, ast.Name) and node.id in _KIND_TESTS)
            or (isinstance(node, ast.Attribute) and node.attr in _KIND_TESTS)
            or (isinstance(node, ast.FunctionDef) and node.name in _KIND_TESTS)
            or (isinstance(node, ast.ImportFrom) and any(a.name in _KIND_TESTS for a in node.names))
            or (isinstance(node, ast.Constant) and node.value in _URL_MARKS)
        )
        if named:
            lines.append(getattr(node, "lineno", 0))
    return sorted(set(lines))


def test_only_the_stores_tell_a_local_path_from_object_storage() -> None:
    found = {
        rel: lines
        for p in package_files()
        if (rel := p.relative_to(ROOT).as_posix()) not in PATH_KIND_TESTS
        and (lines := path_kind_tests(p))
    }
    assert not found, (
        "is_remote/is_url or a '://' test outside the stores (ask angelps.file_store.files_for, "
        f"angelps.checkpoint.store.store_for or learners.runs.log_store.run_logs_for): {found}"
    )
    stale = sorted(rel for rel in PATH_KIND_TESTS if not path_kind_tests(ROOT / rel))
    assert not stale, f"PATH_KIND_TESTS lists modules that no longer choose: {stale}"


def test_the_path_kind_checker_sees_a_branch(tmp_path: Path) -> None:
    f = tmp_path / "probe.py"
    f.write_text(
        "from angelps.file_store import is_url\nfrom angelps import fs\n"
        "def f(p):\n    if fs.is_remote(p):\n        return 1\n    return is_url(p)\n"
        "def g(p):\n    return '://' in p or p.startswith('file://')\n"
    )
    assert path_kind_tests(f) == [1, 4, 6, 8]
