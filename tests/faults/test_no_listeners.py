"""Fault matrix: nothing of a private-Ray job listens beyond 127.0.0.1.

``angelps train`` (its own private Ray, in a fresh interpreter) is stopped for a moment inside
its first checkpoint save, in the middle of training: every TCP socket that the driver and the
processes below it (GCS, raylet, object manager, workers, shards, dashboard agent, metrics
exporters, the data plane) listen on is read from /proc (``/proc/net/tcp``, ``tcp6`` and each
process's descriptors) and must be a loopback address. The job then finishes (exit 0).
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.child_env import python_path
from tests.short_tmp import short_tmp

ROOT = Path(__file__).resolve().parents[2]
CONF = str(ROOT / "conf" / "lr_a9a.properties")

# `angelps train` that lists its listening sockets at its first save. argv: OUT train-args...
_LISTED = r"""
import json, os, sys
from angelps.checkpoint import files as checkpoint
from learners.cli.main import main
from tests.faults.procs import descendants, listening

out = sys.argv[1]

def write_manifest(root, manifest, real=checkpoint.write_manifest):
    if ".tmp-" in os.path.basename(root) and not os.path.exists(out):
        me = os.getpid()
        with open(out, "w") as f:
            json.dump(listening([me, *descendants(me)]), f)
    return real(root, manifest)

checkpoint.write_manifest = write_manifest
sys.exit(main(sys.argv[2:]))
"""


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


def test_a_private_ray_job_listens_on_loopback_only(tmp_path: Path) -> None:
    data = tmp_path / "a9a.libsvm"
    with open(ROOT / "data" / "a9a" / "a9a_123d_train.libsvm") as f:
        data.write_text("".join(next(f) for _ in range(1000)))
    sets = {
        "angel.train.data.path": data,
        "angel.save.model.path": tmp_path / "model",
        "angel.log.path": tmp_path / "log",
        "ml.epoch.num": 1,
    }
    args = ["train", "--conf", CONF, *(f"--set={k}={v}" for k, v in sets.items())]
    out = tmp_path / "listening.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(PYTHONPATH=python_path(ROOT), RAY_TMPDIR=short_tmp())
    run = subprocess.run(
        [sys.executable, "-c", _LISTED, str(out), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    os.rmdir(env["RAY_TMPDIR"])  # empty: the private Ray's own folder is removed at its stop
    assert run.returncode == 0, run.stderr[-3000:]
    sockets = json.loads(out.read_text())
    names = {name for _, name, _, _ in sockets}
    # The job's own processes were seen: Ray's servers, and the shard's data plane.
    assert {"gcs_server", "raylet"} <= names, sockets
    wide = [s for s in sockets if not _loopback(s[2])]
    assert wide == [], f"listening beyond 127.0.0.1: {wide}"
