"""A script that trains through the Python API and exits without ``shutdown()`` or ``with``
(README's example) stops its job at exit: its shards' backups are not left on disk."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_script_that_exits_without_shutdown_leaves_no_backups(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "from learners import GraphLearner\n"
        "learner = GraphLearner.from_properties('conf/lr_a9a.properties', {\n"
        f"    'ml.epoch.num': 1, 'angel.log.path': {str(tmp_path / 'log')!r},\n"
        f"    'angel.save.model.path': {str(tmp_path / 'model')!r}}}, quiet=True)\n"
        "print('auc', learner.train().summary['valid_auc'])\n"
    )
    out = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert float(out.stdout.split()[-1]) > 0.85
    assert (tmp_path / "model" / "manifest.json").exists()
    assert not (tmp_path / "log" / "ps-backup").exists(), list((tmp_path / "log").iterdir())
