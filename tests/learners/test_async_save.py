"""Checkpoints written in the background (angel.save.model.async, the default): every
epoch's checkpoint holds exactly what an inline save of that epoch holds (the shards' tables,
the tables the workers hold, the dense layers, the learner's state), the kept copies are made,
the summary names the last one, and nothing half-written is left beside them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from angelps.checkpoint import files as checkpoint
from tests.learners.data_helpers import a9a_head

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf" / "lr_a9a.properties"
EPOCHS = 3

pytestmark = pytest.mark.usefixtures("ray_local")


def _train(d: Path, background: bool, **more: Any) -> dict[str, Any]:
    from learners.job.learner import GraphLearner

    data = a9a_head(d.parent / "a9a.libsvm", 2000)
    sets = {
        "angel.train.data.path": str(data),
        "angel.log.path": str(d / "log"),
        "angel.save.model.path": str(d / "model"),
        "angel.save.model.keep.last": EPOCHS,
        "angel.job.name": "bg",
        "ml.epoch.num": EPOCHS,
        "ml.data.validate.ratio": 0.2,
        "angel.save.model.async": str(background).lower(),
        **more,
    }
    learner = GraphLearner.from_properties(CONF, sets, quiet=True)
    try:
        return learner.train().summary
    finally:
        learner.shutdown()


def _content(path: Path) -> dict[str, Any]:
    """What a checkpoint holds: every table's rows and state (whoever wrote them), the
    dense file's checksum and the learner's section without its timings."""
    manifest = checkpoint.read_manifest(str(path))
    checkpoint.verify(str(path))
    rows: dict[str, list[np.ndarray]] = {}
    for spec in manifest["tables"]:
        name = spec["name"]
        n = manifest.get("table_shards", {}).get(name, manifest["num_shards"])
        parts = []
        for j in range(n):
            f = checkpoint.table_file(manifest["root"], name, j)
            for keys, w, state in checkpoint.iter_table_file(f):
                parts.append(keys)
                parts.append(w.ravel())
                parts += [state[k].ravel() for k in sorted(state)]
        rows[name] = parts
    learner = dict(manifest["extra"]["learner"])
    history = [
        {k: v for k, v in r.items() if not k.endswith("_s") and "per_s" not in k}
        for r in learner.pop("history")
    ]
    return {
        "rows": rows,
        "dense": learner.pop("dense"),
        "history": history,
        "epoch": learner["epoch"],
    }


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["dense"] == b["dense"] and a["epoch"] == b["epoch"]
    assert a["history"] == b["history"]
    assert a["rows"].keys() == b["rows"].keys()
    for name in a["rows"]:
        for x, y in zip(a["rows"][name], b["rows"][name], strict=True):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("placement", ["ps", "worker"])
def test_each_epoch_s_checkpoint_holds_what_an_inline_save_holds(
    tmp_path: Path, placement: str
) -> None:
    held = {"angel.sparse.placement": placement}
    bg = _train(tmp_path / "bg", True, **held)
    inline = _train(tmp_path / "inline", False, **held)
    for s, d in ((bg, tmp_path / "bg"), (inline, tmp_path / "inline")):
        assert s["checkpoint"] == str(d / "model") and s["checkpoint_epoch"] == EPOCHS
    for n in range(1, EPOCHS + 1):
        _same(
            _content(tmp_path / "bg" / f"model.epoch-{n}"),
            _content(tmp_path / "inline" / f"model.epoch-{n}"),
        )
    _same(_content(tmp_path / "bg" / "model"), _content(tmp_path / "inline" / "model"))
    assert _content(tmp_path / "bg" / "model")["epoch"] == EPOCHS - 1
    best = Path(bg["best_checkpoint"])
    assert best == tmp_path / "bg" / "model.best" and bg["best_checkpoint"] == str(best)
    _same(_content(best), _content(Path(inline["best_checkpoint"])))
    # nothing half-written left beside the checkpoints
    names = sorted(p.name for p in (tmp_path / "bg").iterdir() if p.name.startswith("model"))
    assert names == [
        "model",
        "model.best",
        "model.epoch-1",
        "model.epoch-2",
        "model.epoch-3",
        "model.prev",
    ]
