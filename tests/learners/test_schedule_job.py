"""``angelps schedule --conf job.properties``: the sequence the job uses, per epoch or per
update, its length from the job, pinned against what training really does."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from angelconf.config import load_config
from learners.cli.main import main
from learners.data.options import DataOptions
from learners.job.schedule_length import schedule_length, train_rows
from learners.keys import all_keys

ROOT = Path(__file__).resolve().parents[2]


def _csv(capsys: pytest.CaptureFixture[str]) -> tuple[str, list[tuple[int, float]], str]:
    cap = capsys.readouterr()
    lines = cap.out.splitlines()
    rows = [(int(a), float(b)) for a, b in (x.split(",") for x in lines[1:])]
    return lines[0], rows, cap.err


def test_a_per_epoch_job_shows_one_value_per_epoch(capsys) -> None:
    assert main(["schedule", "--conf", str(ROOT / "conf/lr_a9a.properties")]) == 0
    header, rows, err = _csv(capsys)
    assert header == "epoch,lr"
    # StandardDecay per epoch, as tests/learners/test_learner.py pins the trained epochs.
    assert rows == [(k, pytest.approx(0.02 / math.sqrt(1 + 0.5 * k))) for k in range(1, 11)]
    assert err == "# per epoch (ml.opt.decay.on.batch=false): ml.epoch.num=10 epochs\n"


def test_the_schedule_is_told_the_jobs_length(capsys) -> None:
    """CosineAnnealingLR's t_max is the job's epochs (10), not the old preview's 100."""
    argv = ["schedule", "--conf", str(ROOT / "conf/lr_a9a.properties")]
    argv += ["--ml.opt.decay.class.name", "CosineAnnealingLR", "--set", "ml.learn.rate=1"]
    with pytest.warns(UserWarning, match="ml.opt.decay.alpha: set but not used"):
        assert main(argv) == 0
    _, rows, _ = _csv(capsys)
    assert len(rows) == 10
    assert rows[5] == (6, pytest.approx((1 + math.cos(math.pi * 5 / 10)) / 2))


def test_updates_per_epoch_are_counted_as_the_reader_splits(tmp_path, capsys) -> None:
    lines = [f"{'+1' if i % 3 else '-1'} {i % 7 + 1}:1" for i in range(25)]
    lines[7] = "   "  # a blank line: not a row, but it counts in the line index
    data = tmp_path / "d.libsvm"
    data.write_text("\n".join(lines) + "\n")
    sets = {
        "angel.train.data.path": str(data),
        "ml.data.validate.ratio": 0.2,
        "angel.workergroup.number": 2,
        "ml.minibatch.size": 3,
        "ml.epoch.num": 2,
        "ml.opt.decay.on.batch": True,
    }
    conf = load_config(None, sets, all_keys())
    # P = 5: lines 0-4, 10-14, 20-24 to worker 0 and 5-9, 15-19 to worker 1; every 5th validates.
    assert train_rows(DataOptions.from_config(conf), 2) == [12, 7]
    length = schedule_length(conf)
    assert (length.unit, length.updates_per_epoch, length.total) == ("update", 3, 6)
    job = tmp_path / "job.properties"
    job.write_text("".join(f"{k}={json.dumps(v).strip(chr(34))}\n" for k, v in sets.items()))
    assert main(["schedule", "--conf", str(job), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["unit"], doc["first"], doc["steps"], len(doc["lr"])) == ("update", 1, 6, 6)
    assert main(["schedule", "--conf", str(job), "--updates-per-epoch", "10"]) == 0
    _, rows, err = _csv(capsys)
    assert len(rows) == 20 and "x 10 updates (--updates-per-epoch) = 20 updates" in err


@pytest.mark.slow
@pytest.mark.parametrize("on_batch", [True, False], ids=["per-update", "per-epoch"])
def test_the_sequence_is_the_one_training_uses(tmp_path, capsys, on_batch) -> None:
    """Two workers, a real run: every update's (or epoch's) lr equals the preview's."""
    lines = (ROOT / "data/census/census_148d_train.dummy").read_text().splitlines()[:1500]
    data = tmp_path / "c.dummy"
    data.write_text("\n".join(lines) + "\n")
    job = tmp_path / "job.properties"
    sets = (
        f"angel.train.data.path={data}\nml.epoch.num=3\nangel.workergroup.number=2\n"
        f"ml.minibatch.size=100\nangel.log.every.steps=1\nangel.log.path={tmp_path / 'log'}\n"
        f"ml.opt.decay.on.batch={str(on_batch).lower()}\nangel.job.name=sched_{on_batch}\n"
        "ml.opt.decay.class.name=CosineAnnealingLR\n"
    )
    ours = {line.split("=")[0] for line in sets.splitlines()}
    base = (ROOT / "conf/fm_census.properties").read_text().splitlines()
    # (a key given twice in one file is an error: the example's own lines for these go)
    kept = [line for line in base if line.split("=")[0].strip() not in ours]
    job.write_text("\n".join(kept) + "\n" + sets)
    with pytest.warns(UserWarning):
        assert main(["schedule", "--conf", str(job)]) == 0
    header, preview, _ = _csv(capsys)
    summary = tmp_path / "s.json"
    with pytest.warns(UserWarning):
        assert main(["train", "--conf", str(job), "--summary-json", str(summary)]) == 0
    records = [
        json.loads(x)
        for x in (Path(json.loads(summary.read_text())["run_dir"]) / "metrics.jsonl")
        .read_text()
        .split("\n")
        if x
    ]
    if on_batch:
        trained = [r["lr"] for r in records if r["kind"] == "step"]
        assert header == "update,lr"
        assert len(preview) == 3 * json.loads(summary.read_text())["updates_per_epoch"]
    else:
        trained = [r["lr"] for r in records if r["kind"] == "epoch"]
        assert header == "epoch,lr"
    assert [k for k, _ in preview] == list(range(1, len(trained) + 1))
    assert [lr for _, lr in preview] == pytest.approx(trained, rel=1e-12)
