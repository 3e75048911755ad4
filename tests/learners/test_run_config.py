"""The run folder's record of its job: config.properties (every key, value and source) and
TensorBoard's HParams with the final metrics (learners/runs/run_config.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from angelconf.config import load_config
from learners.keys import all_keys
from learners.runs.run_config import hparams, log_hparams, write_config


def _conf(tmp_path: Path):
    job = tmp_path / "job.properties"
    job.write_text("ml.learn.rate = 0.25\nml.model.hidden.layers = 8,4\n")
    return load_config(job, ["angel.job.name=hp", "angel.ps.memory.mb=64"], all_keys())


def test_config_properties_holds_every_key_and_reloads(tmp_path: Path) -> None:
    conf = _conf(tmp_path)
    out = write_config(tmp_path, conf)
    text = out.read_text()
    assert f"# {tmp_path / 'job.properties'}:1\nml.learn.rate = 0.25\n" in text
    assert "# command line\nangel.job.name = hp\n" in text
    assert "# default\n# ml.epoch.num = 30\n" in text
    assert "# default\n# angel.save.model.path = (unset)\n" in text
    again = load_config(out, [], all_keys())
    assert {k: again[k] for k in conf} == {k: conf[k] for k in conf}
    assert [k for k in conf if again.is_set(k)] == [k for k in conf if conf.is_set(k)]
    # A default loaded back as set would change the job: ml.num.update.per.epoch, set, sizes
    # the batch Angel's way (10 updates an epoch instead of 115 for a9a's LR).
    assert [k for k in conf if again.is_set(k)] == [k for k in conf if conf.is_set(k)]
    assert not again.is_set("ml.num.update.per.epoch")
    keys = [ln for ln in text.splitlines() if " = " in ln]  # set, default or unset
    assert len(keys) == len(conf)


def test_hparams_are_the_keys_set_against_the_final_metrics(tmp_path: Path) -> None:
    conf = _conf(tmp_path)
    summary = {"valid_auc": 0.9, "valid_logloss": None, "valid_rows": 300, "train_loss": 0.3}
    params, metrics = hparams(conf, summary)
    assert params["ml.learn.rate"] == 0.25 and params["ml.model.hidden.layers"] == "8,4"
    assert params["ml.model.class.name"] == "LogisticRegression"  # headline, though unset
    assert "ml.epoch.num" in params and "angel.ps.backup.interval" not in params
    assert metrics == {"final/valid_auc": 0.9, "final/valid_rows": 300.0}


def test_hparams_reach_tensorboard(tmp_path: Path) -> None:
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    from torch.utils.tensorboard import SummaryWriter

    tb = SummaryWriter(log_dir=str(tmp_path))
    log_hparams(tb, _conf(tmp_path), {"valid_auc": 0.875})
    tb.close()
    acc = ea.EventAccumulator(str(tmp_path))
    acc.Reload()
    assert acc.PluginTagToContent("hparams")  # the HParams plugin's summaries
    assert acc.Scalars("final/valid_auc")[0].value == pytest.approx(0.875)


def test_control_characters_are_escaped_and_read_back(tmp_path: Path) -> None:
    """A value (or the name of the file it came from) holding an escape sequence, a line end
    or NUL: config.properties stays plain text, one line per key, and reloads the same."""
    d = tmp_path / "job\x1b[31m\rdir"
    d.mkdir()
    job = d / "job.properties"
    job.write_text("angel.job.name = red\\u001b[31m\\r\\nname\\u0000\\ttab\n")
    conf = load_config(job, [], all_keys())
    assert conf["angel.job.name"] == "red\x1b[31m\r\nname\x00\ttab"
    out = write_config(tmp_path, conf)
    text = out.read_text()
    assert text.isascii() and all(ln.isprintable() for ln in text.splitlines()), text
    assert "angel.job.name = red\\u001b[31m\\u000d\\u000aname\\u0000\\u0009tab\n" in text
    assert "# " + str(job).replace("\x1b", "\\x1b").replace("\r", "\\r") + ":1\n" in text
    again = load_config(out, [], all_keys())
    assert {k: again[k] for k in conf} == {k: conf[k] for k in conf}
    assert [k for k in conf if again.is_set(k)] == [k for k in conf if conf.is_set(k)]
