"""Which model keys each built-in model reads (``ModelEntry.reads``): the declaration is what
the build does (a key it does not list changes nothing of the model, a key it lists changes
something), and a job that sets a key its model does not read is told so."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from angelconf.config import load_config
from learners.keys import all_keys
from learners.models import config as model_config
from learners.models.config import ModelConfig, unused_model_keys
from learners.models.registry import MODELS, ModelEntry
from learners.models.sparse_input import SparseInput
from learners.models.tables import model_tables
from learners.models.zoo import build_model

ROOT = Path(__file__).resolve().parents[2]
N, FIELDS = 40, 4
#: A value other than the default for every model key (the class name left out).
CHANGED = {
    "ml.num.class": 3,
    "ml.fm.rank": 5,
    "ml.mlr.rank": 3,
    "ml.robustregression.loss.delta": 0.3,
    "ml.model.hidden.layers": "7,3",
    "ml.model.activations": "tanh",
    "ml.model.dropout": 0.2,
    "ml.inputlayer.init.std": 0.5,
    "ml.embedding.init.std": 0.2,
}
BUILTIN = [n for n in MODELS if n != "AngelModel"]


def test_every_model_key_has_a_changed_value_here():
    assert sorted(CHANGED) == sorted(k.name for k in model_config.KEYS[1:])


def _what_it_builds(name: str, sets: dict[str, object]) -> tuple[object, ...]:
    """The model's tables, its module (layers, activations, dropout) and its loss on a fixed
    batch (eval mode), for ``sets`` over the defaults."""
    conf = load_config(None, {"ml.model.class.name": name, **sets}, model_config.KEYS)
    entry = MODELS[name]
    cfg = ModelConfig.from_config(conf, N, FIELDS if entry.needs_fields else None)
    model = build_model(cfg, seed=0).eval()
    ids = torch.arange(FIELDS * 3) % N
    uniq, inv = torch.unique(ids, return_inverse=True)
    gen = torch.Generator().manual_seed(0)
    rows = {
        t.name: torch.randn(uniq.numel() if t.sparse else t.rows, t.cols, generator=gen)
        for t in model.tables()
    }
    indptr = torch.arange(0, ids.numel() + 1, FIELDS).numpy()
    x = SparseInput.from_csr(
        indptr,
        inv.numpy(),
        torch.ones(ids.numel()).numpy(),
        rows,
        FIELDS if entry.needs_fields else None,
    )
    labels = torch.tensor([0, 1, 1]) if entry.task == "multiclass" else torch.tensor([0.0, 1, 3])
    with torch.no_grad():
        loss = float(model.loss(model(x), labels))
    return model_tables(cfg), repr(model), loss


@pytest.mark.parametrize("name", BUILTIN)
def test_a_key_a_model_does_not_list_changes_nothing_of_it(name: str):
    reads = MODELS[name].reads
    assert reads is not None
    base = _what_it_builds(name, {})
    for key, value in CHANGED.items():
        if key not in reads:
            assert _what_it_builds(name, {key: value}) == base, key


@pytest.mark.parametrize("name", BUILTIN)
def test_a_key_a_model_lists_changes_it(name: str):
    base = _what_it_builds(name, {})
    for key in MODELS[name].reads or ():
        assert _what_it_builds(name, {key: CHANGED[key]}) != base, key


def test_a_key_the_model_does_not_read_is_named_with_where_it_was_set(tmp_path: Path):
    job = tmp_path / "job.properties"
    job.write_text(
        "ml.model.class.name = LogisticRegression\nml.fm.rank = 16\nml.num.class = 2\n"
        "ml.model.hidden.layers = 10,10\n"
    )
    conf = load_config(str(job), [], all_keys())
    assert unused_model_keys(conf) == [
        f"ml.fm.rank=16 ({job}:2): set but not used by LogisticRegression (the model keys it "
        "reads: ml.inputlayer.init.std; docs/models.md)",
        f"ml.model.hidden.layers=10,10 ({job}:4): set but not used by LogisticRegression (the "
        "model keys it reads: ml.inputlayer.init.std; docs/models.md)",
    ]
    # ml.num.class=2 is what a binary model is; another count is not.
    conf = load_config(str(job), ["ml.num.class=3"], all_keys())
    assert "ml.num.class=3 (command line)" in unused_model_keys(conf)[0]
    # The model's own keys, and keys left unset, are not reported.
    conf = load_config(
        None,
        {"ml.model.class.name": "DeepFM", "ml.fm.rank": 4, "ml.model.dropout": 0.1},
        all_keys(),
    )
    assert unused_model_keys(conf) == []


def test_a_model_that_declares_nothing_is_not_checked(monkeypatch: pytest.MonkeyPatch):
    toy = ModelEntry("ToyUnchecked", "m:t", "m:C")
    monkeypatch.setitem(MODELS, toy.name, toy)
    conf = load_config(None, {"ml.model.class.name": toy.name, "ml.fm.rank": 4}, all_keys())
    assert unused_model_keys(conf) == []


def test_train_warns_before_it_starts(tmp_path: Path):
    """On the command line: one warning line, before the job's other checks (``--resume``
    without a checkpoint path stops it here with exit 2, Ray never started)."""
    job = tmp_path / "job.properties"
    job.write_text(
        f"angel.train.data.path = {ROOT / 'data/a9a/a9a_123d_train.libsvm'}\n"
        "ml.data.type = libsvm\nml.feature.index.range = 123\nml.fm.rank = 16\n"
        f"angel.log.path = {tmp_path / 'log'}\nml.reg.l1 = 0.01\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "angelps", "train", "--conf", str(job), "--resume"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert run.returncode == 2, run.stderr
    assert run.stderr.splitlines() == [
        f"angelps: warning: ml.fm.rank=16 ({job}:4): set but not used by LogisticRegression "
        "(the model keys it reads: ml.inputlayer.init.std; docs/models.md)",
        f"angelps: warning: ml.reg.l1=0.01 ({job}:6): set but not used by the job's optimizers "
        "(ml.inputlayer.optimizer=Momentum); it is read by SGD, AdaGrad, RMSProp, FTRL",
        "angelps: error: --resume needs angel.save.model.path (the checkpoint directory)",
    ]


@pytest.mark.e2e
def test_a_whole_train_says_it_once(tmp_path: Path) -> None:
    """The command line checks the job before Ray starts and training checks it again: the
    warning is printed once (it was printed twice)."""
    sets = ["ml.epoch.num=1", "ml.reg.l1=0.01", "ml.fm.rank=4"]
    sets += [f"angel.log.path={tmp_path / 'log'}", f"angel.save.model.path={tmp_path / 'model'}"]
    argv = [sys.executable, "-m", "angelps", "train", "--conf", "conf/lr_a9a.properties"]
    run = subprocess.run(
        [*argv, *(a for s in sets for a in ("--set", s))],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    warned = [ln for ln in run.stderr.splitlines() if ln.startswith("angelps: warning:")]
    assert [w.split(" (")[0] for w in warned] == [
        "angelps: warning: ml.fm.rank=4",
        "angelps: warning: ml.reg.l1=0.01",
    ], run.stderr


def test_conf_says_it_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from learners.cli.main import main

    job = tmp_path / "job.properties"
    job.write_text("ml.model.class.name = SoftmaxRegression\nml.num.class = 3\nml.mlr.rank = 4\n")
    assert main(["conf", "--conf", str(job)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        f"angelps: warning: ml.mlr.rank=4 ({job}:3): set but not used by SoftmaxRegression (the "
        "model keys it reads: ml.inputlayer.init.std, ml.num.class; docs/models.md)"
    )
    assert len(err) == 2  # (and the line about hidden defaults)
