"""Fault matrix: outputs are never written through a symbolic link, readers never leave the
checkpoint.

On a real local Ray: LogisticRegression trains one epoch on a slice of a9a with
``--summary-json`` naming a symbolic link to another file: the link is replaced by the summary,
its target is untouched. A manifest naming a table ``../outside/weight`` (or a dense file
``../dense.safetensors``), or a table file that is a symbolic link out of the checkpoint, is
refused by ``angelps export`` (and by every reader: one resolver, ``checkpoint.member``) with exit
2 and one line naming the checkpoint; nothing outside it is read.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from angelps.checkpoint import files as checkpoint
from learners.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
CONF = str(ROOT / "conf" / "lr_a9a.properties")

pytestmark = pytest.mark.usefixtures("ray_local")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, ray_local):
    """(directory, summary) of a 1-epoch run whose --summary-json was a symbolic link."""
    d = tmp_path_factory.mktemp("links")
    data = d / "a9a.libsvm"
    with open(ROOT / "data" / "a9a" / "a9a_123d_train.libsvm") as f:
        data.write_text("".join(next(f) for _ in range(1000)))
    (d / "precious.txt").write_text("keep me\n")
    os.symlink(d / "precious.txt", d / "summary.json")
    args = ["train", "--conf", CONF, "--summary-json", str(d / "summary.json")]
    sets = {
        "angel.train.data.path": data,
        "angel.save.model.path": d / "model",
        "angel.log.path": d / "log",
        "ml.epoch.num": 1,
    }
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    assert main(args) == 0
    return d


def test_summary_json_replaces_a_symbolic_link(trained):
    assert (trained / "precious.txt").read_text() == "keep me\n"
    link = trained / "summary.json"
    assert not link.is_symlink()
    assert json.loads(link.read_text())["epochs"] == 1
    assert [p.name for p in trained.glob(".summary.json.*")] == []  # no temporary left


def _rewrite(model: Path, edit) -> None:
    """Change the manifest with ``edit(manifest)``, its own checksum recomputed (a manifest
    that checks out, as a hostile or confused writer would make it)."""
    m = checkpoint.load_manifest_file(str(model))
    edit(m)
    (model / "manifest.json").unlink()
    checkpoint.write_manifest(str(model), m)


def _export(model: Path, out: Path, capsys) -> tuple[int, str]:
    code = main(["export", "--model", str(model), "--out", str(out)])
    return code, capsys.readouterr().err


def test_export_never_reads_outside_the_checkpoint(trained, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(trained / "model", model)
    # A copy of the weight table outside, which the hostile manifest points at.
    shutil.copytree(model / "weight", tmp_path / "outside" / "weight")

    def rename_table(m):
        m["tables"][0]["name"] = "../outside/weight"
        m["files"] = {k.replace("weight/", "../outside/weight/"): v for k, v in m["files"].items()}
        # (the manifest's shard entries need no change: they do not name files)

    names = [t["name"] for t in checkpoint.load_manifest_file(str(model))["tables"]]
    assert names == ["weight", "bias"]
    _rewrite(model, rename_table)
    code, err = _export(model, tmp_path / "m.pt", capsys)
    assert code == 2
    assert err == (
        f"angelps: error: checkpoint {model} is damaged: its manifest names "
        "'../outside/weight/shard-0.parquet', which is not a file inside the checkpoint; "
        "refusing to read it\n"
    )
    assert not (tmp_path / "m.pt").exists()


def test_export_refuses_a_dense_file_or_a_link_out_of_the_checkpoint(trained, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(trained / "model", model)
    shutil.copy(model / "dense.safetensors", tmp_path / "dense.safetensors")

    def move_dense(m):
        m["extra"]["learner"]["dense"]["file"] = "../dense.safetensors"

    _rewrite(model, move_dense)
    code, err = _export(model, tmp_path / "m.pt", capsys)
    assert (code, err) == (
        2,
        f"angelps: error: checkpoint {model} is damaged: its manifest names "
        "'../dense.safetensors', which is not a file inside the checkpoint; refusing to read "
        "it\n",
    )
    # A table file replaced by a symbolic link to a file outside (same bytes: only the
    # resolver can tell).
    shutil.rmtree(model)
    shutil.copytree(trained / "model", model)
    table = model / "weight" / "shard-0.parquet"
    shutil.move(table, tmp_path / "outside.parquet")
    os.symlink(tmp_path / "outside.parquet", table)
    code, err = _export(model, tmp_path / "m.pt", capsys)
    assert (code, err) == (
        2,
        f"angelps: error: checkpoint file {table} leads outside the checkpoint {model} "
        "(a symbolic link); refusing to read it\n",
    )
    assert not (tmp_path / "m.pt").exists()
