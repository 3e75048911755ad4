"""Ctrl-C during `angelps train`: exit 130, Ray shut down, the last checkpoint intact and usable."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from learners.runs.folders import latest_run

ROOT = Path(__file__).resolve().parents[1]
A9A = "data/a9a/a9a_123d_train.libsvm"


def _metrics(log: Path) -> Path:
    """The metrics.jsonl of the newest run under ``log`` (a path that does not exist yet
    before the run has started)."""
    run = latest_run(log)
    return run / "metrics.jsonl" if run is not None else log / "no-run-yet"


def _epoch_lines(metrics: Path) -> list[dict]:
    if not metrics.exists():
        return []
    out = []
    for line in metrics.read_text().splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:  # a line being written right now
            continue
        if obj.get("kind") == "epoch":
            out.append(obj)
    return out


def _default_sigint() -> None:
    # A suite run as a shell's background job starts its children with SIGINT ignored (as a
    # non-interactive shell does for `cmd &`); the Ctrl-C under test must reach the job.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_sigint_stops_cleanly_and_keeps_the_checkpoint(tmp_path: Path) -> None:
    model, log = tmp_path / "model", tmp_path / "log"
    cmd = [
        sys.executable, "-m", "angelps", "train", "--conf", "conf/lr_a9a.properties",
        "--set", "ml.epoch.num=100000", "--set", "ml.minibatch.size=1024",
        "--set", f"angel.save.model.path={model}",
        "--set", f"angel.log.path={log}",
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )
    try:
        deadline = time.monotonic() + 240
        # The epoch's line comes first, then its checkpoint, renamed into place whole.
        while not (_epoch_lines(_metrics(log)) and model.exists()):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no epoch finished within 240 s"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, (out, err)
    assert "interrupted" in err
    assert "Traceback" not in err
    # The checkpoint of a finished epoch is intact: evaluate loads it and scores the data.
    ev = subprocess.run(
        [sys.executable, "-m", "angelps", "evaluate", "--model", str(model), "--input", A9A,
         "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert ev.returncode == 0, ev.stderr
    assert json.loads(ev.stdout.strip().splitlines()[-1])["valid_auc"] > 0.88
