"""What a run folder records of its job: the resolved configuration, and TensorBoard's HParams.

``config.properties`` in the run folder holds every declared key with the value the job ran
with and, on the line above it, where that value came from (``default``, ``<file>:<line>``,
``command line``, ``program``, ``Angel's key``); unset keys, and those left at their default,
are commented out. It loads as a job file (``angelps train --conf <run>/config.properties``
runs the same job again: the same values, and the same keys set).

With ``angel.log.tensorboard=true`` the end of a run adds TensorBoard's HParams: the keys the
job set (and the model, learning rate, decay, epochs) against the final validation metrics, so
that runs compare in TensorBoard's HParams tab.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from angelconf.config import Config, format_value
from angelconf.printable import printable

__all__ = ["CONFIG_FILE", "hparams", "log_hparams", "write_config"]

CONFIG_FILE = "config.properties"

#: Always in the HParams, set or not: what tells runs apart.
_HEADLINE = (
    "ml.model.class.name",
    "ml.learn.rate",
    "ml.opt.decay.class.name",
    "ml.epoch.num",
    "ml.minibatch.size",
    "angel.workergroup.number",
)


def _escape(text: str) -> str:
    """A value as a .properties line keeps it: a backslash and leading blanks escaped, and a
    control character (an escape sequence, a line end) as ``\\uXXXX``, which reads back as
    itself and keeps the file plain text."""
    text = text.replace("\\", "\\\\")
    text = "".join(c if c.isprintable() or ord(c) > 0xFFFF else f"\\u{ord(c):04x}" for c in text)
    return "\\" + text if text[:1].isspace() else text


def write_config(run_dir: Path, conf: Config) -> Path:
    """Write ``<run_dir>/config.properties`` (module docstring); its path."""
    lines = ["# The resolved configuration of this run: every key, its value and its source."]
    for name in sorted(conf):
        value = conf[name]
        lines.append(printable(f"# {conf.source(name)}"))  # (a file name may hold anything)
        if value is None:
            lines.append(f"# {name} = (unset)")
        elif not conf.is_set(name):
            # A default stays a default when the file is loaded again: some keys act by being
            # set at all (ml.num.update.per.epoch sizes the batch Angel's way), and a key set
            # that the job does not read is warned about.
            lines.append(f"# {name} = {_escape(format_value(value))}")
        else:
            lines.append(f"{name} = {_escape(format_value(value))}")
    out = run_dir / CONFIG_FILE
    out.write_text("\n".join(lines) + "\n")
    return out


def hparams(conf: Config, summary: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, float]]:
    """(hyperparameters, final metrics) of a run for TensorBoard's HParams: the keys set and the
    headline ones, as numbers or strings; the summary's finite ``valid_*`` numbers."""
    params: dict[str, Any] = {}
    for name in sorted(conf):
        if (conf.is_set(name) or name in _HEADLINE) and conf[name] is not None:
            v = conf[name]
            params[name] = v if isinstance(v, (bool, int, float, str)) else format_value(v)
    metrics = {
        f"final/{k}": float(v)
        for k, v in summary.items()
        if k.startswith("valid_")
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
        and v == v
    }
    return params, metrics


def log_hparams(tb: Any, conf: Config, summary: Mapping[str, Any]) -> None:
    """Add the run's HParams to the TensorBoard writer ``tb`` (in the run's own folder)."""
    params, metrics = hparams(conf, summary)
    tb.add_hparams(params, metrics, run_name=".")
